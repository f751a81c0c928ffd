"""What every lvrl training stage shares: the wrapped HF VLM, its optimizer, evaluation, export.

Subclasses (CoT-SFT, GRPO) add a ``training_step``. Evaluation is the same for all stages:
greedy generation on the validation split, each answer scored by its problem type
(:mod:`models.answer_scoring`: a multiple-choice letter parsed tolerantly, a number, or an
open-ended answer asked of the judge when ``val_judge`` is set), multiple-choice accuracy per
category logged through :class:`~models.metrics.MultipleChoiceScores` with the other types
beside it, and every question's result (with its ``problem_id`` and the scoring used)
written to ``{default_root_dir}/predictions/val-step{N}.jsonl`` (so two evaluations can be
compared question by question: ``lvrl report compare``). A frame-count sweep (the
datamodule's ``val_num_frames``) gives one validation dataloader per count: each is scored
on its own and logged as ``val/frames_{N}/...``; the one at the training frame count also
under the plain ``val/...`` names.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info

from core.failures import NonFiniteUpdates
from core.layout import PositionRule
from core.positions import mrope_position_ids
from models.answer_scoring import score_answers
from models.loading import load_model, load_processor
from models.metrics import CHOICE, MultipleChoiceScores, format_accuracy_table
from models.vision import encode_videos, vision_tower
from parallel.encoding import encode_videos_sequence_parallel
from parallel.shard import SequenceShard
from rewards.judge import JudgeClient, JudgeSettings
from rewards.parsing import follows_format, reasoning_agrees, response_choice
from rollout.base import PolicyHandle, RolloutRequest, SamplingConfig
from rollout.hf_engine import TransformersEngine

log = logging.getLogger(__name__)


@dataclass
class ValidationResult:
    """One validation dataloader's outcome (a frame-count sweep has one per frame count)."""

    frames: int | None
    """Frames sampled per video by this dataloader (None when the datamodule does not say)."""
    scores: dict[str, float]
    """:class:`~models.metrics.MultipleChoiceScores` output (synced over data-parallel ranks)."""
    predictions: list[dict[str, Any]]
    """Every question this rank saw: key, problem_id, problem_type, scoring, category, answer,
    predicted, correct (None: not scored), format, completion."""
    primary: bool
    """Whether this dataloader reports under the plain ``val/...`` metric names."""


