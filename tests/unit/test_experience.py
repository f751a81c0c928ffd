"""Producing experience without a Trainer: collect_rollouts, the engine supervisor, the settings fit."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from helpers.recording_engines import FlakyEngine
from helpers.scoring_helpers import prompt_batch
from helpers.tolerances import FORWARD_ULPS, assert_float32_close, assert_identical
from transformers import AutoProcessor

from core.failures import RolloutFailed, StoppedBySignal
from core.layout import pad_rows
from models.loading import load_model
from models.logprobs import completion_logprobs
from models.vision import encode_videos
from rewards.combine import RewardSpec
from rollout.advantages import grpo_advantages
from rollout.base import PolicyHandle, SamplingConfig
from rollout.experience import ExperienceSettings, RolloutConsumer, collect_rollouts, settings_problem
from rollout.hf_engine import TransformersEngine
from rollout.supervision import EngineSupervisor
from rollout.worker import RolloutWorker


def test_collect_rollouts_lays_out_what_the_engine_sampled(tiny_model_dir: Path, synth_dir: Path) -> None:
    model = load_model(tiny_model_dir).eval()
    tokenizer = AutoProcessor.from_pretrained(tiny_model_dir).tokenizer
    prompts = prompt_batch(tiny_model_dir, synth_dir)
    engine = TransformersEngine.for_model(model, tokenizer)
    settings = ExperienceSettings(
        SamplingConfig(n=3, temperature=1.0, max_new_tokens=6, seed=4), (RewardSpec("format", 1.0),)
    )
    encodings: list[int] = []

    def encode(pixels: torch.Tensor, grids: torch.Tensor) -> list[torch.Tensor]:
        encodings.append(len(grids))
        return encode_videos(model, pixels, grids)

    rollouts = collect_rollouts(
        prompts, encode, engine.generate, settings, step=2, pad_token_id=tokenizer.pad_token_id
    )
    assert encodings == [2]  # each video encoded once, for all six completions
    assert len(rollouts) == 6 and rollouts.group_size == 3
    assert rollouts.scoring.prompt_of_row == [0, 0, 0, 1, 1, 1]
    for row, completion in enumerate(rollouts.completions):
        layout = prompts.layouts[row // 3]
        n = len(completion.token_ids)
        assert rollouts.scoring.input_ids[row, : len(layout)].tolist() == layout.token_ids.tolist()
        assert rollouts.scoring.input_ids[row, len(layout) : len(layout) + n].tolist() == completion.token_ids
    assert_identical(
        rollouts.old_logprobs,
        pad_rows([c.logprobs for c in rollouts.completions], torch.float32)[0],
        reason="engine log-probs, padded",
    )
    rewards = torch.tensor(rollouts.rewards.total)
    assert_identical(rollouts.advantages, grpo_advantages(rewards, 3), reason="advantages of the rewards")
    # The step seeds the sampling: the same step samples the same completions.
    again = collect_rollouts(
        prompts, encode, engine.generate, settings, step=2, pad_token_id=tokenizer.pad_token_id
    )
    assert [c.token_ids for c in again.completions] == [c.token_ids for c in rollouts.completions]
    # The trainer scores the laid-out rows as the engine sampled them.
    with torch.no_grad():
        scored = completion_logprobs(model, rollouts.scoring, rollouts.video_embeds())
    valid = rollouts.scoring.completion_mask.bool()
    assert_float32_close(
        scored[valid],
        rollouts.old_logprobs[valid],
        ulps=FORWARD_ULPS,
        scale=float(torch.log(torch.tensor(float(model.config.text_config.vocab_size)))),
        reason="trainer vs transformers engine on the collected rows",
    )


def supervised(
    engine: FlakyEngine, timeout_s: float | None = None, stop_requested: bool = False
) -> EngineSupervisor:
    supervisor = EngineSupervisor(
        engine,
        policy=lambda: PolicyHandle("policy-dir", torch.nn.Linear(1, 1), None),
        weights=lambda: [("w", torch.zeros(1))],
        timeout_s=timeout_s,
        stop_requested=lambda: stop_requested,
    )
    supervisor.start(sync_weights=False)
    return supervisor


def test_a_failed_engine_is_restarted_with_the_weights_and_the_rollout_retried() -> None:
    engine = FlakyEngine(fail=1)
    supervisor = supervised(engine)
    results = supervisor.run(lambda e: e.generate([], SamplingConfig(n=2)), step=7)
    assert results == [] and supervisor.restarts == 1
    assert engine.starts == ["policy-dir", "policy-dir"] and engine.pushed == [["w"]]


def test_a_rollout_failing_after_a_stop_signal_is_not_retried() -> None:
    engine = FlakyEngine(fail=1)
    supervisor = supervised(engine, stop_requested=True)
    rollout = lambda e: e.generate([], SamplingConfig(n=2))  # noqa: E731
    with pytest.raises(StoppedBySignal, match=r"step 4 failed after a stop signal \(ConnectionError"):
        supervisor.run(rollout, step=4)
    assert supervisor.restarts == 0 and engine.starts == ["policy-dir"] and engine.pushed == []
    # A stop signal with an engine that answers: the rollout is returned as usual.
    assert supervised(FlakyEngine(), stop_requested=True).run(rollout, step=5) == []


def test_a_sync_before_the_next_rollout_is_supervised_with_it() -> None:
    # A resumed run's first sync (the checkpoint's weights) runs with the first rollout: the
    # weights are pushed before it samples ...
    rollout = lambda e: e.generate([], SamplingConfig(n=2))  # noqa: E731
    engine = FlakyEngine()
    supervisor = supervised(engine)
    supervisor.sync_before_next_rollout()
    assert supervisor.run(rollout, step=2) == [] and engine.pushed == [["w"]]
    assert supervisor.run(rollout, step=3) == [] and engine.pushed == [["w"]]  # once
    # ... an engine that fails while loading them is restarted and the rollout retried ...
    engine = FlakyEngine(fail_sync=1)
    supervisor = supervised(engine)
    supervisor.sync_before_next_rollout()
    assert supervisor.run(rollout, step=2) == [] and supervisor.restarts == 1
    assert engine.starts == ["policy-dir", "policy-dir"] and engine.pushed == [["w"]]
    # ... and after a stop signal it stops the run, not retried.
    engine = FlakyEngine(fail_sync=1)
    supervisor = supervised(engine, stop_requested=True)
    supervisor.sync_before_next_rollout()
    with pytest.raises(StoppedBySignal, match=r"step 2 failed after a stop signal \(ConnectionError"):
        supervisor.run(rollout, step=2)
    assert supervisor.restarts == 0 and engine.starts == ["policy-dir"]


def test_a_second_failure_or_a_hang_stops_with_rollout_failed() -> None:
    supervisor = supervised(FlakyEngine(fail=2))
    with pytest.raises(RolloutFailed, match="failed again after a restart at step 3"):
        supervisor.run(lambda e: e.generate([], SamplingConfig(n=2)), step=3)
    hung = supervised(FlakyEngine(hang_s=5.0), timeout_s=0.2)
    started = time.perf_counter()
    with pytest.raises(RolloutFailed, match="did not answer within"):
        hung.run(lambda e: e.generate([], SamplingConfig(n=2)), step=0)
    assert time.perf_counter() - started < 2.0


def test_settings_that_cannot_work_are_refused_at_once(tiny_model_dir: Path) -> None:
    from models.grpo import GRPOModule
    from rollout.vllm_engine import VLLMEngine

    assert settings_problem("grpo", 1) is not None and settings_problem("rloo", 2) is None
    with pytest.raises(ValueError, match="num_generations=1"):
        ExperienceSettings(SamplingConfig(n=1))
    module = GRPOModule(str(tiny_model_dir), dtype="float32")
    module.check_experience(2, VLLMEngine(dtype="float32").dtype)
    module.check_experience(2, TransformersEngine().dtype)
    with pytest.raises(
        ValueError, match=r"samples in bfloat16 but the policy scores in float32(.|\n)*rollout_correction"
    ):
        module.check_experience(2, VLLMEngine(dtype="bfloat16").dtype)
    # Rollout correction is what makes a lower-precision engine usable.
    corrected = GRPOModule(str(tiny_model_dir), dtype="float32", rollout_correction={"mode": "truncate"})
    corrected.check_experience(2, VLLMEngine(dtype="bfloat16").dtype)


def test_a_rollout_batch_has_everything_the_policy_update_reads() -> None:
    # models.rl.experience states what GRPOModule reads as protocols (models does not import
    # rollout); the producer's dataclasses must keep every member of them.
    import dataclasses

    from models.rl.experience import Experience, ExperiencePrompts
    from rollout.experience import PromptBatch, RolloutBatch

    for protocol, producer in ((Experience, RolloutBatch), (ExperiencePrompts, PromptBatch)):
        fields = {field.name for field in dataclasses.fields(producer)}
        methods = {name for name, value in vars(protocol).items() if callable(value) and name[0] != "_"}
        assert set(protocol.__annotations__) <= fields, protocol
        assert all(callable(getattr(producer, name, None)) for name in methods), protocol
    assert {"segment_embeds", "segment_inputs", "video_embeds"} <= set(vars(Experience))


class SleepRecordingEngine(TransformersEngine):
    """The transformers engine, recording its sleeps and wakes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def sleep(self) -> None:
        self.calls.append("sleep")

    def wake(self) -> None:
        self.calls.append("wake")


