"""GRPO-family RL: the policy update on rollouts prepared by :class:`callbacks.rl_rollout.RolloutCallback`.

The step reads top to bottom: the callback has already encoded each video once, sampled G
completions per prompt from the engine, scored them and computed advantages, and handed them
over as a :class:`~rollout.experience.RolloutBatch` in the training batch (what the update reads
of it is :class:`models.rl.experience.Experience`; :meth:`GRPOModule.experience_of`);
here the policy (and, with a KL term, the frozen reference) scores the same tokens in the
prompts' own layout and positions with the cached video embeddings, and the clipped surrogate
is minimised.

One training step is one rollout batch and ``num_iterations`` optimizer updates on it (manual
optimization: Lightning's ``global_step`` counts updates, so ``trainer.max_steps`` and the
learning-rate schedule are in updates). Each update accumulates gradients over micro-batches of
``micro_batch_rows`` rows; the loss normalisers are those of the whole rollout, so the
micro-batched update equals the full-batch one.

With the model sharded (:class:`parallel.strategy.SequenceParallelStrategy`), every rank runs
the same number of forward and backward passes (each is a collective over the shards): a rank
with fewer micro-batches to train runs zero-weighted ones on its own rows. The normalisers are
counts summed over the data-parallel ranks and gradients are summed, so the update equals the
one-process update on the whole batch; logged losses and statistics are summed the same way.

Old policy and rollout correction: by default the old-policy log-probs of the ratio are the
engine's own (the behaviour policy's), as in the paper's release. With ``rollout_correction``
the old policy is the trainer's (its first-iteration log-probs, taken before any update of the
batch) and each token's loss is weighted by a bounded pi_old / pi_engine
(:mod:`models.rl.correction`: truncated or masked importance sampling). Either way the gap
between the two is logged every step (``rollout/logprob_diff_*``: mean, max, tail counts, and
per frame-count bucket), and ``max_logprob_gap`` can stop a run whose gap stays too large.

Departure from the paper's released code: the trainer uses the engine's exact token layout and
M-RoPE positions (the release fell back to 1-D positions in training).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from core.failures import SafeStop
from core.layout import ScoringBatch
from models.logprobs import completion_logprobs, input_embeddings
from models.lora import base_model
from models.rl.correction import RolloutCorrection, importance_weights
from models.rl.experience import Experience
from models.rl.losses import policy_loss
from models.rl.step_statistics import (
    CORRECTION_STATISTICS,
    DEFAULT_FRAME_BUCKETS,
    GAP_TAIL_STATISTICS,
    FrameBuckets,
    gap_statistics,
    is_max_statistic,
    merge_stats,
)
from models.rl.turns import POLICY_GRADIENT_TURNS, PolicyGradientTurns, request_turn_advantages
from models.vision import decoder_blocks, drop_vision_tower, encode_row_segments, encode_videos
from models.vlm_module import VLMModule, rank0_weights
from parallel.prefill import sequence_parallel_completion_logprobs
from parallel.sharding import (
    ShardedScope,
    ShardingLayout,
    ShardingSettings,
    full_tensor,
    run_sharded,
    shard_model,
)

log = logging.getLogger(__name__)


class GRPOModule(VLMModule):
    """Policy optimisation with the GRPO family of losses.

    Every :class:`~models.vlm_module.VLMModule` argument is accepted and means the same there;
    three of them take RL's defaults here.

    Args:
        learning_rate: peak AdamW learning rate (RL's default, 1e-6).
        betas: AdamW betas (RL's default, (0.9, 0.999)).
        freeze_vision: keep the vision tower's weights fixed (the default in RL: the cached
            encoding then serves every pass).
        clip_low: lower clip of the importance ratio (1 - clip_low).
        clip_high: upper clip (1 + clip_high); above clip_low is DAPO's clip-higher.
        dual_clip: cap on the loss of negative-advantage tokens (e.g. 3.0); None disables it.
        kl_coef: weight of the KL to the frozen reference in the loss (0: no reference model).
            With ``lora`` the reference is the policy itself with its adapters disabled (the
            base model, exactly), not a second copy.
        kl_kind: KL estimator: ``k1``, ``k2`` or ``k3`` (low-variance KL).
        loss_aggregation: ``token_mean``, ``seq_mean_token_mean`` or ``seq_mean_token_sum`` (Dr.GRPO).
        ratio_level: ``token`` (GRPO) or ``sequence`` (GSPO).
        num_iterations: optimizer updates per rollout batch (GRPO's mu); the ratio of every
            update is taken against the engine's (behaviour-policy) log-probs.
        micro_batch_rows: completions per forward/backward pass (gradient accumulation inside an
            update; bounds activation memory); None puts the whole rollout in one pass.
        max_grad_norm: clip the gradient norm of each update to this (None: no clipping). It
            replaces ``trainer.gradient_clip_val``, which Lightning forbids with manual optimization.
        share_prompt_prefix: forward each prompt (video included) once per micro-batch and let its
            completions reuse its keys and values, instead of once per completion. Same log-probs
            and gradients up to float rounding; about G times less prompt work. False forwards
            every row whole (a debugging aid).
        reference_placement: with a sharded model, where the frozen reference's shards live:
            ``sharded`` (on the device, like the policy's) or ``cpu`` (in host memory, each
            block copied in for its forward). Never a whole copy per rank.
        rollout_correction: correct for the engine sampling from a slightly different policy
            than the trainer scores (bf16 kernels, another attention implementation):
            ``{mode: truncate|mask, level: token|sequence|geometric, upper: 2.0, lower: null}``
            (:class:`models.rl.correction.RolloutCorrection`); the old policy becomes the
            trainer's own first-iteration log-probs and each token's loss is weighted by the
            bounded pi_old / pi_engine. null (default): the engine's log-probs are the old policy.
            Logged: ``correction/weight_mean``, ``weight_max``, ``raw_weight_mean``,
            ``masked_fraction``, ``truncated_fraction``.
        gap_frame_buckets: the trainer-engine gap is also logged per bucket of frames per video
            (``rollout/logprob_diff_mean@<lo>-<hi>``); these are the buckets' upper frame counts.
        max_logprob_gap: stop the run (with a checkpoint) when the step's mean trainer-engine
            gap (nats per token) exceeds this for ``max_gap_steps`` steps in a row; null: never.
        max_gap_steps: consecutive steps over ``max_logprob_gap`` that stop the run.
        policy_gradient_turns: which turns of a tool-use episode the policy gradient trains:
            ``all`` (default) or ``requests``, the turns that end in a frame request (the
            answer turn, after the last tool reply, then gets only the KL term):
            :mod:`models.rl.turns`. ``requests`` needs tool-use rollouts and token-level ratios.
    """

    trains_on_targets = False  # a training batch is prompts; the rollouts come with it (below)
    EXPERIENCE = "experience"
    """The training batch's key of the step's rollouts (an :class:`~models.rl.experience.Experience`),
    set by :class:`callbacks.rl_rollout.RolloutCallback` before the step (``RolloutWorker.hand_over``)."""

    def __init__(
        self,
        model_path: str,
        learning_rate: float = 1e-6,
        betas: tuple[float, float] = (0.9, 0.999),
        freeze_vision: bool = True,
        clip_low: float = 0.2,
        clip_high: float = 0.28,
        dual_clip: float | None = 3.0,
        kl_coef: float = 0.0,
        kl_kind: str = "k3",
        loss_aggregation: str = "token_mean",
        ratio_level: str = "token",
        num_iterations: int = 1,
        micro_batch_rows: int | None = None,
        max_grad_norm: float | None = 1.0,
        share_prompt_prefix: bool = True,
        reference_placement: str = "sharded",
        rollout_correction: dict[str, Any] | None = None,
        gap_frame_buckets: list[int] | None = None,
        max_logprob_gap: float | None = None,
        max_gap_steps: int = 3,
        policy_gradient_turns: PolicyGradientTurns = "all",
        **kwargs: Any,
    ) -> None:
        # RL's own defaults for three shared settings; every other VLMModule argument passes through.
        super().__init__(
            model_path, learning_rate=learning_rate, betas=betas, freeze_vision=freeze_vision, **kwargs
        )
        if num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
        if micro_batch_rows is not None and micro_batch_rows < 1:
            raise ValueError(f"micro_batch_rows must be >= 1 or null, got {micro_batch_rows}")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or null, got {max_grad_norm}")
        if reference_placement not in ("sharded", "cpu"):
            raise ValueError(f"reference_placement must be 'sharded' or 'cpu', got {reference_placement!r}")
        self.correction = RolloutCorrection.of(rollout_correction)
        self.frame_buckets = FrameBuckets(tuple(gap_frame_buckets or DEFAULT_FRAME_BUCKETS))
        if max_logprob_gap is not None and max_logprob_gap <= 0:
            raise ValueError(f"max_logprob_gap must be > 0 or null, got {max_logprob_gap}")
        if max_gap_steps < 1:
            raise ValueError(f"max_gap_steps must be >= 1, got {max_gap_steps}")
        if policy_gradient_turns not in POLICY_GRADIENT_TURNS:
            raise ValueError(
                f"policy_gradient_turns must be one of {POLICY_GRADIENT_TURNS}, got {policy_gradient_turns!r}"
            )
        if policy_gradient_turns == "requests" and ratio_level == "sequence":
            # GSPO's ratio is one per sequence, over every sampled token: it would clip the request
            # turns by a ratio the untrained answer turn moves.
            raise ValueError(
                "policy_gradient_turns=requests trains part of each completion and ratio_level=sequence "
                "(GSPO) clips by a ratio over the whole completion: use ratio_level=token with it"
            )
        self.steps_over_gap = 0
        """Consecutive steps whose mean trainer-engine gap exceeded ``max_logprob_gap``."""
        # Scores completions with the sequence split when the strategy hands it a shard.
        self.supports_sequence_parallel = True
        # Several optimizer updates per batch: the step drives the optimizer itself.
        self.automatic_optimization = False
        self.reference: torch.nn.Module | None = None
        object.__setattr__(self, "_reference_scope", None)

    # -- what the rollout callback hands over (rollout.experience.RolloutConsumer) --------------
    def check_experience(
        self, group_size: int, engine_dtype: torch.dtype | None, episodes: bool = False
    ) -> None:
        """Refuse experience this module cannot learn from (G completions per prompt, sampled in
        ``engine_dtype``; None: the policy's own; tool-use ``episodes`` or single turns); warn
        about wasteful settings."""
        problems = []
        if self.hparams.policy_gradient_turns == "requests" and not episodes:
            problems.append(
                "model.init_args.policy_gradient_turns=requests trains the turns that end in a frame "
                "request, and these rollouts are single turns (no request): turn the RL callback's "
                "tool_use on, or train every turn (policy_gradient_turns=all)"
            )
        if engine_dtype is not None and engine_dtype != self.compute_dtype:
            if self.correction is None:
                problems.append(
                    f"the engine samples in {engine_dtype} but the policy scores in {self.compute_dtype}: "
                    "the importance ratio would carry the rounding gap between the two; set the engine's "
                    "dtype to the model's (or the model's to the engine's), or correct for the gap with "
                    "model.init_args.rollout_correction (e.g. {mode: truncate, level: token})"
                )
            else:
                log.info(
                    "the engine samples in %s, the policy scores in %s: rollout_correction (%s) weights "
                    "the gap out; watch correction/weight_mean and rollout/logprob_diff_mean",
                    engine_dtype,
                    self.compute_dtype,
                    self.correction,
                )
        if problems:
            listed = "\n".join(f"  - {p}" for p in problems)
            raise ValueError(f"the rollout settings do not fit {type(self).__name__}:\n{listed}")
        if not self.hparams.freeze_vision:
            log.warning(
                "the vision tower is trainable: the policy pass re-encodes videos with grad each step"
            )
        if self.hparams.share_prompt_prefix and self.hparams.gradient_checkpointing:
            log.warning(
                "gradient_checkpointing: the policy pass forwards each prompt once per completion "
                "(transformers keeps no key/value cache through checkpointed layers); the reference "
                "pass still shares prompts"
            )
        rows = self.hparams.micro_batch_rows
        if rows is not None and self.hparams.share_prompt_prefix and rows % group_size:
            log.warning(
                "micro_batch_rows=%d is not a multiple of num_generations=%d: prompts split across "
                "micro-batches are forwarded once per micro-batch",
                rows,
                group_size,
            )

    @property
    def trains_vision(self) -> bool:
        return not self.hparams.freeze_vision

    @classmethod
    def experience_of(cls, batch: dict[str, Any]) -> Experience:
        """The rollouts a training batch carries (what this step learns from)."""
        experience = batch.get(cls.EXPERIENCE)
        if experience is None:
            raise RuntimeError(
                f"{cls.__name__} trains on rollouts, and none came with this step's batch: "
                "add callbacks.rl_rollout.RolloutCallback to trainer.callbacks"
            )
        return experience

    def configure_model(self) -> None:
        super().configure_model()
        if self.hparams.kl_coef > 0 and self.reference is None and self.lora_settings is None:
            reference = self.load_weights_or_skeleton().eval()
            reference.requires_grad_(False)
            # It scores rows whose video slots hold the policy's cached encoding: its own vision
            # tower would never run.
            drop_vision_tower(reference)
            # Kept out of the module tree: not trained, not checkpointed, not moved by optimizers.
            object.__setattr__(self, "reference", reference)

    def shard(
        self, mesh: DeviceMesh, settings: ShardingSettings, data_parallel_group: dist.ProcessGroup | None
    ) -> None:
        if not self.hparams.freeze_vision and self.trainer.state.fn == "fit":
            # The policy pass re-encodes videos outside the model's forward, in amounts that
            # differ across ranks; a trainable tower would have to be gathered in lockstep.
            raise ValueError(
                "GRPO with a sharded model keeps the vision tower frozen: "
                "set model.init_args.freeze_vision: true"
            )
        super().shard(mesh, settings, data_parallel_group)
        if self.reference is not None:
            offload = settings.cpu_offload or self.hparams.reference_placement == "cpu"
            reference_settings = dataclasses.replace(settings, cpu_offload=offload)
            self.reference.to(getattr(torch, settings.param_dtype))  # frozen: no master copy needed
            layout = ShardingLayout(self.reference, decoder_blocks(self.reference))
            weights = rank0_weights(self.reference)
            scope = shard_model(layout, mesh, reference_settings, trains=False, weights_from_rank0=weights)
            object.__setattr__(self, "_reference_scope", scope)

    def _passes(self, count: int) -> int:
        """How many passes every rank runs when this rank needs ``count`` (the most any rank needs)."""
        if not self.sharded or not dist.is_initialized() or dist.get_world_size() == 1:
            return count
        most = torch.tensor([count], dtype=torch.long)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most.item())

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        rollout = self.experience_of(batch)
        assert self.model is not None
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        total_rows = int(rollout.row_mask.shape[0])
        mask = rollout.scoring.completion_mask * rollout.row_mask.unsqueeze(-1)
        normalizers = loss_normalizers(mask, self.hparams.loss_aggregation, self.sum_over_data)
        advantages = rollout.advantages
        if self.hparams.policy_gradient_turns == "requests":
            advantages = request_turn_advantages(
                advantages, rollout.scoring.completion_mask, rollout.scoring.completion_lengths()
            )
        trained = rows_that_train(advantages, rollout.row_mask, self.hparams.kl_coef)
        chunks = micro_batches(trained, self.hparams.micro_batch_rows)
        every_row = micro_batches(list(range(total_rows)), self.hparams.micro_batch_rows)
        passes = self._passes(len(chunks))
        # Zero-weighted passes on this rank's own rows, while other ranks train more micro-batches.
        idle = [every_row[i % len(every_row)] for i in range(passes - len(chunks))]
        references = self._reference_logprobs(rollout, chunks + idle)
        # With rollout correction: each micro-batch's old-policy log-probs and importance weights,
        # from the first iteration's pass (taken before any update of this batch).
        old_policy: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(chunks)
        totals: dict[str, torch.Tensor] = {}
        for iteration in range(self.hparams.num_iterations):
            for index, (rows, reference) in enumerate(zip(chunks, references, strict=False)):
                first = iteration == 0
                stats = self._accumulate_gradients(
                    rollout, rows, advantages, mask, normalizers, reference, old_policy, index, first
                )
                merge_stats(totals, stats)
            for rows in idle:
                stats = self._idle_pass(rollout, rows)
                if iteration == 0 and not trained:  # this rank's engine-trainer gap, measured anyway
                    merge_stats(totals, stats)
            self._optimizer_update(optimizer, scheduler, totals)
        if not passes:
            # Nothing trains this step, on any rank (e.g. every group scored alike): still measure
            # the engine-trainer gap and the entropy, without gradient, on every row.
            with torch.no_grad():
                for rows in every_row:
                    merge_stats(totals, self._diagnostics(rollout, rows))
        self.log("train/trained_row_fraction", len(trained) / total_rows, batch_size=total_rows)
        self.log("train/nonfinite_skipped", float(self.nonfinite_skipped), batch_size=total_rows)
        mean_gap = self._log_step(totals, total_rows)
        self._check_gap(mean_gap)

    def _check_gap(self, mean_gap: float) -> None:
        """Count steps whose mean trainer-engine gap exceeds ``max_logprob_gap``; stop after too many
        in a row (between steps, after the update: the checkpoint written is consistent)."""
        bound = self.hparams.max_logprob_gap
        if bound is None:
            return
        self.steps_over_gap = self.steps_over_gap + 1 if mean_gap > bound else 0
        if self.steps_over_gap >= self.hparams.max_gap_steps:
            raise LogprobGapTooLarge(
                f"the trainer's and the engine's log-probs of the sampled tokens differed by {mean_gap:.3g} "
                f"nats per token on average, over model.max_logprob_gap={bound:g}, for "
                f"{self.steps_over_gap} steps in a row (step {self.global_step}); stopping with a "
                "checkpoint. "
                "The engine no longer samples the policy the trainer updates: check the engine's dtype and "
                "attention kernels against the trainer's (rollout/logprob_diff_mean@<frames> shows whether "
                "long videos are the cause), set model.rollout_correction, or raise the bound"
            )

    # -- pieces of the step ------------------------------------------------------------------
    def _reference_logprobs(self, rollout: Experience, chunks: list[list[int]]) -> list[torch.Tensor | None]:
        """Frozen-reference log-probs per micro-batch, computed once for all iterations."""
        if self.lora_settings is not None and self.hparams.kl_coef > 0:
            return self._base_model_logprobs(rollout, chunks)
        if self.reference is None:
            return [None] * len(chunks)
        reference = self.reference
        scope: ShardedScope | None = self._reference_scope
        if scope is None:
            reference = reference.to(self.device)
        videos = rollout.video_embeds()

        def score(rows: list[int]) -> torch.Tensor:
            return self._logprobs(
                reference, rollout.scoring.select(rows), videos, None, rollout.segment_embeds(rows)
            )

        with torch.no_grad():
            return [run_sharded(scope, lambda rows=rows: score(rows)) for rows in chunks]

    def _base_model_logprobs(self, rollout: Experience, chunks: list[list[int]]) -> list[torch.Tensor]:
        """The reference of a LoRA policy: the policy's own model with its adapters disabled,
        which computes exactly what the base model does (each adapted layer runs its base
        layer alone), so no second copy is loaded; sharded, it runs in the policy's units."""
        model = self.model
        assert model is not None
        videos = rollout.video_embeds()

        def score(rows: list[int]) -> torch.Tensor:
            return self._logprobs(
                model, rollout.scoring.select(rows), videos, None, rollout.segment_embeds(rows)
            )

        with torch.no_grad(), base_model(model):
            return [self.run_model(lambda rows=rows: score(rows)) for rows in chunks]

    def _logprobs(
        self,
        model: torch.nn.Module,
        scoring: ScoringBatch,
        video_embeds: list[torch.Tensor | None],
        entropy: torch.Tensor | None = None,
        segment_embeds: list[list[torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """Completion log-probs, with the sequence split across the group when the strategy set one.

        ``video_embeds`` are per prompt, indexed like ``scoring.prompt_of_row``; ``segment_embeds``
        per row, the video segments a tool put into its completion (tool-use rollouts).
        """
        if self.sequence_shard is not None:
            embeddings = input_embeddings(model, scoring, video_embeds, self.device, segment_embeds)
            # (Packed rows, no key/value cache: prompts are shared through checkpointed layers too.)
            return sequence_parallel_completion_logprobs(
                model,
                scoring,
                embeddings,
                self.sequence_shard,
                entropy=entropy,
                share_prompts=bool(self.hparams.share_prompt_prefix),
                video_embeds=video_embeds,
                segment_embeds=segment_embeds,
            )
        return completion_logprobs(
            model,
            scoring,
            video_embeds,
            entropy=entropy,
            share_prompts=self._shares_prompts(model),
            segment_embeds=segment_embeds,
        )

    def _shares_prompts(self, model: torch.nn.Module) -> bool:
        """Whether a pass forwards each prompt once: not through checkpointed layers in training,
        where transformers drops the key/value cache the completions would reuse."""
        checkpointed = bool(getattr(model, "is_gradient_checkpointing", False)) and model.training
        return bool(self.hparams.share_prompt_prefix) and not checkpointed

    def _video_embeds(self, rollout: Experience, rows: list[int]) -> list[torch.Tensor | None]:
        """Each prompt's encoding (per prompt, indexed like ``scoring.prompt_of_row``)."""
        if self.hparams.freeze_vision:
            return list(rollout.video_embeds())
        # A trainable vision tower needs gradients through the encoding: encode again, with grad,
        # the prompts of this micro-batch (the cached, grad-free encoding served the rollouts).
        prompts = sorted({rollout.scoring.prompt_of_row[row] for row in rows})
        grids = rollout.prompts.video_grid_thw
        offsets = [0, *grids.prod(dim=-1).cumsum(0).tolist()]
        pixels = rollout.prompts.pixel_values_videos
        pieces = torch.cat([pixels[offsets[k] : offsets[k + 1]] for k in prompts])
        fresh = encode_videos(self.model, pieces, grids[prompts])
        embeds: list[torch.Tensor | None] = [None] * len(rollout.videos)
        for k, encoded in zip(prompts, fresh, strict=True):
            embeds[k] = encoded
        return embeds

    def _accumulate_gradients(
        self,
        rollout: Experience,
        rows: list[int],
        advantages: torch.Tensor,
        mask: torch.Tensor,
        normalizers: dict[str, float],
        reference: torch.Tensor | None,
        old_policy: list[tuple[torch.Tensor, torch.Tensor] | None],
        index: int,
        first_iteration: bool,
    ) -> dict[str, torch.Tensor]:
        """Forward + backward of the given rows (micro-batch ``index``) with the rollout's
        ``advantages`` (one per row, or per token: :func:`models.rl.turns.request_turn_advantages`);
        returns token-weighted statistics. With rollout correction the first iteration fills
        ``old_policy[index]``."""
        scoring, logprobs, engine, entropy = self._score(
            rollout, rows, self._video_embeds(rollout, rows), self._segment_embeds(rollout, rows)
        )
        chunk_mask = mask[rows].to(self.device)
        old, weights, correction_stats = engine, None, {}
        if self.correction is not None:
            if first_iteration:
                # No update has touched the weights yet: these log-probs, detached, are the old
                # policy's (what a separate no-grad pass would compute, bit for bit).
                old = logprobs.detach()
                weights, measured = importance_weights(old, engine, chunk_mask, self.correction)
                correction_stats = {f"is_{name}": value for name, value in measured.items()}
                old_policy[index] = (old, weights)
            else:
                cached = old_policy[index]
                assert cached is not None
                old, weights = cached
        loss, stats = policy_loss(
            logprobs,
            old,
            advantages[rows].to(self.device),
            chunk_mask,
            clip_low=self.hparams.clip_low,
            clip_high=self.hparams.clip_high,
            dual_clip=self.hparams.dual_clip,
            ratio_level=self.hparams.ratio_level,
            aggregation=self.hparams.loss_aggregation,
            kl_coef=self.hparams.kl_coef,
            ref_logprobs=reference,
            kl_kind=self.hparams.kl_kind,
            token_weights=weights,
            **normalizers,
        )
        self.manual_backward(loss)
        # Means over this chunk's tokens become sums weighted by its token count; the aggregated
        # loss terms are already this chunk's share of the whole-rollout loss.
        tokens = chunk_mask.bool().sum()
        out = {name: value * tokens for name, value in stats.items() if name not in ("pg_loss", "kl_loss")}
        out.update(pg_loss=stats["pg_loss"], kl_loss=stats["kl_loss"], loss=loss.detach(), tokens=tokens)
        if first_iteration:
            # Before any update of this batch, so trainer and engine score the same policy.
            out.update(self._gap_statistics(rollout, rows, logprobs, engine, scoring, entropy))
            out.update(correction_stats)
        return out

    def _gap_statistics(
        self,
        rollout: Experience,
        rows: list[int],
        logprobs: torch.Tensor,
        engine: torch.Tensor,
        scoring: ScoringBatch,
        entropy: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        frames = [self._frames_of_prompt(rollout, rollout.scoring.prompt_of_row[row]) for row in rows]
        return gap_statistics(
            logprobs.detach(), engine, scoring.completion_mask, entropy, frames, self.frame_buckets
        )

    def _frames_of_prompt(self, rollout: Experience, prompt: int) -> int:
        """The frames of a prompt's video: as decoded (the collator's ``num_frames``), or, for
        rollouts built without that field, as the model sees them (temporal patches x frames per
        patch; 0 without video)."""
        decoded = rollout.prompts.meta[prompt].get("num_frames")
        if decoded is not None:
            return int(decoded)
        grid = rollout.prompts.layouts[prompt].video_grid_thw
        return 0 if grid is None else int(grid[0]) * self.family.temporal_patch_size

    def _segment_embeds(self, rollout: Experience, rows: list[int]) -> list[list[torch.Tensor]] | None:
        """Each row's tool segments' encodings (tool-use rollouts; None otherwise)."""
        if self.hparams.freeze_vision or rollout.episodes is None:
            return rollout.segment_embeds(rows)
        # As for the prompts' videos: a trainable tower encodes the segments again, with grad.
        return encode_row_segments(self.model, rollout.segment_inputs(rows))

    def _score(
        self,
        rollout: Experience,
        rows: list[int],
        video_embeds: list[torch.Tensor | None],
        segments: list[list[torch.Tensor]] | None,
    ) -> tuple[ScoringBatch, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Policy log-probs of the given rows, with the engine's log-probs and the entropy beside them."""
        scoring = rollout.scoring.select(rows)
        entropy = torch.zeros(scoring.completion_mask.shape, device=self.device)
        model = self.model
        assert model is not None
        logprobs = self.run_model(lambda: self._logprobs(model, scoring, video_embeds, entropy, segments))
        return scoring, logprobs, rollout.old_logprobs[rows].to(self.device), entropy

    def _idle_pass(self, rollout: Experience, rows: list[int]) -> dict[str, torch.Tensor]:
        """A forward and backward that changes no gradient (this rank has nothing left to train
        while others do: the shards' collectives need every rank); returns the gap statistics."""
        scoring, logprobs, old, entropy = self._score(
            rollout, rows, self._video_embeds(rollout, rows), self._segment_embeds(rollout, rows)
        )
        self.manual_backward(logprobs.sum() * 0.0)
        return self._gap_statistics(rollout, rows, logprobs, old, scoring, entropy)

    def _diagnostics(self, rollout: Experience, rows: list[int]) -> dict[str, torch.Tensor]:
        scoring, logprobs, old, entropy = self._score(
            rollout, rows, list(rollout.video_embeds()), rollout.segment_embeds(rows)
        )
        return self._gap_statistics(rollout, rows, logprobs, old, scoring, entropy)

    def _optimizer_update(self, optimizer: Any, scheduler: Any, totals: dict[str, torch.Tensor]) -> None:
        # Stepped even when no row trained (no gradients: the weights stay), so that
        # global_step, the schedule and max_steps keep counting updates.
        params = [p for p in self.parameters() if p.grad is not None]
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
        # Gradients were reduced over the ranks in backward (sharded: the norm of the shards is
        # combined), so every rank sees the same norm and the whole batch's loss, and skips together.
        grad_norm = full_tensor(grad_norm)
        loss = self.sum_over_data(totals.get("loss", torch.zeros(())))
        if not (torch.isfinite(grad_norm) and torch.isfinite(loss)):
            optimizer.zero_grad(set_to_none=True)
            self.skip_nonfinite_update("gradient norm" if torch.isfinite(loss) else "loss")
            return  # no optimizer or schedule step: global_step counts applied updates only
        self.note_finite_update()
        merge_stats(totals, {"grad_norm": grad_norm.detach()})
        if self.hparams.max_grad_norm is not None and params:
            # With the norm just measured (the one clip_grad_norm_ would compute again).
            torch.nn.utils.clip_grads_with_norm_(params, self.hparams.max_grad_norm, grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()

    def _log_step(self, totals: dict[str, torch.Tensor], rows: int) -> float:
        """Statistics averaged over the step's updates (token-weighted within an update), over the
        whole batch when the model is sharded (each rank holds its share). Returns the step's mean
        trainer-engine gap."""
        zero = torch.zeros(())
        if self.data_parallel_group is not None:
            totals = self._combine_over_data(totals)
        updates = self.hparams.num_iterations
        tokens = totals.get("tokens", zero).clamp(min=1)
        for name in ("clip_fraction", "dual_clip_fraction", "ratio_mean", "approx_kl", "ref_kl"):
            self.log(f"train/{name}", totals.get(name, zero) / tokens, batch_size=rows)
        for name in ("pg_loss", "kl_loss", "grad_norm"):
            self.log(f"train/{name}", totals.get(name, zero) / updates, batch_size=rows)
        self.log("train/loss", totals.get("loss", zero) / updates, prog_bar=True, batch_size=rows)
        sampled = totals.get("sampled_tokens", zero).clamp(min=1)
        mean_gap = totals.get("gap_sum", zero) / sampled
        self.log("rollout/logprob_diff_mean", mean_gap, batch_size=rows)
        self.log("rollout/logprob_diff_max", totals.get("gap_max", zero), batch_size=rows)
        self.log("rollout/sequence_logprob_diff_max", totals.get("sequence_gap_max", zero), batch_size=rows)
        for name in GAP_TAIL_STATISTICS:  # the share of tokens whose gap exceeds each threshold
            threshold = name.removeprefix("gap_over_")
            share = totals.get(name, zero) / sampled
            self.log(f"rollout/logprob_diff_over_{threshold}", share, batch_size=rows)
        for label in self.frame_buckets.labels:
            bucket_tokens = totals.get(f"sampled_tokens@{label}", zero)
            if bucket_tokens > 0:
                gap = totals[f"gap_sum@{label}"] / bucket_tokens
                self.log(f"rollout/logprob_diff_mean@{label}", gap, batch_size=rows)
        if self.correction is not None:
            weighted = totals.get("is_tokens", zero).clamp(min=1)
            for name in ("weight", "raw_weight"):
                mean = totals.get(f"is_{name}_sum", zero) / weighted
                self.log(f"correction/{name}_mean", mean, batch_size=rows)
            self.log("correction/weight_max", totals.get("is_weight_max", zero), batch_size=rows)
            for kind in ("masked", "truncated"):
                share = totals.get(f"is_{kind}_tokens", zero) / weighted
                self.log(f"correction/{kind}_fraction", share, batch_size=rows)
        self.log("train/entropy", totals.get("entropy_sum", zero) / sampled, batch_size=rows)
        self.log("train/lr", self.trainer.optimizers[0].param_groups[0]["lr"], batch_size=rows)
        return float(mean_gap)

    def _combine_over_data(self, totals: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The step's statistics of every data-parallel rank combined: one sum and one max (the same
        names on every rank, in the same order; a rank that trained nothing has fewer)."""
        zero = torch.zeros(())
        summed_names = (*SUMMED_STATISTICS, *self.frame_buckets.statistic_names())
        summed = torch.stack([totals.get(name, zero).detach().float().cpu() for name in summed_names])
        combined = dict(zip(summed_names, self.sum_over_data(summed.to(self.device)), strict=True))
        largest = torch.stack([totals.get(name, zero).detach().float().cpu() for name in MAX_STATISTICS])
        largest = largest.to(self.device)
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=self.data_parallel_group)
        combined |= dict(zip(MAX_STATISTICS, largest, strict=True))
        combined["grad_norm"] = totals.get("grad_norm", zero)  # already the same on every rank
        return combined


class LogprobGapTooLarge(SafeStop):
    """The trainer-engine log-prob gap stayed above ``max_logprob_gap`` for ``max_gap_steps`` steps."""


SUMMED_STATISTICS = (
    "clip_fraction",
    "dual_clip_fraction",
    "ratio_mean",
    "approx_kl",
    "ref_kl",
    "tokens",
    "pg_loss",
    "kl_loss",
    "loss",
    "sampled_tokens",
    "gap_sum",
    "entropy_sum",
    *GAP_TAIL_STATISTICS,
    *CORRECTION_STATISTICS,
)
"""Step statistics that add up over data-parallel ranks (token-weighted sums and loss shares)."""

MAX_STATISTICS = ("gap_max", "sequence_gap_max", "is_weight_max")
"""Step statistics combined over data-parallel ranks by their maximum."""
assert all(is_max_statistic(name) for name in MAX_STATISTICS)


def rows_that_train(advantages: torch.Tensor, row_mask: torch.Tensor, kl_coef: float) -> list[int]:
    """Rows whose policy pass can change the update.

    A row filtered out (``row_mask`` 0) has no valid token. A row whose advantage is 0 (on
    every token, for per-token ``advantages``) adds exactly 0 to the policy-gradient term
    (every per-token loss is a multiple of A), so without a KL term its forward and backward
    are skipped; the loss normalisers still count its tokens, so the update is unchanged. With
    a KL term every unfiltered row trains.
    """
    keep = row_mask > 0
    if kl_coef == 0.0:
        keep &= (advantages != 0).reshape(len(keep), -1).any(dim=-1)
    return keep.nonzero().flatten().tolist()


def micro_batches(rows: list[int], micro_batch_rows: int | None) -> list[list[int]]:
    """``rows`` cut into consecutive runs of at most ``micro_batch_rows`` (all in one when None)."""
    size = micro_batch_rows or max(1, len(rows))
    return [rows[start : start + size] for start in range(0, len(rows), size)]


def loss_normalizers(
    mask: torch.Tensor, aggregation: str, total: Callable[[torch.Tensor], torch.Tensor] = lambda count: count
) -> dict[str, float]:
    """Whole-rollout token or sequence count, so micro-batch losses add up to the full-batch loss.

    ``total`` sums a count over the data-parallel ranks (sharded training), so that each rank's
    loss is its share of the whole batch's.
    """
    if aggregation == "token_mean":
        return {"token_count_normalizer": float(total(mask.bool().sum().float()))}
    return {"seq_count_normalizer": float(total((mask.bool().sum(dim=-1) > 0).sum().float()))}
