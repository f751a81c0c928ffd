"""GRPO-family RL: the policy update on rollouts prepared by :class:`callbacks.rl_rollout.RolloutCallback`.

The step reads top to bottom: the callback has already encoded each video once, sampled G
completions per prompt from the engine, scored them and computed advantages; here the policy
(and, with a KL term, the frozen reference) scores the same tokens in the engine's layout and
positions with the cached video embeddings, and the clipped surrogate is minimised.

Departures from the paper's released code: the trainer uses the engine's exact token layout
and M-RoPE positions (the release fell back to 1-D positions in training), and the old-policy
log-probs are the engine's own (one policy update per rollout, so they are the behaviour
policy's); their gap to the trainer's is logged every step as ``rollout/logprob_diff_*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from models.loading import load_model
from models.logprobs import ScoringBatch, completion_logprobs
from models.rl.losses import policy_loss
from models.vision import encode_videos
from models.vlm_module import VLMModule


@dataclass
class RolloutBatch:
    """What the rollout callback hands to the training step (one row per completion)."""

    scoring: ScoringBatch
    video_embeds: list[torch.Tensor]
    """Cached encoding of each row's video (rows of one prompt share the same tensor)."""
    old_logprobs: torch.Tensor
    """``(rows, max_completion_len)`` engine log-probs of the sampled tokens."""
    advantages: torch.Tensor
    """``(rows,)`` group-relative advantages."""
    row_mask: torch.Tensor
    """``(rows,)`` 1.0 for rows that train (0 for groups removed by zero-variance filtering)."""
    group_size: int
    """G: rows ``[k*G, (k+1)*G)`` are the completions of prompt k."""


class GRPOModule(VLMModule):
    """Policy optimisation with the GRPO family of losses.

    Args (beyond :class:`~models.vlm_module.VLMModule`'s):
        clip_low: lower clip of the importance ratio (1 - clip_low).
        clip_high: upper clip (1 + clip_high); above clip_low is DAPO's clip-higher.
        dual_clip: cap on the loss of negative-advantage tokens (e.g. 3.0); None disables it.
        kl_coef: weight of the KL to the frozen reference in the loss (0: no reference model).
        kl_kind: KL estimator: ``k1``, ``k2`` or ``k3`` (low-variance KL).
        loss_aggregation: ``token_mean``, ``seq_mean_token_mean`` or ``seq_mean_token_sum`` (Dr.GRPO).
        ratio_level: ``token`` (GRPO) or ``sequence`` (GSPO).
    """

    def __init__(
        self,
        model_path: str,
        learning_rate: float = 1e-6,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        lr_schedule: str = "constant",
        freeze_vision: bool = True,
        gradient_checkpointing: bool = False,
        max_new_tokens: int = 256,
        dtype: str = "float32",
        attn_implementation: str | None = None,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        dual_clip: float | None = 3.0,
        kl_coef: float = 0.0,
        kl_kind: str = "k3",
        loss_aggregation: str = "token_mean",
        ratio_level: str = "token",
    ) -> None:
        super().__init__(
            model_path,
            learning_rate,
            weight_decay,
            betas,
            warmup_steps,
            lr_schedule,
            freeze_vision,
            gradient_checkpointing,
            max_new_tokens,
            dtype,
            attn_implementation,
        )
        self.reference: torch.nn.Module | None = None

    def configure_model(self) -> None:
        super().configure_model()
        if self.hparams.kl_coef > 0 and self.reference is None:
            reference = load_model(self.hparams.model_path, dtype=getattr(torch, self.hparams.dtype)).eval()
            reference.requires_grad_(False)
            # Kept out of the module tree: not trained, not checkpointed, not moved by optimizers.
            object.__setattr__(self, "reference", reference)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        rollout: RolloutBatch = batch["rollout"]
        assert self.model is not None
        mask = rollout.scoring.completion_mask.to(self.device) * rollout.row_mask.to(self.device).unsqueeze(
            -1
        )
        entropy = torch.zeros(rollout.scoring.completion_mask.shape, device=self.device)
        video_embeds = rollout.video_embeds
        if not self.hparams.freeze_vision:
            # A trainable vision tower needs gradients through the encoding: encode again, with
            # grad, once per prompt (the cached, grad-free encoding served the rollouts).
            fresh = encode_videos(self.model, batch["pixel_values_videos"], batch["video_grid_thw"])
            video_embeds = [e for e in fresh for _ in range(rollout.group_size)]
        logprobs = completion_logprobs(self.model, rollout.scoring, video_embeds, entropy=entropy)
        old = rollout.old_logprobs.to(self.device)
        reference = None
        if self.reference is not None:
            with torch.no_grad():
                reference = completion_logprobs(
                    self.reference.to(self.device), rollout.scoring, rollout.video_embeds
                )
        loss, stats = policy_loss(
            logprobs,
            old,
            rollout.advantages.to(self.device),
            mask,
            clip_low=self.hparams.clip_low,
            clip_high=self.hparams.clip_high,
            dual_clip=self.hparams.dual_clip,
            ratio_level=self.hparams.ratio_level,
            aggregation=self.hparams.loss_aggregation,
            kl_coef=self.hparams.kl_coef,
            ref_logprobs=reference,
            kl_kind=self.hparams.kl_kind,
        )
        rows = int(rollout.row_mask.shape[0])
        for name, value in stats.items():
            self.log(f"train/{name}", value, batch_size=rows)
        self.log("train/loss", loss.detach(), prog_bar=True, batch_size=rows)
        valid = rollout.scoring.completion_mask.to(self.device).bool()
        if valid.any():
            gap = (logprobs.detach() - old).abs()[valid]
            # Trainer vs engine on the same sampled tokens: should be ~1e-5 in float32.
            self.log("rollout/logprob_diff_mean", gap.mean(), batch_size=rows)
            self.log("rollout/logprob_diff_max", gap.max(), batch_size=rows)
            self.log("train/entropy", entropy[valid].mean(), batch_size=rows)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=rows)
        return loss
