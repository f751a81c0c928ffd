"""What every lvrl training stage shares: the wrapped HF VLM, its optimizer, evaluation, export.

Subclasses (CoT-SFT, GRPO) add a ``training_step``. Evaluation is the same for all stages and
lives in :mod:`evaluation` (:class:`~evaluation.evaluator.Evaluator`: greedy answers on the
validation split scored by problem type, metrics per category, per-question predictions
written to ``{default_root_dir}/predictions/``); the module's validation hooks hand it the
model's answers (:meth:`VLMModule.generate_answers`) and what the trainer says.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, TypeVar

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_info
from torch.distributed.device_mesh import DeviceMesh

from core.failures import NonFiniteUpdates
from core.positions import mrope_position_ids
from core.settings import settings_block
from core.tool_use.requests import FrameBudget
from core.video import VideoEncoder
from evaluation.decoding import ModelAnswers
from evaluation.evaluator import (
    Evaluator,
    ValidationResult,
    logged_scores,
    primary_loader,
    val_frame_counts,
    validation_printout,
    write_predictions,
)
from families import ModelFamily, family_of
from models.export import save_hf_model
from models.loading import load_model, load_processor, model_skeleton
from models.lora import LoraSettings, apply_lora
from models.vision import decoder_blocks, encode_videos, encode_videos_in_passes, vision_tower
from parallel.contract import AttentionHeads, ShardingStrategy
from parallel.encoding import encode_videos_sequence_parallel
from parallel.shard import SequenceShard
from parallel.sharding import ShardingLayout, ShardingSettings, gathered, run_sharded, shard_model
from rewards.judge import JudgeSettings

log = logging.getLogger(__name__)

T = TypeVar("T")


def layout_videos(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The videos of the teacher-forcing rows, in row order: ``(pixel_values_videos,
    video_grid_thw, second_per_grid_ts)``; with tool traces the replies' segments are among them
    (the collator's ``target_*`` keys), else they are the prompts' videos."""
    if "target_pixel_values_videos" in batch:
        return (
            batch["target_pixel_values_videos"],
            batch["target_video_grid_thw"],
            batch["target_second_per_grid_ts"],
        )
    return batch["pixel_values_videos"], batch["video_grid_thw"], batch["second_per_grid_ts"]


