"""GRPO updates on fixed rollouts, in one process or in gloo processes under the sharded strategy.

The rollouts are made once (:func:`rollout_parts`: real video prompts of the synthetic data,
their cached encodings, random completions, engine log-probs and advantages per step) and each
data-parallel rank builds the rollout batch of its share of the prompts
(:func:`rollout_of`), as the rollout callback would have. A callback hands them over before
each step and records, on rank 0, the loss of each update, the full gradients just before each
optimizer step and the full weights at the end (:class:`HandOverAndRecord`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from transformers import AutoProcessor

from core.layout import PromptLayout, ScoringBatch, pad_rows
from core.video import VideoEmbedding
from datamodules.collate import VideoQACollator
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from families import family_of
from models.loading import load_model
from models.vision import encode_videos
from parallel.process_group import release_process_group
from parallel.sharding import full_tensor
from rewards.combine import RewardBreakdown
from rollout.base import Completion
from rollout.experience import PromptBatch, RolloutBatch

GROUP = 2


@dataclass
class RolloutParts:
    """Everything a rollout batch is made of, for every prompt of one step."""

    layouts: list[PromptLayout]
    videos: list[VideoEmbedding]
    completions: list[list[int]]
    """``GROUP`` per prompt, prompt-major."""
    old_logprobs: list[list[float]]
    advantages: list[float]
    row_mask: list[float]


def perturbed_policy(model_dir: str | Path, seed: int = 11) -> torch.nn.Module:
    """The model of ``model_dir``, every weight moved by noise drawn from ``seed`` (so it differs
    from anything the directory or a constructor holds), the vision tower frozen."""
    model = load_model(model_dir)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
            parameter.requires_grad_("visual" not in name)
    return model


def rollout_parts(model_dir: Path, synth_dir: Path, prompts: int, steps: int) -> list[RolloutParts]:
    """``steps`` rollouts of the same ``prompts`` video prompts with step-seeded completions and
    advantages; the last prompt's group is filtered out (row mask 0), so ranks train different
    numbers of rows."""
    processor = AutoProcessor.from_pretrained(model_dir)
    stream = VideoQAStream(resolve_shards(str(synth_dir / "train-*.tar")), num_frames=8, max_pixels=56 * 56)
    samples = [s for _, s in zip(range(prompts), stream, strict=False)]
    model = load_model(model_dir)
    batch = VideoQACollator(processor, family=family_of(model.config))(samples)
    with torch.no_grad():
        embeds = encode_videos(model, batch["pixel_values_videos"], batch["video_grid_thw"])
    layouts: list[PromptLayout] = batch["prompts"]
    videos = [
        VideoEmbedding(e, g, float(s))
        for e, g, s in zip(embeds, batch["video_grid_thw"], batch["second_per_grid_ts"], strict=True)
    ]
    parts = []
    for step in range(steps):
        generator = torch.Generator().manual_seed(100 + step)
        lengths = torch.randint(3, 12, (prompts * GROUP,), generator=generator).tolist()
        completions = [torch.randint(20, 300, (n,), generator=generator).tolist() for n in lengths]
        old = [(-3.0 + 0.3 * torch.randn(n, generator=generator)).tolist() for n in lengths]
        advantages = torch.randn(prompts * GROUP, generator=generator).tolist()
        row_mask = [0.0 if row // GROUP == prompts - 1 else 1.0 for row in range(prompts * GROUP)]
        parts.append(RolloutParts(layouts, videos, completions, old, advantages, row_mask))
    return parts


def rollout_of(
    parts: RolloutParts, prompts: list[int], *, pad_token_id: int, length_multiple: int
) -> RolloutBatch:
    """The rollout batch of the given prompts (a data-parallel rank's share), laid out for scoring."""
    rows = [p * GROUP + g for p in prompts for g in range(GROUP)]
    completions = [parts.completions[r] for r in rows]
    scoring = ScoringBatch.from_layouts(
        [parts.layouts[p] for p in prompts],
        completions,
        [i // GROUP for i in range(len(rows))],
        pad_token_id=pad_token_id,
        length_multiple=length_multiple,
    )
    old, _ = pad_rows([parts.old_logprobs[r] for r in rows], torch.float32)
    width = scoring.completion_mask.shape[1]
    old = torch.nn.functional.pad(old, (0, width - old.shape[1]))
    return RolloutBatch(
        prompts=PromptBatch(
            [parts.layouts[p] for p in prompts], [{} for _ in prompts], torch.zeros(0), torch.zeros(0)
        ),
        videos=[parts.videos[p] for p in prompts],
        completions=[Completion(c, [], "", "stop") for c in completions],
        scoring=scoring,
        old_logprobs=old,
        rewards=RewardBreakdown([0.0] * len(rows), {}),
        advantages=torch.tensor([parts.advantages[r] for r in rows]),
        zero_variance=torch.zeros(len(rows), dtype=torch.bool),
        row_mask=torch.tensor([parts.row_mask[r] for r in rows]),
        group_size=GROUP,
    )


class HandOverAndRecord(L.Callback):
    """Hands each step its rollouts (this rank's share) and records what the test compares."""

    def __init__(
        self, parts: list[RolloutParts], prompts: list[int], out: Path, sequence_parallel_size: int
    ) -> None:
        self.parts, self.prompts, self.out = parts, prompts, out
        self.length_multiple = sequence_parallel_size
        self.record: dict[str, Any] = {"grads": [], "losses": []}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        pad = pl_module.processor.tokenizer.pad_token_id
        parts = self.parts[trainer.global_step]
        batch[pl_module.EXPERIENCE] = rollout_of(
            parts, self.prompts, pad_token_id=pad, length_multiple=self.length_multiple
        )

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: Any, optimizer: Any) -> None:
        grads = {
            name: full_tensor(p.grad).clone()
            for name, p in pl_module.named_parameters()
            if p.grad is not None
        }
        self.record["grads"].append(grads)

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.record["losses"].append(float(trainer.callback_metrics["train/loss"]))

    def on_train_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.record["weights"] = {
            name: full_tensor(p.detach()).clone()
            for name, p in pl_module.named_parameters()
            if p.requires_grad
        }
        if trainer.global_rank == 0:
            torch.save(self.record, self.out)


def grpo_module(model_dir: Path, optimizer: str = "sgd", **overrides: Any) -> Any:
    """The tiny model's GRPO module for these runs; ``optimizer="sgd"`` swaps AdamW for SGD with
    momentum, whose update is linear in the gradient (see :class:`SGDGRPOModule`)."""
    from models.grpo import GRPOModule

    settings: dict[str, Any] = {
        "learning_rate": 1e-2 if optimizer == "sgd" else 1e-4,
        "kl_coef": 0.05,
        "micro_batch_rows": 2,
        "max_grad_norm": 0.05,  # small enough to clip: the norm of sharded gradients is exercised
        "max_new_tokens": 4,
    }
    module_class = sgd_variant(GRPOModule) if optimizer == "sgd" else GRPOModule
    return module_class(str(model_dir), **{**settings, **overrides})


def sgd_variant(module_class: type) -> type:
    """``module_class`` optimised by SGD with momentum at a constant learning rate.

    Adam divides each gradient entry by its own running magnitude, so an entry whose gradient is
    rounding noise (a key bias: softmax ignores it) moves by about the learning rate in a
    direction set by that noise; two runs that differ only in rounding then differ by that much.
    SGD's update is linear in the gradient, so weights inherit the gradients' float32 bar.
    """

    class SGDModule(module_class):  # type: ignore[misc, valid-type]
        def configure_optimizers(self) -> Any:
            params = [p for p in self.parameters() if p.requires_grad]
            optimizer = torch.optim.SGD(params, lr=self.hparams.learning_rate, momentum=0.9)
            constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": constant, "interval": "step"}}

    SGDModule.__name__ = SGDModule.__qualname__ = f"SGD{module_class.__name__}"
    return SGDModule


def fit_on_rollouts(
    module: L.LightningModule,
    parts: list[RolloutParts],
    prompts: list[int],
    out: Path,
    root: Path,
    *,
    strategy: Any = "auto",
    devices: int = 1,
    sequence_parallel_size: int = 1,
    max_steps: int | None = None,
    save_to: Path | None = None,
    resume_from: Path | None = None,
    callbacks: list[L.Callback] | None = None,
) -> None:
    """GRPO updates on the fixed rollouts (no engine, no data: the batches are placeholders),
    one per part (or up to ``max_steps``), recording into ``out``; the run's checkpoint is
    written to ``save_to`` at the end, and a run resumes from ``resume_from``. ``callbacks``
    run after the recorder. A multi-process run's process group ends with it, as an ``lvrl``
    command's does (:mod:`parallel.process_group`)."""
    trainer = L.Trainer(
        max_steps=max_steps or len(parts),
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        use_distributed_sampler=False,
        default_root_dir=root,
        callbacks=[HandOverAndRecord(parts, prompts, out, sequence_parallel_size), *(callbacks or [])],
    )
    # One batch per step, a dict as a datamodule's are: HandOverAndRecord puts the step's rollouts in it.
    placeholders = torch.utils.data.DataLoader([{"step": i} for i in range(len(parts))], batch_size=1)
    trainer.fit(module, train_dataloaders=placeholders, ckpt_path=resume_from)
    if save_to is not None:
        trainer.save_checkpoint(save_to)
    release_process_group()


def launched_externally(rank: int, world_size: int, port: int) -> None:
    """The environment of a rank started by an outside launcher (as torchrun does), so that
    Lightning joins the process group instead of starting processes."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        NODE_RANK="0",
        LOCAL_RANK=str(rank),
        RANK=str(rank),
    )