class VLMModule(L.LightningModule):
    """Base LightningModule around a Hugging Face vision-language model directory.

    Args:
        model_path: a model directory (``save_pretrained`` layout: config, weights, processor).
        learning_rate: peak AdamW learning rate.
        weight_decay: AdamW weight decay.
        betas: AdamW betas.
        warmup_steps: linear warm-up steps from 0 to ``learning_rate``.
        lr_schedule: ``constant`` after warm-up, or ``cosine`` decay to 10% over ``trainer.max_steps``.
        freeze_vision: keep the vision tower's weights fixed.
        gradient_checkpointing: recompute activations in backward (less memory, ~30% slower).
        max_new_tokens: generation budget of a validation answer.
        val_samples: besides the greedy answer, sample this many answers per validation question
            at ``val_temperature`` and report ``val/sampled_accuracy`` (the mean fraction right:
            the quantity RL raises, which greedy accuracy shows only once the mode flips); 0: off.
        val_temperature: sampling temperature of those answers.
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
    """

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
        max_consecutive_nonfinite: int = 5,
        dtype: str = "float32",
        attn_implementation: str | None = None,
        val_judge: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
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
        # Checked now, so a bad judge URL fails before any model is loaded.
        self._judge_settings = JudgeSettings(**val_judge) if val_judge else None
        self.save_hyperparameters()
        self.model: torch.nn.Module | None = None
        self.val_scores = torch.nn.ModuleList([MultipleChoiceScores()])
        self._processor: Any = None
        self.last_val_scores: dict[str, float] = {}
        """Scores of the last validation (its primary dataloader's, in a frame-count sweep)."""
        self.val_results: list[ValidationResult] = []
        """The last validation, per dataloader: scores and every question's record."""
        self._val_records: dict[int, list[dict[str, Any]]] = {}
        self.sequence_shard: SequenceShard | None = None
        """Set by :class:`parallel.strategy.SequenceParallelStrategy` when sequences are split."""
        self.supports_sequence_parallel = False
        """Whether the training step scores with ``sequence_shard`` (subclasses that do say so)."""
        self.nonfinite_skipped = 0
        """Updates skipped so far for a non-finite loss or gradient norm."""
        self._consecutive_nonfinite = 0

    # -- model -------------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.model is not None:
            return
        self.model = load_model(
            self.hparams.model_path,
            dtype=getattr(torch, self.hparams.dtype),
            attn_implementation=self.hparams.attn_implementation,
        )
        # from_pretrained returns the model in eval mode; Lightning keeps submodule modes as it finds
        # them, and HF disables gradient checkpointing outside train mode.
        self.model.train()
        if self.hparams.freeze_vision:
            vision_tower(self.model).requires_grad_(False)
        if self.hparams.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    @property
    def processor(self) -> Any:
        if self._processor is None:
            self._processor = load_processor(self.hparams.model_path)
        return self._processor

    def policy(self) -> PolicyHandle:
        """The policy as a rollout engine sees it: where it was loaded from, the live model, its tokenizer."""
        assert self.model is not None
        return PolicyHandle(str(self.hparams.model_path), self.model, self.processor.tokenizer)

    def encode_videos(self, pixels: torch.Tensor, grid_thw: torch.Tensor) -> list[torch.Tensor]:
        """The vision tower's output per video; shared out over the sequence-parallel group when
        the strategy set one (MR-SP stage 1: the group encodes the frames together, then every
        rank holds every embedding)."""
        assert self.model is not None
        if self.sequence_shard is None:
            return encode_videos(self.model, pixels, grid_thw)
        vision_config = self.model.config.vision_config
        return encode_videos_sequence_parallel(
            functools.partial(encode_videos, self.model),
            pixels,
            grid_thw,
            self.sequence_shard.group,
            spatial_merge_size=int(vision_config.spatial_merge_size),
            hidden_size=int(vision_config.out_hidden_size),
            device=self.device,
        )

    def position_ids(self, batch: dict[str, Any]) -> torch.Tensor:
        """M-RoPE positions of the teacher-forcing rows, by the rule of rollouts (:mod:`core.positions`)."""
        assert self.model is not None
        rule = PositionRule.of(self.model.config)
        return mrope_position_ids(
            batch["video_mask"],
            batch["attention_mask"],
            batch["video_grid_thw"],
            batch["second_per_grid_ts"],
            spatial_merge_size=rule.spatial_merge_size,
            tokens_per_second=rule.tokens_per_second,
        )

    def forward_logits(self, batch: dict[str, Any]) -> torch.Tensor:
        """Logits of the teacher-forcing layout (prompt + target)."""
        assert self.model is not None
        out = self.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=self.position_ids(batch),
            pixel_values_videos=batch["pixel_values_videos"],
            video_grid_thw=batch["video_grid_thw"],
            use_cache=False,
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

    # -- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def generate_answers(
        self, batch: dict[str, Any], max_new_tokens: int | None = None, sampling: SamplingConfig | None = None
    ) -> list[list[str]]:
        """Completions of the prompts of a batch: one greedy each, or ``sampling.n`` sampled ones.

        Decoded by :class:`~rollout.hf_engine.TransformersEngine` from the video encoded once,
        with the position rule of training and rollout, so evaluation sees the model exactly as
        the RL stage will (HF ``generate`` would use transformers' own, different rule).
        """
        assert self.model is not None
        engine = TransformersEngine.for_model(self.model, self.processor.tokenizer)
        videos = encode_videos(self.model, batch["pixel_values_videos"], batch["video_grid_thw"])
        requests = [
            RolloutRequest(layout, layout.encoded_video(embeds))
            for layout, embeds in zip(batch["prompts"], videos, strict=True)
        ]
        if sampling is None:
            sampling = SamplingConfig(
                n=1, temperature=0.0, max_new_tokens=max_new_tokens or self.hparams.max_new_tokens
            )
        return [[c.text for c in result.completions] for result in engine.generate(requests, sampling)]

    def _judge_client(self) -> JudgeClient | None:
        return JudgeClient(self._judge_settings) if self._judge_settings is not None else None

    def on_validation_epoch_start(self) -> None:
        self._val_records: dict[int, list[dict[str, Any]]] = {}

    def _scores_of(self, loader: int) -> MultipleChoiceScores:
        # One metric per validation dataloader (a frame-count sweep has several); later ones
        # share the first one's process group (the strategy sets it for data-parallel sync).
        while len(self.val_scores) <= loader:
            metric = MultipleChoiceScores().to(self.device)
            metric.process_group = self.val_scores[0].process_group
            self.val_scores.append(metric)
        return self.val_scores[loader]

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        completions = [texts[0] for texts in self.generate_answers(batch)]
        meta = batch["meta"]
        scored = score_answers(completions, meta, self._judge_client())
        sampled_fraction = None
        if self.hparams.val_samples:
            sampling = SamplingConfig(
                n=self.hparams.val_samples,
                temperature=self.hparams.val_temperature,
                max_new_tokens=self.hparams.max_new_tokens,
                seed=10_000 * batch_idx,  # the same samples for the same model and batches
            )
            sampled = self.generate_answers(batch, sampling=sampling)
            # Multiple-choice rows only (sampled answers of other types are not scored).
            sampled_fraction = [
                sum(response_choice(t, len(m["options"]) or 4, m["options"]) == m["answer"] for t in texts)
                / len(texts)
                if s.scoring == CHOICE
                else None
                for texts, m, s in zip(sampled, meta, scored, strict=True)
            ]
        records: list[dict[str, Any]] = [
            {
                "key": m["key"],
                "problem_id": m["problem_id"],
                "problem_type": m["problem_type"],
                "scoring": s.scoring,
                "category": m["category"],
                "answer": m["answer"],
                "predicted": s.predicted,
                "correct": s.correct,
                "format": follows_format(c),
                "reasoning_agrees": (
                    reasoning_agrees(c, s.predicted, m["options"]) if s.scoring == CHOICE else None
                ),
                "num_frames": m["num_frames"],
                "completion": c,
                **({"scoring_note": s.note} if s.note else {}),
            }
            for m, s, c in zip(meta, scored, completions, strict=True)
        ]
        if sampled_fraction is not None:
            for record, fraction in zip(records, sampled_fraction, strict=True):
                if fraction is not None:
                    record["sampled_correct"] = fraction
        self._scores_of(dataloader_idx).update(
            [s.predicted if s.scoring == CHOICE else None for s in scored],
            [m["answer"] for m in meta],
            [m["category"] for m in meta],
            [r["format"] for r in records],
            sampled_fraction,
            [r["reasoning_agrees"] for r in records],
            scoring=[s.scoring for s in scored],
            correct=[s.correct for s in scored],
        )
        self._val_records.setdefault(dataloader_idx, []).extend(records)
        if "labels" in batch and dataloader_idx == self._primary_val_loader():
            loss = self.token_mean_loss(batch)
            self.log("val/loss", loss, batch_size=len(meta), sync_dist=True, add_dataloader_idx=False)

    def token_mean_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """Cross-entropy of the labelled (assistant) tokens, averaged over those tokens."""
        logits = self.forward_logits(batch)[:, :-1].float()
        labels = batch["labels"][:, 1:]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

    def _val_frame_counts(self) -> list[int] | None:
        """Frame count of each validation dataloader, when the datamodule says (a sweep does)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        return getattr(datamodule, "val_frame_counts", None)

    def _primary_val_loader(self) -> int:
        # The loader at the training frame count reports under the plain `val/...` names.
        counts = self._val_frame_counts()
        datamodule = getattr(self.trainer, "datamodule", None)
        primary = getattr(getattr(datamodule, "hparams", None), "num_frames", None)
        return counts.index(primary) if counts and primary in counts else 0

    def on_validation_epoch_end(self) -> None:
        num_loaders = max(1, len(self.trainer.num_val_batches))
        counts = self._val_frame_counts()
        sweep = num_loaders > 1
        primary = self._primary_val_loader()
        self.val_results = []
        for loader in range(num_loaders):
            metric = self._scores_of(loader)
            scores = metric.compute()
            metric.reset()
            frames = counts[loader] if counts and len(counts) == num_loaders else None
            self.val_results.append(
                ValidationResult(frames, scores, self._val_records.get(loader, []), loader == primary)
            )
        self.last_val_scores = self.val_results[primary].scores
        if not self.trainer.sanity_checking:
            for result in self.val_results:
                self._write_predictions(
                    result, suffix=f"-frames{result.frames}" if sweep and not result.primary else ""
                )
        for result in self.val_results:
            for name, value in result.scores.items():
                if name.startswith("count"):
                    continue
                if result.primary:
                    self.log(f"val/{name}", value, sync_dist=False, add_dataloader_idx=False)
                if sweep:
                    self.log(
                        f"val/frames_{result.frames}/{name}", value, sync_dist=False, add_dataloader_idx=False
                    )
        if self.trainer.state.fn == "validate" and not self.trainer.sanity_checking:
            for result in self.val_results:
                frames = f" at {result.frames} frames" if result.frames else ""
                title = f"Validation of {self.hparams.model_path}{frames}"
                rank_zero_info("\n" + format_accuracy_table(result.scores, title=title))
            for sample in self.val_results[primary].predictions[:2]:
                rank_zero_info(
                    f"[{sample['key']}] key={sample['answer']} parsed={sample['predicted']}: "
                    f"{sample['completion']!r}"
                )
        self._val_records = {}

    def _write_predictions(self, result: ValidationResult, suffix: str = "") -> None:
        """One JSON line per validation question (each rank writes the questions it saw)."""
        folder = Path(self.trainer.default_root_dir) / "predictions"
        folder.mkdir(parents=True, exist_ok=True)
        rank = f"-rank{self.global_rank}" if self.trainer.world_size > 1 else ""
        path = folder / f"val-step{self.global_step:06d}{suffix}{rank}.jsonl"
        with path.open("w") as f:
            for record in result.predictions:
                f.write(json.dumps(record) + "\n")

    # -- export ------------------------------------------------------------------------------
    def export_hf(self, out_dir: str | Path) -> Path:
        """Write the current weights as a ``save_pretrained`` directory with the processor files."""
        assert self.model is not None
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out)
        self.processor.save_pretrained(out)
        return out

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Enough to rebuild the HF model from a checkpoint alone (see `lvrl model export`).
        checkpoint["lvrl"] = {"model_path": str(self.hparams.model_path), "module": type(self).__name__}