def rank0_weights(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """What a sharded model is filled with (:func:`parallel.sharding.shard_model`): rank 0's
    weights (its state dict, no copy), ``{}`` on the other ranks (skeletons, see
    :meth:`VLMModule.load_weights_or_skeleton`); None in one process."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return model.state_dict() if dist.get_rank() == 0 else {}


def fused_adamw(device_types: set[str]) -> bool | None:
    """AdamW's fused kernel for parameters all on CUDA, else torch's default.

    On CUDA the default multi-tensor (foreach) step builds one temporary as large as all of the
    second moments (their square roots) before it divides: measured on an H200 at
    Qwen2.5-VL-3B's widths (FSDP2 over one GPU, fp32 master weights) it was the run's peak,
    64.6 GiB against 53.2 GiB held by weights, states and gradients. The fused kernel updates
    in place. CPU runs keep the default (a temporary per tensor), so their numbers are unchanged.

    >>> fused_adamw({"cuda"}), fused_adamw({"cpu"}), fused_adamw({"cuda", "cpu"}), fused_adamw(set())
    (True, None, None, None)
    """
    return True if device_types == {"cuda"} else None


class VLMModule(L.LightningModule):
    """Base LightningModule around a Hugging Face vision-language model directory.

    Args:
        model_path: a model directory (``save_pretrained`` layout: config, weights, processor).
        learning_rate: peak AdamW learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        warmup_steps: linear warm-up steps from 0 to ``learning_rate``.
        lr_schedule: ``constant`` after warm-up, or ``cosine`` decay to a tenth of it over
            ``trainer.max_steps``.
        freeze_vision: keep the vision tower's weights fixed.
        gradient_checkpointing: recompute activations in backward (less memory; each block's
            forward runs again in backward).
        max_new_tokens: generation budget of a validation answer.
        val_samples: besides the greedy answer, sample this many answers per validation question
            at ``val_temperature`` and report ``val/sampled_accuracy`` (the mean fraction right:
            the quantity RL raises, which greedy accuracy shows only once the mode flips); 0: off.
        val_temperature: sampling temperature of those answers.
        val_answers: validation answers the questions and scores them (accuracy, the report,
            the predictions). False: it computes ``val/loss`` only (no generation): what a run
            that stops when its validation loss plateaus (Lightning's ``EarlyStopping`` on
            ``val/loss``) needs between evaluations, at the cost of a forward pass.
        max_consecutive_nonfinite: a step whose loss or gradient norm is NaN or infinite is
            skipped (no update; counted in ``train/nonfinite_skipped``); after this many in a
            row training stops with a checkpoint of the last good state.
        dtype: parameter dtype: float32 or bfloat16.
        attn_implementation: HF attention backend (``sdpa``, ``eager``, ``flash_attention_2``);
            None = the HF default.
        val_judge: an LLM judge for the open-ended validation questions, as the
            ``judged_accuracy`` reward takes it (:class:`rewards.judge.JudgeSettings`:
            ``{base_url: http://localhost:8000/v1, model: NAME, ...}``); their accuracy is
            ``val/open_ended_accuracy``. None: open-ended questions are counted in
            ``val/not_scored``. Multiple-choice questions are scored by letter and numerical
            ones as numbers either way.
        lora: train LoRA adapters instead of the whole model (:class:`models.lora.LoraSettings`:
            ``{r: 16, alpha: 32, dropout: 0.0, target_modules: [q_proj, ..., down_proj],
            vision: false}``; the language model's projections by default, the base frozen).
            None: full fine-tuning.
        val_tool_use: validate with tool-use episodes (the model may ask for frames,
            :mod:`rollout.episodes`, the code rollouts run): ``{max_calls, frames_per_call,
            frames_per_episode, default_fps}`` as the RL callback's ``tool_use``; the data needs
            ``tool_use: true``. Logs ``val/requests_per_answer`` and ``val/frames_per_answer``
            (the overview's frames plus those served) and, where the data names the stretch that
            holds each answer, ``val/span_coverage`` and ``val/span_hit_rate``
            (:mod:`core.tool_use.spans`). None: single-turn answers.
        vision_patches_per_pass: the vision tower encodes at most this many patches at a time
            (whole temporal patches), bounding its working set (for a 7B run at 4,096 frames the
            planner's arithmetic gives 6.5 GiB a GPU for 131,072 patches at once: ``lvrl plan``);
            the same embeddings. None: all of a step's at once.
    """

    trains_on_targets: bool = True
    """Whether training batches carry the teacher-forcing layout (prompt + target, labels, a tool
    trace's frames). A module that learns from something else (GRPO: its rollouts) says False, and
    the data module collates its training batches without them."""

    def __init__(
        self,
        model_path: str,
        learning_rate: float = 1e-4,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.95),
        warmup_steps: int = 0,
        lr_schedule: str = "constant",
        freeze_vision: bool = False,
        gradient_checkpointing: bool = False,
        max_new_tokens: int = 256,
        val_samples: int = 0,
        val_temperature: float = 1.0,
        val_answers: bool = True,
        max_consecutive_nonfinite: int = 5,
        dtype: str = "float32",
        attn_implementation: str | None = None,
        val_judge: dict[str, Any] | None = None,
        lora: dict[str, Any] | None = None,
        val_tool_use: dict[str, Any] | None = None,
        vision_patches_per_pass: int | None = None,
    ) -> None:
        super().__init__()
        if vision_patches_per_pass is not None and vision_patches_per_pass < 1:
            raise ValueError(f"vision_patches_per_pass={vision_patches_per_pass} must be positive (or null)")
        self.answers = ModelAnswers(
            self, settings_block(FrameBudget, val_tool_use, "val_tool_use"), encode_videos
        )
        """Validation's answers; with ``val_tool_use``, tool-use episodes whose greedy ones leave
        a record each (requests, frames served, spans, every turn the model wrote)."""
        self.lora_settings = LoraSettings.of(lora)
        """The LoRA adapters trained instead of the whole model (None: full fine-tuning)."""
        if self.lora_settings is not None and self.lora_settings.vision and freeze_vision:
            raise ValueError("lora.vision adapts the vision tower: set freeze_vision: false")
        if lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be 'constant' or 'cosine', got {lr_schedule!r}")
        if val_samples < 0 or val_temperature <= 0:
            raise ValueError(
                f"val_samples={val_samples} must be >= 0 and val_temperature={val_temperature} > 0"
            )
        if max_consecutive_nonfinite < 1:
            raise ValueError(f"max_consecutive_nonfinite={max_consecutive_nonfinite} must be at least 1")
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        self.save_hyperparameters()
        self.model: torch.nn.Module | None = None
        self.evaluator = Evaluator(
            self.answers,
            max_new_tokens=max_new_tokens,
            samples=val_samples,
            temperature=val_temperature,
            # Checked now, so a bad judge URL fails before any model is loaded.
            judge=JudgeSettings(**val_judge) if val_judge else None,
            record_extras=self.val_record_extras,
        )
        # Registered here, so the metrics move with the module and the strategy reaches them.
        self.val_scores = self.evaluator.metrics
        self._processor: Any = None
        self.sequence_shard: SequenceShard | None = None
        """Set by :class:`parallel.strategy.SequenceParallelStrategy` when sequences are split."""
        self.supports_sequence_parallel = False
        """Whether the training step scores with ``sequence_shard`` (subclasses that do say so)."""
        self.nonfinite_skipped = 0
        """Updates skipped so far for a non-finite loss or gradient norm."""
        self._consecutive_nonfinite = 0
        self.data_parallel_group: dist.ProcessGroup | None = None
        """Set when the strategy shards the model: the ranks whose losses add up to the batch's."""
        # The FSDP root the model's work runs in (None: not sharded); kept out of the module tree
        # (it holds the model, whose parameters are already the module's).
        object.__setattr__(self, "_scope", None)
        self._gathered_depth = 0
        self._validation_gathering = ExitStack()

    # -- model -------------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = self.load_weights_or_skeleton(self.hparams.attn_implementation)
        family_of(self.model.config)  # an unsupported model is refused now, by name
        if self.lora_settings is not None:
            apply_lora(self.model, self.lora_settings)  # the base (vision tower included) frozen
        # from_pretrained returns the model in eval mode; Lightning keeps submodule modes as it finds
        # them, and HF disables gradient checkpointing outside train mode.
        self.model.train()
        if self.hparams.freeze_vision:
            vision_tower(self.model).requires_grad_(False)
        if self.hparams.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def load_weights_or_skeleton(self, attn_implementation: str | None = None) -> torch.nn.Module:
        """The model of ``model_path``: loaded, or (a rank other than 0 of a sharding strategy)
        an empty skeleton that :meth:`shard` fills from rank 0, so that only one process per
        job ever reads and holds the whole model."""
        load = model_skeleton if not self.loads_weights_here else load_model
        return load(
            self.hparams.model_path,
            dtype=getattr(torch, self.hparams.dtype),
            attn_implementation=attn_implementation,
        )

    @property
    def loads_weights_here(self) -> bool:
        """Whether this process reads the weights: always, unless a sharding strategy runs
        several processes and this is not rank 0."""
        trainer = self._trainer
        if trainer is None or not isinstance(trainer.strategy, ShardingStrategy):
            return True
        return trainer.world_size == 1 or trainer.global_rank == 0

    # -- sharding (parallel.contract.ShardableModule) -----------------------------------------
    def sharding_layout(self, model: torch.nn.Module) -> ShardingLayout:
        """One FSDP unit per decoder block; a frozen vision tower whole on every rank (a trainable
        one is sharded with the root: gathered for each forward of the whole model)."""
        tower = vision_tower(model)
        frozen = not any(p.requires_grad for p in tower.parameters())
        return ShardingLayout(model, decoder_blocks(model), kept_whole=(tower,) if frozen else ())

    def shard(
        self, mesh: DeviceMesh, settings: ShardingSettings, data_parallel_group: dist.ProcessGroup | None
    ) -> None:
        assert self.model is not None
        tower = vision_tower(self.model)
        if not any(p.requires_grad for p in tower.parameters()):
            # Frozen and whole on every rank: it needs no master copy, so it is kept in the
            # dtype the blocks compute in.
            tower.to(getattr(torch, settings.param_dtype))
        layout = self.sharding_layout(self.model)
        scope = shard_model(layout, mesh, settings, weights_from_rank0=rank0_weights(self.model))
        object.__setattr__(self, "_scope", scope)
        self.data_parallel_group = data_parallel_group

    @property
    def sharded(self) -> bool:
        return self._scope is not None

    def run_model(self, work: Callable[[], T]) -> T:
        """Run ``work`` (which calls ``self.model``) inside the sharded model's root unit, if sharded.

        Every forward of the policy goes through here, on every rank the same number of times."""
        return run_sharded(self._scope, work)

    @contextmanager
    def gathered_model(self) -> Iterator[torch.nn.Module]:
        """The whole model for work whose amount differs across ranks (generation); see
        :func:`parallel.sharding.gathered`."""
        assert self.model is not None
        if self._scope is None or self._gathered_depth:
            yield self.model
            return
        self._gathered_depth += 1
        try:
            with gathered(self._scope) as model:
                yield model
        finally:
            self._gathered_depth -= 1

    @property
    def compute_dtype(self) -> str:
        """The dtype the policy scores in: the model's, or the sharded blocks' compute dtype."""
        trainer = self._trainer
        if trainer is not None and isinstance(trainer.strategy, ShardingStrategy):
            return trainer.strategy.sharding_settings.param_dtype
        return str(self.hparams.dtype)

    def sum_over_data(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over the data-parallel ranks (itself when the model is not sharded)."""
        if self.data_parallel_group is None or dist.get_world_size(self.data_parallel_group) == 1:
            return value
        total = value.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.data_parallel_group)
        return total

    @property
    def processor(self) -> Any:
        if self._processor is None:
            self._processor = load_processor(self.hparams.model_path)
        return self._processor

    @property
    def model_path(self) -> str:
        """The HF directory the model was loaded from (a rollout engine with its own copy loads it)."""
        return str(self.hparams.model_path)

    def encode_videos(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """The vision tower's output per video; shared out over the sequence-parallel group when
        the strategy set one (MR-SP stage 1: the group encodes the frames together, then every
        rank holds every embedding)."""
        assert self.model is not None
        per_pass = self.hparams.get("vision_patches_per_pass")
        encode: VideoEncoder = (
            functools.partial(encode_videos_in_passes, self.model, max_patches=per_pass)
            if per_pass is not None
            else functools.partial(encode_videos, self.model)
        )
        if self.sequence_shard is None:
            return encode(pixels, grid_thw)
        family = self.family
        return encode_videos_sequence_parallel(
            encode,
            pixels,
            grid_thw,
            self.sequence_shard.group,
            spatial_merge_size=family.spatial_merge_size,
            hidden_size=family.visual_width,
            device=self.device,
            dtype=next(vision_tower(self.model).parameters()).dtype,
        )

    @property
    def family(self) -> ModelFamily:
        """The model's family (:mod:`families`), from its config."""
        assert self.model is not None
        return family_of(self.model.config)

    def position_ids(self, batch: dict[str, Any]) -> torch.Tensor:
        """M-RoPE positions of the teacher-forcing rows, by the rule of rollouts (:mod:`core.positions`)."""
        rule = self.family.position_rule
        return mrope_position_ids(
            batch["video_mask"],
            batch["attention_mask"],
            layout_videos(batch)[1],
            layout_videos(batch)[2],
            spatial_merge_size=rule.spatial_merge_size,
            tokens_per_second=rule.tokens_per_second,
            temporal=rule.temporal,
        )

    def forward_logits(self, batch: dict[str, Any], logits_to_keep: int = 0) -> torch.Tensor:
        """Logits of the teacher-forcing layout (prompt + target): every position, or the last
        ``logits_to_keep``."""
        assert self.model is not None
        model = self.model
        positions = self.position_ids(batch)
        pixels, grids, _ = layout_videos(batch)
        pixels = pixels.to(self.device)  # kept on the host until now (the datamodule's transfer)
        out = self.run_model(
            lambda: model(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                position_ids=positions,
                pixel_values_videos=pixels,
                video_grid_thw=grids,
                use_cache=False,
                logits_to_keep=logits_to_keep,
            )
        )
        return out.logits

    # -- optimisation ------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        trainer = self._trainer  # None when used outside a Trainer (tests, notebooks)
        total = trainer.max_steps if trainer is not None and trainer.max_steps > 0 else None
        cosine = self.hparams.lr_schedule == "cosine"
        if cosine and total is None:
            raise ValueError("lr_schedule='cosine' needs trainer.max_steps")
        params = [p for p in self.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params,
            lr=self.hparams.learning_rate,
            betas=tuple(self.hparams.betas),
            weight_decay=self.hparams.weight_decay,
            fused=fused_adamw({p.device.type for p in params}),
        )
        warmup = max(0, self.hparams.warmup_steps)

        def scale(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if not cosine:
                return 1.0
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, scale)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -- non-finite updates ------------------------------------------------------------------
    def skip_nonfinite_update(self, what: str) -> None:
        """Count an update skipped for a non-finite ``what``; stop after too many in a row."""
        self.nonfinite_skipped += 1
        self._consecutive_nonfinite += 1
        limit = self.hparams.max_consecutive_nonfinite
        log.warning(
            "step %d: non-finite %s, update skipped (%d in a row, %d in all; the run stops at %d in a row)",
            self.global_step,
            what,
            self._consecutive_nonfinite,
            self.nonfinite_skipped,
            limit,
        )
        if self._consecutive_nonfinite >= limit:
            raise NonFiniteUpdates(
                f"{limit} consecutive updates had a non-finite {what} (each was skipped); stopping at step "
                f"{self.global_step} with a checkpoint of the last good weights. Lower the learning rate, "
                "check the data and rewards, or raise model.max_consecutive_nonfinite"
            )

    def note_finite_update(self) -> None:
        self._consecutive_nonfinite = 0

    # -- sequence parallelism (parallel.contract.SequenceParallelModule) ---------------------
    def attention_heads(self) -> AttentionHeads | None:
        """Query and key/value heads of the language model; None before the model is built."""
        if self.model is None:
            return None
        text = getattr(self.model.config, "text_config", self.model.config)
        return AttentionHeads(int(text.num_attention_heads), int(text.num_key_value_heads))

    # -- evaluation (evaluation.evaluator.Evaluator does the work) ----------------------------
    def val_record_extras(self) -> list[dict[str, Any]]:
        """What the last greedy validation answers add to their records (tool use: requests,
        frames served, every turn the model wrote); nothing for single-turn answers."""
        return self.answers.tool_records

    @property
    def val_results(self) -> list[ValidationResult]:
        """The last validation, per dataloader: scores and every question's record."""
        return self.evaluator.results

    @property
    def last_val_scores(self) -> dict[str, float]:
        """Scores of the last validation (its primary dataloader's, in a frame-count sweep)."""
        return self.evaluator.last_scores

    def on_validation_epoch_start(self) -> None:
        if not self.hparams.val_answers:
            return
        # Ranks may hold different numbers of validation batches and decode different lengths:
        # a sharded model is gathered once for the whole validation (no collective inside).
        self._validation_gathering.enter_context(self.gathered_model())
        self.evaluator.start()

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        self.answers.tool_records = []
        if self.hparams.val_answers:
            self.evaluator.step(batch, batch_idx, dataloader_idx, self.device)
        if self.answers.tool_records:
            size = len(self.answers.tool_records)
            overview = [int(m.get("num_frames", 0)) for m in batch["meta"]]
            requests = sum(r["frame_requests"] for r in self.answers.tool_records) / size
            served = [r["frames_served"] for r in self.answers.tool_records]
            frames = sum(o + f for o, f in zip(overview, served, strict=True)) / size
            self.log(
                "val/requests_per_answer", requests, batch_size=size, sync_dist=True, add_dataloader_idx=False
            )
            self.log(
                "val/frames_per_answer", frames, batch_size=size, sync_dist=True, add_dataloader_idx=False
            )
            located = [r for r in self.answers.tool_records if "span_coverage" in r]
            if located:  # the data says which stretch holds each answer
                for name, values in (
                    ("val/span_coverage", [r["span_coverage"] for r in located]),
                    ("val/span_hit_rate", [float(r["span_hit"]) for r in located]),
                ):
                    self.log(
                        name,
                        sum(values) / len(values),
                        batch_size=len(values),
                        sync_dist=True,
                        add_dataloader_idx=False,
                    )
        if "labels" in batch and dataloader_idx == primary_loader(self.trainer.datamodule):
            loss = self.token_mean_loss(batch)
            size = len(batch["meta"])
            self.log("val/loss", loss, batch_size=size, sync_dist=True, add_dataloader_idx=False)

    def token_mean_loss(self, batch: dict[str, Any], reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy of the labelled (assistant) tokens, averaged over those tokens (or summed).

        Logits are computed only from the position before the batch's first label on: over a
        long video prompt the full-vocabulary logits of every prompt position would be the
        largest tensor of the step (e.g. ~80 GB for a 7B model at 512 frames).
        """
        labels = batch["labels"]
        labelled = (labels[:, 1:] != -100).any(dim=0).nonzero()
        first = int(labelled[0]) if len(labelled) else labels.shape[1] - 2  # first predicted position
        logits = self.forward_logits(batch, logits_to_keep=labels.shape[1] - first)[:, :-1].float()
        targets = labels[:, first + 1 :]
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction
        )

    def token_loss_share(self, batch: dict[str, Any]) -> torch.Tensor:
        """The training loss: :meth:`token_mean_loss`, or with a sharded model this rank's share of
        the mean over the labelled tokens of every data-parallel rank (gradients are summed over
        the ranks, so they are the whole batch's mean's)."""
        if self.data_parallel_group is None:
            return self.token_mean_loss(batch)
        tokens = self.sum_over_data((batch["labels"][:, 1:] != -100).sum().float())
        return self.token_mean_loss(batch, reduction="sum") / tokens.clamp(min=1)

    def on_validation_epoch_end(self) -> None:
        if not self.hparams.val_answers:
            return
        datamodule = self.trainer.datamodule
        results = self.evaluator.finish(
            max(1, len(self.trainer.num_val_batches)),
            val_frame_counts(datamodule),
            primary_loader(datamodule),
            self.device,
        )
        if not self.trainer.sanity_checking:
            rank = self.global_rank if self.trainer.world_size > 1 else None
            folder = Path(self.trainer.default_root_dir) / "predictions"
            write_predictions(results, folder, self.global_step, rank)
        for name, value in logged_scores(results).items():
            self.log(name, value, sync_dist=False, add_dataloader_idx=False)
        if self.trainer.state.fn == "validate" and not self.trainer.sanity_checking:
            for block in validation_printout(results, str(self.hparams.model_path)):
                rank_zero_info(block)
        self._validation_gathering.close()

    # -- export ------------------------------------------------------------------------------
    def export_hf(self, out_dir: str | Path) -> Path:
        """Write the current weights as a ``save_pretrained`` directory with the processor files
        (with LoRA: merged, the adapter alone in ``out_dir/adapter``)."""
        assert self.model is not None
        return save_hf_model(self.model, self.processor, out_dir)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Enough to rebuild the HF model from a checkpoint alone (see `lvrl model export`).
        checkpoint["lvrl"] = {"model_path": str(self.hparams.model_path), "module": type(self).__name__}
