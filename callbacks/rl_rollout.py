"""The RL rollout callback: the Lightning side of producing experience.

Before each training step it asks its :class:`~rollout.worker.RolloutWorker` for the step's
scored rollouts (videos encoded once, G completions per prompt from the engine, rewards,
advantages), which the worker hands over in the step's training batch, for the module (a
:class:`~rollout.experience.RolloutConsumer`) to learn from; after the optimizer step the worker streams the
trainable weights into the engine in bounded buckets (:mod:`rollout.weight_sync`). The engine is
kept answering by :class:`~rollout.supervision.EngineSupervisor`. The callback checks the setup
against the trainer and the data, logs, and writes samples; the worker, which tests drive
without a Trainer, does the work.

A colocated engine shares the device with training, so it sleeps while the trainer trains.
The engine calls of one training step, in order::

    on_train_batch_start: generate (the engine is awake), sleep
    [forward, backward, optimizer step]
    on_train_batch_end:   wake, update_weights x buckets, finish_weight_update

Weights are loaded into an awake engine (vLLM's sleep level 1 has moved them to CPU memory and
dropped the KV cache); the engine stays awake into the next step's rollout, so each step wakes
and sleeps it once. ``start`` (and a restart) leaves it awake.

On CUDA each step also logs its phases' peak allocated memory (:mod:`callbacks.device_memory`):
``memory/rollout_peak_gib`` (the rollout, the engine's own reservation aside),
``memory/train_peak_gib`` (scoring, backward and optimizer step) and ``memory/held_gib`` (what
stays allocated after the update), the figures ``lvrl plan`` predicts.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from callbacks.device_memory import PhasePeaks
from callbacks.engine_admission import rollout_shape
from core.settings import settings_block
from core.tool_use.requests import FrameBudget
from families import family_of
from models.lora import engine_weights
from rewards.combine import RewardSpec, default_reward_specs
from rollout.base import PolicyHandle, RolloutEngine, SamplingConfig
from rollout.experience import (
    ExperienceSettings,
    PromptBatch,
    RolloutBatch,
    RolloutConsumer,
    rollout_metrics,
    sample_records,
)
from rollout.refill import DynamicSampling, RefillReport
from rollout.shaping import OverlongShaping
from rollout.supervision import EngineSupervisor
from rollout.weight_sync import DEFAULT_BUCKET_MB, MIB
from rollout.worker import RolloutWorker

log = logging.getLogger(__name__)

PROGRESS_BAR_METRICS = ("reward/total_mean", "rollout/accuracy")
BASE_DATAMODULE_HOOK = L.LightningDataModule.on_before_batch_transfer


class RolloutCallback(Callback):
    """Generates, scores and prepares G rollouts per prompt before every training step.

    Settings of *how experience is produced*; how it is learned from is the module's.

    Args:
        engine: the rollout engine, by ``class_path`` with its own ``init_args``:
            :class:`rollout.vllm_engine.VLLMEngine` (colocated vLLM, the default) or
            :class:`rollout.hf_engine.TransformersEngine` (no vLLM needed; slow).
        num_generations: G, completions per prompt.
        temperature: sampling temperature.
        top_p: nucleus sampling mass.
        max_new_tokens: generation budget per completion.
        rewards: reward functions and weights; default 0.9 * accuracy + 0.1 * format.
        advantage: ``grpo`` (mean/std per group), ``dr_grpo`` (mean only) or ``rloo``.
        filter_zero_variance: drop groups whose rewards are all equal (they have no signal; the
            step trains on fewer groups).
        dynamic_sampling: keep the step's number of informative groups instead, by sampling more
            prompts (DAPO's dynamic sampling, :mod:`rollout.refill`): ``{groups, max_rounds}``
            (defaults: the batch size, 3 rounds); logged under ``sampling/``. null: off.
        overlong: DAPO's soft overlong penalty, ``{buffer, penalty}`` (:mod:`rollout.shaping`):
            a completion longer than ``max_new_tokens - buffer`` loses up to ``penalty`` of
            reward, linearly to the budget (a tool-use episode: its longest turn, each turn having
            the budget); logged as ``reward/overlong_mean``. null: off.
        mask_truncated: completions that ran out of ``max_new_tokens`` do not train (their
            group's advantages still count them); ``rollout/truncated_fraction`` is logged
            either way.
        log_samples_every_n_steps: write sampled completions with their rewards (JSONL in the
            run folder, and a wandb table when wandb logs) every N steps; 0 disables.
        seed: base sampling seed (step-dependent), None for nondeterministic sampling.
        rollout_timeout_s: a rollout that takes longer stops the run with a checkpoint (an
            in-process engine that hangs cannot be recovered in place); None: no limit.
        weight_sync_bucket_mb: after each update the trainable weights are gathered (from the
            FSDP2 shards) and handed to the engine in buckets of at most this many MiB, each
            dropped before the next is gathered: the sync's extra memory per device is the
            bucket, or one engine layer when a layer alone is larger (an embedding matrix).
            Logged as ``memory/weight_sync_peak_mb``.
        tool_use: multi-turn rollouts in which the model may ask for the frames of a time span
            (:mod:`rollout.episodes`; the syntax in :mod:`core.tool_use.requests`):
            ``{max_calls, frames_per_call, frames_per_episode, default_fps}`` (defaults 3, 16,
            32, 1.0). Frames are decoded from each sample's video (``data.init_args.
            tool_use: true``) at the data's pixel budget; ``max_new_tokens`` bounds each
            turn. Logged under ``tool/`` (where the data names the stretch that holds each
            answer, also ``tool/span_hit_rate`` and ``tool/span_coverage``:
            :mod:`core.tool_use.spans`). null: single-turn rollouts.

    Guardrails (:mod:`rollout.guardrails`), always on: the engine never samples the vision
    placeholders and markers, and a completion holding another special token the chat template
    forbids does not train (counted as ``rollout/rejected_special_tokens``).

    An engine that fails during a rollout (an exception: a crashed worker, a lost device) is
    shut down, started again with the current weights, and the step's rollout retried once; a
    second failure stops the run with a checkpoint (:class:`~core.failures.RolloutFailed`).
    """

    def __init__(
        self,
        engine: RolloutEngine | None = None,
        num_generations: int = 8,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        rewards: list[RewardSpec] | None = None,
        advantage: str = "grpo",
        filter_zero_variance: bool = False,
        dynamic_sampling: dict[str, Any] | None = None,
        overlong: dict[str, Any] | None = None,
        mask_truncated: bool = False,
        log_samples_every_n_steps: int = 10,
        seed: int | None = 0,
        rollout_timeout_s: float | None = None,
        weight_sync_bucket_mb: float = DEFAULT_BUCKET_MB,
        tool_use: dict[str, Any] | None = None,
    ) -> None:
        if engine is None:
            from rollout.vllm_engine import VLLMEngine

            engine = VLLMEngine()
        if not isinstance(engine, RolloutEngine):
            raise TypeError(f"engine must be a rollout.base.RolloutEngine, got {type(engine).__name__}")
        self.settings = ExperienceSettings(
            SamplingConfig(num_generations, temperature, top_p, max_new_tokens, seed),
            tuple(rewards) if rewards else tuple(default_reward_specs()),
            advantage,
            filter_zero_variance,
            overlong=OverlongShaping.of(overlong),
            mask_truncated=mask_truncated,
            tool_use=tool_use is not None,
        )
        self.tool_budget = settings_block(FrameBudget, tool_use, "tool_use")
        self.dynamic_sampling = DynamicSampling.of(dynamic_sampling)
        self.engine = engine
        self.log_samples_every_n_steps = log_samples_every_n_steps
        self.rollout_timeout_s = rollout_timeout_s
        if weight_sync_bucket_mb <= 0:
            raise ValueError(f"weight_sync_bucket_mb={weight_sync_bucket_mb} must be positive")
        self.weight_sync_bucket_bytes = int(weight_sync_bucket_mb * MIB)
        self.worker: RolloutWorker | None = None
        """The step's rollout work (:mod:`rollout.worker`), set up per fit."""
        self._first_rollout = True
        self._train_started = time.perf_counter()

    @property
    def engine_restarts(self) -> int:
        """Engines restarted after a failed rollout (logged as ``rollout/engine_restarts``)."""
        return self.worker.supervisor.restarts if self.worker is not None else 0

    @property
    def supervisor(self) -> EngineSupervisor | None:
        """The engine's supervisor (None before setup)."""
        return self.worker.supervisor if self.worker is not None else None

    @property
    def vision_calls(self) -> int:
        """Vision-tower encodings so far (one per prompt per step; the tests count them)."""
        return self.worker.vision_calls if self.worker is not None else 0

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if not isinstance(pl_module, RolloutConsumer):
            raise TypeError(
                f"RolloutCallback hands rollouts to a module that receives them (a GRPOModule); "
                f"{type(pl_module).__name__} does not"
            )
        pl_module.check_experience(
            self.settings.group_size, self.engine.dtype, episodes=self.tool_budget is not None
        )
        if self.tool_budget is not None:
            self._check_tool_use(trainer)
        if self.dynamic_sampling is not None and not callable(
            getattr(trainer.datamodule, "draw_train_batch", None)
        ):
            raise TypeError(
                "dynamic_sampling draws more prompts from the training data, through the datamodule's "
                f"draw_train_batch(); {type(trainer.datamodule).__name__} has none (use "
                "datamodules.longvideo_reason.LongVideoReasonDataModule, or set dynamic_sampling: null)"
            )
        # Before the policy and the engine load: vLLM's limits are known from the data and the model.
        shaped = rollout_shape(
            dict(getattr(trainer.datamodule, "hparams", None) or {}),
            str(pl_module.hparams.model_path),
            self.settings.sampling.max_new_tokens,
            self.tool_budget,
        )
        if shaped is not None:
            self.engine.admit(*shaped)
        supervisor = EngineSupervisor(
            self.engine,
            policy=lambda: PolicyHandle.of(pl_module),
            weights=lambda: engine_weights(pl_module.model),
            timeout_s=self.rollout_timeout_s,
            bucket_bytes=self.weight_sync_bucket_bytes,
            stop_requested=lambda: trainer.received_sigterm,
            any_rank=lambda flag: trainer.strategy.reduce_boolean_decision(flag, all=False),
        )
        self.worker = RolloutWorker(
            pl_module, supervisor, self.settings, dynamic_sampling=self.dynamic_sampling
        )

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A resumed run's weights differ from model_path: they are pushed before the first
        # rollout, not here: a strategy that restores after its setup (the sharded one) loads
        # the checkpoint, and sets trainer.ckpt_path, only after on_fit_start.
        assert self.worker is not None
        if self.tool_budget is not None:  # the model is built by now (its family lays out replies)
            processor = trainer.datamodule.processor  # type: ignore[union-attr]
            self.worker.tool = self.worker.frames_tool(
                self.tool_budget, processor, family_of(pl_module.model.config)
            )
        self.worker.start()
        self._first_rollout = True
        self._peaks = PhasePeaks(pl_module.device)

    # -- before the step: rollouts ------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        worker = self.worker
        assert worker is not None
        if self._first_rollout:
            self._first_rollout = False
            if trainer.ckpt_path is not None:
                worker.sync_with_next_rollout()  # the checkpoint's weights, loaded by now
        worker.step = trainer.global_step
        started = time.perf_counter()
        self._peaks.begin()
        rollouts, rounds, report = worker.select(
            PromptBatch.of(batch),
            draw=lambda: self._draw_prompts(trainer, pl_module),
            everywhere=lambda flag: trainer.strategy.reduce_boolean_decision(flag, all=True),
        )
        worker.hand_over(rollouts, batch)
        self._after_rollouts(trainer, pl_module, rounds, time.perf_counter() - started, report)

    def _after_rollouts(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        rounds: list[RolloutBatch],
        seconds: float,
        report: RefillReport | None,
    ) -> None:
        """The rollout's peak memory, statistics and samples of everything sampled (not only the
        groups that train); then the update's peak is measured from what the rollout left."""
        rollout_peak = self._peaks.peak_gib()
        self._log(pl_module, rounds, seconds, report)
        if rollout_peak is not None:
            pl_module.log("memory/rollout_peak_gib", rollout_peak, batch_size=1)
        self._peaks.begin()
        step = trainer.global_step
        if self.log_samples_every_n_steps and step % self.log_samples_every_n_steps == 0:
            self._write_samples(trainer, rounds)
        self._train_started = time.perf_counter()

    def _check_tool_use(self, trainer: L.Trainer) -> None:
        """Refuse a tool-use setup that could not run, before any training."""
        assert self.tool_budget is not None
        videos = getattr(self.engine, "videos_per_prompt", None)
        if videos is not None and videos < self.tool_budget.max_calls + 1:
            raise ValueError(
                f"tool_use.max_calls={self.tool_budget.max_calls}: an episode holds up to "
                f"{self.tool_budget.max_calls + 1} videos but the engine takes {videos} per prompt; set the "
                f"engine's init_args.videos_per_prompt: {self.tool_budget.max_calls + 1}"
            )
        hparams = getattr(trainer.datamodule, "hparams", {})
        if "tool_use" in hparams and not hparams["tool_use"]:
            raise ValueError(
                "the rollouts' tool_use needs questions that offer the tool and videos to serve frames "
                "from: set data.init_args.tool_use: true"
            )

    @staticmethod
    def _draw_prompts(trainer: L.Trainer, pl_module: L.LightningModule) -> PromptBatch | None:
        """One more batch of prompts from the training stream (dynamic sampling's next round)."""
        batch = trainer.datamodule.draw_train_batch()  # type: ignore[union-attr]
        if batch is None:
            return None
        # The hooks Lightning runs on a batch it fetched for training: on_before_batch_transfer
        # (the datamodule's where it defines one, as Lightning chooses, else the module's; ours
        # counts the batch as consumed: its stream position in checkpoints), then the move to
        # the device.
        datamodule = trainer.datamodule
        datamodule_defines_it = type(datamodule).on_before_batch_transfer is not BASE_DATAMODULE_HOOK
        hooks = datamodule if datamodule_defines_it else pl_module
        batch = hooks.on_before_batch_transfer(batch, 0)  # type: ignore[union-attr]
        return PromptBatch.of(trainer.strategy.batch_to_device(batch, dataloader_idx=0))

    def _log(
        self,
        pl_module: L.LightningModule,
        rounds: list[RolloutBatch],
        rollout_time: float,
        report: RefillReport | None = None,
    ) -> None:
        n = sum(len(r) for r in rounds)
        metrics = rollout_metrics(*rounds)
        if report is not None:
            metrics.update(report.metrics())
        metrics["rollout/engine_restarts"] = float(self.engine_restarts)
        metrics["time/rollout_s"] = rollout_time
        for name, value in metrics.items():
            pl_module.log(name, value, prog_bar=name in PROGRESS_BAR_METRICS, batch_size=n)

    def _write_samples(self, trainer: L.Trainer, rounds: list[RolloutBatch]) -> None:
        if not trainer.is_global_zero:
            return
        rows = [row for rollouts in rounds for row in sample_records(rollouts, trainer.global_step)]
        path = Path(trainer.default_root_dir) / "rollout_samples.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        for logger in trainer.loggers:
            log_table = getattr(logger, "log_table", None)  # wandb's; other loggers have none
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
        train_peak, held = self._peaks.peak_gib(), self._peaks.held_gib()
        if train_peak is not None and held is not None:
            pl_module.log("memory/train_peak_gib", train_peak, batch_size=1)
            pl_module.log("memory/held_gib", held, batch_size=1)
        assert self.worker is not None
        report = self.worker.sync()
        pl_module.log("time/weight_sync_s", time.perf_counter() - started, batch_size=1)
        pl_module.log("memory/weight_sync_peak_mb", report.peak_bytes / MIB, batch_size=1)
