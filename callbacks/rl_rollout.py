"""The RL rollout callback: before each training step, turn a batch of prompts into scored rollouts.

For each prompt of the batch: encode its video **once** (vision tower), sample G completions
from the rollout engine fed the cached embeddings, score them with the configured rewards,
compute group advantages, and hand everything to the module as ``batch["rollout"]``. After
the optimizer step the new weights are pushed to the engine.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback

from callbacks.checkpoint import rng_states, set_rng_states
from models.failures import RolloutFailed
from models.grpo import GRPOModule, RolloutBatch
from models.logprobs import build_scoring_batch
from models.rl.advantages import ADVANTAGE_ESTIMATORS, zero_variance_rows
from models.vision import encode_videos
from parallel.encoding import encode_videos_sequence_parallel
from parallel.shard import SequenceShard
from rewards.combine import RewardBreakdown, RewardSpec, compute_rewards, default_reward_specs
from rewards.parsing import follows_format, response_choice
from rewards.registry import SAMPLE_FIELDS
from rollout.base import (
    Completion,
    RolloutRequest,
    RolloutResult,
    SamplingConfig,
    VideoEmbedding,
    collapse_video_placeholders,
)

log = logging.getLogger(__name__)


class RolloutCallback(Callback):
    """Generates, scores and prepares G rollouts per prompt before every training step.

    Args:
        engine: ``vllm`` (colocated vLLM, the default) or ``transformers`` (no vLLM needed; slow).
        num_generations: G, completions per prompt.
        temperature: sampling temperature.
        top_p: nucleus sampling mass.
        max_new_tokens: generation budget per completion.
        rewards: reward functions and weights; default 0.9 * accuracy + 0.1 * format.
        advantage: ``grpo`` (mean/std per group), ``dr_grpo`` (mean only) or ``rloo``.
        filter_zero_variance: drop groups whose rewards are all equal (DAPO's dynamic sampling).
        vllm_dtype: dtype of the vLLM engine.
        vllm_max_model_len: longest prompt + completion for vLLM.
        vllm_gpu_memory_utilization: GPU share for vLLM (GPU only).
        log_samples_every_n_steps: write sampled completions with their rewards (JSONL in the
            run folder, and a wandb table when wandb logs) every N steps; 0 disables.
        seed: base sampling seed (step-dependent), None for nondeterministic sampling.
        rollout_timeout_s: a rollout that takes longer stops the run with a checkpoint (an
            in-process engine that hangs cannot be recovered in place); None: no limit.

    An engine that fails during a rollout (an exception: a crashed worker, a lost device) is
    shut down, started again with the current weights, and the step's rollout retried once; a
    second failure stops the run with a checkpoint (:class:`~models.failures.RolloutFailed`).
    """

    def __init__(
        self,
        engine: str = "vllm",
        num_generations: int = 8,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        rewards: list[RewardSpec] | None = None,
        advantage: str = "grpo",
        filter_zero_variance: bool = False,
        vllm_dtype: str = "float32",
        vllm_max_model_len: int = 4096,
        vllm_gpu_memory_utilization: float = 0.4,
        log_samples_every_n_steps: int = 10,
        seed: int | None = 0,
        rollout_timeout_s: float | None = None,
    ) -> None:
        if engine not in ("vllm", "transformers"):
            raise ValueError(f"engine must be 'vllm' or 'transformers', got {engine!r}")
        if advantage not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage must be one of {sorted(ADVANTAGE_ESTIMATORS)}, got {advantage!r}")
        self.engine_name = engine
        self.sampling = SamplingConfig(num_generations, temperature, top_p, max_new_tokens, seed)
        self.reward_specs = list(rewards) if rewards else default_reward_specs()
        self.advantage = advantage
        self.filter_zero_variance = filter_zero_variance
        self.vllm_kwargs = {
            "dtype": vllm_dtype,
            "max_model_len": vllm_max_model_len,
            "gpu_memory_utilization": vllm_gpu_memory_utilization,
        }
        self.log_samples_every_n_steps = log_samples_every_n_steps
        if rollout_timeout_s is not None and rollout_timeout_s <= 0:
            raise ValueError(f"rollout_timeout_s={rollout_timeout_s} must be positive or null")
        self.rollout_timeout_s = rollout_timeout_s
        self.engine_restarts = 0
        """Engines restarted after a failed rollout (logged as ``rollout/engine_restarts``)."""
        self.engine: Any = None
        self._train_started = time.perf_counter()
        self.vision_calls = 0
        """Vision-tower encodings so far (one per prompt per step; the tests count them)."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not isinstance(pl_module, GRPOModule):
            raise TypeError(f"RolloutCallback drives a GRPOModule, got {type(pl_module).__name__}")
        if not pl_module.hparams.freeze_vision:
            log.warning(
                "the vision tower is trainable: the policy pass re-encodes videos with grad each step"
            )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A resumed run's weights differ from model_path: sync before the first rollout. (The
        # checkpoint's weights are already loaded here, but its global step is restored only
        # after on_fit_start, so the step cannot tell a resume; the sync costs one weight push.)
        self._start_engine(pl_module, sync_weights=trainer.ckpt_path is not None)

    def _start_engine(self, pl_module: L.LightningModule, *, sync_weights: bool) -> None:
        if self.engine_name == "vllm":
            from rollout.vllm_engine import VLLMEngine

            # An in-process vLLM engine seeds the global RNGs when it starts; keep the trainer's
            # (restored from the checkpoint on a resume).
            trainer_rng = rng_states()
            self.engine = VLLMEngine(str(pl_module.hparams.model_path), **self.vllm_kwargs)
            set_rng_states(trainer_rng)
            if sync_weights:
                self.engine.update_weights(pl_module.model.state_dict().items())
        else:
            from rollout.hf_engine import TransformersEngine

            self.engine = TransformersEngine(pl_module.model, pl_module.processor.tokenizer)

    def _restart_engine(self, pl_module: L.LightningModule) -> None:
        old, self.engine = self.engine, None
        shutdown = getattr(old, "shutdown", None)
        if shutdown is not None:
            try:
                shutdown()
            except Exception as error:  # it has failed already; only its resources matter now
                log.warning("shutting the failed engine down raised %s: %s", type(error).__name__, error)
        del old
        gc.collect()
        self._start_engine(pl_module, sync_weights=True)
        self.engine_restarts += 1

    def _generate_once(self, requests: list[RolloutRequest], sampling: SamplingConfig, shard: Any) -> list:
        if self.rollout_timeout_s is None:
            return self._generate(requests, sampling, shard)
        # A daemon thread, so that a hung engine cannot keep the process from exiting.
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["results"] = self._generate(requests, sampling, shard)
            except BaseException as error:  # handed to the training thread
                outcome["error"] = error

        thread = threading.Thread(target=run, name="rollout", daemon=True)
        thread.start()
        thread.join(self.rollout_timeout_s)
        if thread.is_alive():
            raise RolloutFailed(
                f"the rollout engine did not answer within rollout_timeout_s={self.rollout_timeout_s} s; "
                "an in-process engine that hangs cannot be recovered in place"
            )
        if "error" in outcome:
            raise outcome["error"]
        return outcome["results"]

    def _generate_with_restart(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        requests: list[RolloutRequest],
        sampling: SamplingConfig,
        shard: Any,
    ) -> list:
        try:
            return self._generate_once(requests, sampling, shard)
        except RolloutFailed:
            raise
        except Exception as error:
            log.error(
                "step %d: the rollout engine failed (%s: %s); restarting it and retrying the rollout",
                trainer.global_step,
                type(error).__name__,
                error,
            )
            self._restart_engine(pl_module)
            try:
                return self._generate_once(requests, sampling, shard)
            except Exception as again:
                raise RolloutFailed(
                    f"the rollout engine failed again after a restart at step {trainer.global_step}: "
                    f"{type(again).__name__}: {again}"
                ) from again

    # -- before the step: rollouts ------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert isinstance(pl_module, GRPOModule) and pl_module.model is not None
        tokenizer = pl_module.processor.tokenizer
        video_token_id = tokenizer.convert_tokens_to_ids("<|video_pad|>")
        started = time.perf_counter()
        shard = pl_module.sequence_shard
        with torch.no_grad():
            if shard is None:
                encoded = encode_videos(
                    pl_module.model, batch["pixel_values_videos"], batch["video_grid_thw"]
                )
            else:  # MR-SP stage 1: the group shares out the frames, then all hold every embedding
                encoded = encode_videos_sequence_parallel(
                    pl_module.model, batch["pixel_values_videos"], batch["video_grid_thw"], shard.group
                )
        self.vision_calls += len(encoded)
        videos = [
            VideoEmbedding(e, batch["video_grid_thw"][i], float(batch["second_per_grid_ts"][i]))
            for i, e in enumerate(encoded)
        ]
        requests = []
        for row, video in enumerate(videos):
            valid = batch["prompt_attention_mask"][row].bool()
            prompt = batch["prompt_input_ids"][row][valid].tolist()
            requests.append(RolloutRequest(collapse_video_placeholders(prompt, video_token_id), video))
        step_seed = None if self.sampling.seed is None else self.sampling.seed + 1000 * trainer.global_step
        sampling = dataclasses.replace(self.sampling, seed=step_seed)
        self.engine.wake()
        results = self._generate_with_restart(trainer, pl_module, requests, sampling, shard)
        self.engine.sleep()
        rollout_time = time.perf_counter() - started

        g = sampling.n
        meta = [m for m in batch["meta"] for _ in range(g)]
        completions = [c for r in results for c in r.completions]
        texts = [c.text for c in completions]
        fields = {name: [m[name] for m in meta] for name in SAMPLE_FIELDS}
        breakdown = compute_rewards(self.reward_specs, texts, fields)
        rewards = torch.tensor(breakdown.total, dtype=torch.float32)
        advantages = ADVANTAGE_ESTIMATORS[self.advantage](rewards, g)
        flat_rows = zero_variance_rows(rewards, g)
        row_mask = (~flat_rows).float() if self.filter_zero_variance else torch.ones_like(rewards)

        scoring = build_scoring_batch(
            [r.prompt_ids for r in results for _ in range(g)],
            [c.token_ids for c in completions],
            [v for v in videos for _ in range(g)],
            video_token_id=video_token_id,
            pad_token_id=tokenizer.pad_token_id,
            spatial_merge_size=int(pl_module.model.config.vision_config.spatial_merge_size),
            tokens_per_second=float(pl_module.model.config.vision_config.tokens_per_second),
        )
        old = torch.zeros(scoring.completion_mask.shape)
        for i, completion in enumerate(completions):
            old[i, : len(completion.logprobs)] = torch.tensor(completion.logprobs)
        batch["rollout"] = RolloutBatch(
            scoring, [v.embeds for v in videos for _ in range(g)], old, advantages, row_mask, g
        )
        self._log_rollout(pl_module, breakdown, texts, fields, completions, flat_rows, rollout_time)
        if self.log_samples_every_n_steps and trainer.global_step % self.log_samples_every_n_steps == 0:
            self._write_samples(trainer, meta, texts, breakdown.total)
        self._train_started = time.perf_counter()

    def _generate(
        self, requests: list[RolloutRequest], sampling: SamplingConfig, shard: SequenceShard | None
    ) -> list[RolloutResult]:
        """The engine's completions; sequence-parallel peers (same prompts) each sample a share
        of the prompts and exchange results, so all train on the same rollouts."""
        if shard is None:
            return self.engine.generate(requests, sampling)
        size, rank = shard.size, shard.rank
        mine = requests[rank::size]
        local = self.engine.generate(mine, sampling) if mine else []
        shares: list[list[RolloutResult]] = [[] for _ in range(size)]
        dist.all_gather_object(shares, local, group=shard.group)
        results: list[RolloutResult] = [None] * len(requests)  # type: ignore[list-item]
        for peer, share in enumerate(shares):
            results[peer::size] = share
        return results

    def _log_rollout(
        self,
        pl_module: L.LightningModule,
        breakdown: RewardBreakdown,
        texts: list[str],
        fields: dict[str, list[Any]],
        completions: list[Completion],
        flat_rows: torch.Tensor,
        rollout_time: float,
    ) -> None:
        n = len(texts)
        for name, values in breakdown.per_function.items():
            tensor = torch.tensor(values)
            pl_module.log(f"reward/{name}_mean", tensor.mean(), batch_size=n)
            pl_module.log(f"reward/{name}_std", tensor.std(unbiased=False), batch_size=n)
        total = torch.tensor(breakdown.total)
        pl_module.log("reward/total_mean", total.mean(), prog_bar=True, batch_size=n)
        correct = [
            float(response_choice(t, len(o) or 4, o) == a)
            for t, o, a in zip(texts, fields["options"], fields["answer"], strict=True)
        ]
        pl_module.log("rollout/accuracy", sum(correct) / n, prog_bar=True, batch_size=n)
        pl_module.log("rollout/engine_restarts", float(self.engine_restarts), batch_size=n)
        pl_module.log("rollout/format_rate", sum(follows_format(t) for t in texts) / n, batch_size=n)
        lengths = torch.tensor([len(c.token_ids) for c in completions], dtype=torch.float32)
        pl_module.log("rollout/response_length_mean", lengths.mean(), batch_size=n)
        pl_module.log("rollout/response_length_max", lengths.max(), batch_size=n)
        pl_module.log("rollout/zero_variance_group_fraction", flat_rows.float().mean(), batch_size=n)
        pl_module.log("time/rollout_s", rollout_time, batch_size=n)

    def _write_samples(
        self, trainer: L.Trainer, meta: list[dict[str, Any]], texts: list[str], rewards: list[float]
    ) -> None:
        if not trainer.is_global_zero:
            return
        path = Path(trainer.default_root_dir) / "rollout_samples.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            {
                "step": trainer.global_step,
                "key": m["key"],
                "answer": m["answer"],
                "completion": t,
                "reward": r,
            }
            for m, t, r in zip(meta, texts, rewards, strict=True)
        ]
        with path.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        for logger in trainer.loggers:
            log_table = getattr(logger, "log_table", None)
            if callable(log_table):
                log_table(
                    key="rollout/samples",
                    columns=["step", "key", "answer", "completion", "reward"],
                    data=[list(r.values()) for r in rows],
                )

    # -- after the step: weight sync ----------------------------------------------------------
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        started = time.perf_counter()
        pl_module.log("time/train_s", started - self._train_started, batch_size=1)
        assert isinstance(pl_module, GRPOModule) and pl_module.model is not None
        self.engine.update_weights(pl_module.model.state_dict().items())
        pl_module.log("time/weight_sync_s", time.perf_counter() - started, batch_size=1)