class TinyConsumer:
    """What a RolloutWorker needs of a module, around the tiny model (no Trainer, no Lightning)."""

    sequence_shard = None
    trains_vision = False
    EXPERIENCE = "experience"

    def __init__(self, model_dir: Path) -> None:
        self.model_path = str(model_dir)
        self.model = load_model(model_dir).eval()
        self.processor = AutoProcessor.from_pretrained(model_dir)

    def gathered_model(self) -> nullcontext[torch.nn.Module]:
        return nullcontext(self.model)

    def encode_videos(self, pixels: torch.Tensor, grids: torch.Tensor) -> list[torch.Tensor]:
        return encode_videos(self.model, pixels, grids)

    def check_experience(
        self, group_size: int, engine_dtype: torch.dtype | None, episodes: bool = False
    ) -> None:
        pass


def test_a_rollout_worker_runs_a_step_in_named_methods_without_a_trainer(
    tiny_model_dir: Path, synth_dir: Path
) -> None:
    module = TinyConsumer(tiny_model_dir)
    assert isinstance(module, RolloutConsumer)
    engine = SleepRecordingEngine()
    supervisor = EngineSupervisor(engine, policy=lambda: PolicyHandle.of(module), weights=lambda: [])
    settings = ExperienceSettings(
        SamplingConfig(n=3, temperature=1.0, max_new_tokens=6, seed=4), (RewardSpec("format", 1.0),)
    )
    worker = RolloutWorker(module, supervisor, settings)
    worker.start()
    worker.step = 2
    prompts = prompt_batch(tiny_model_dir, synth_dir)
    rollouts, rounds, report = worker.select(prompts, draw=lambda: None, everywhere=lambda flag: flag)
    assert rounds == [rollouts] and report is None and worker.vision_calls == 2
    # The same step's rollouts as collect_rollouts makes them with the engine itself.
    direct = collect_rollouts(
        prompts,
        module.encode_videos,
        engine.generate,
        settings,
        step=2,
        pad_token_id=module.processor.tokenizer.pad_token_id,
    )
    assert [c.token_ids for c in rollouts.completions] == [c.token_ids for c in direct.completions]
    assert_identical(rollouts.advantages, direct.advantages, reason="same rewards, same advantages")
    assert engine.calls == []
    batch: dict[str, object] = {"meta": []}
    worker.hand_over(rollouts, batch)
    assert batch["experience"] is rollouts and engine.calls == ["sleep"]
    assert worker.sync().parameters == 0 and engine.calls == ["sleep", "wake"]  # samples with the policy
