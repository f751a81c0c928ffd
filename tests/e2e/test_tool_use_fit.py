"""Tool-use GRPO through Lightning (in-process fits, tiny models): the rollout callback runs
episodes, the module scores their rows with the replies in place, and the run refuses setups
that cannot work.

The model here always writes ``</tool_call>`` (``helpers.biased_models``): every turn is a
request with no body, so every episode runs out of turns (served frames are covered by
``tests/unit/test_episode_runner.py`` and the engines' own tests). What is checked is the
plumbing: episodes reach the training step, the trainer's log-probs of every sampled token of
every turn equal the engine's (the logged gap is float32 rounding), and ``tool/*`` is logged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from helpers.biased_models import save_biased_model
from helpers.grpo_helpers import fit_tiny_grpo

import models.grpo
from callbacks.rl_rollout import RolloutCallback
from datamodules.longvideo_reason import LongVideoReasonDataModule
from models.grpo import GRPOModule
from rewards.combine import RewardSpec
from rewards.registry import register
from rollout.hf_engine import TransformersEngine
from rollout.vllm_engine import VLLMEngine

TOOL_USE = {"max_calls": 2, "frames_per_call": 4, "frames_per_episode": 8}


class Episodes(L.Callback):
    """Keeps the episodes each step learned from (runs after the rollout callback)."""

    def __init__(self) -> None:
        self.turns: list[list[int]] = []
        self.batch_keys: list[set[str]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.turns.append([e.turns for e in pl_module.experience_of(batch).episodes])
        self.batch_keys.append(set(batch))


class EveryAnswerInTheFirstSecond(L.Callback):
    """Names the stretch that holds each answer in the batch's rows, as the zoom task's rows do
    (the synthetic task's name none); runs before the rollout callback."""

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, batch_idx: int) -> None:
        for row in batch["meta"]:
            row["relevant_span_s"] = (0.0, 1.0)


@pytest.fixture(scope="module")
def asking_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    return save_biased_model(tiny_model_dir, tmp_path_factory.mktemp("asking") / "model", "</tool_call>")


@register("test_row_order")
def row_order(completions: list[str], **_: Any) -> list[float]:
    """A reward that differs between the episodes of a group, however alike they are."""
    return [float(i) for i in range(len(completions))]


def fit(
    model_dir: Path,
    synth_dir: Path,
    tmp_path: Path,
    engine: Any,
    *,
    tool_use: bool = True,
    steps: int = 2,
    rewards: tuple[str, ...] = ("format", "frame_requests"),
    **module_args: Any,
) -> L.Trainer:
    L.seed_everything(0)
    module = GRPOModule(
        str(model_dir), learning_rate=1e-3, max_new_tokens=8, **{"kl_coef": 0.1, **module_args}
    )
    weights = {"format": 1.0, "frame_requests": -0.1, "test_row_order": 1.0}
    rollout = RolloutCallback(
        engine=engine,
        num_generations=3,
        max_new_tokens=8,
        rewards=[RewardSpec(name, weights[name]) for name in rewards],
        tool_use=TOOL_USE,
    )
    episodes = Episodes()
    callbacks = [EveryAnswerInTheFirstSecond(), rollout, episodes]
    trainer = fit_tiny_grpo(
        module, model_dir, synth_dir, tmp_path, steps=steps, callbacks=callbacks, tool_use=tool_use
    )
    trainer.episodes = episodes  # type: ignore[attr-defined]
    return trainer


@pytest.mark.parametrize("engine_name", ["transformers", "vllm"])
def test_tool_use_episodes_train_through_lightning(
    engine_name: str, asking_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    engine = (
        TransformersEngine()
        if engine_name == "transformers"
        else VLLMEngine(dtype="float32", max_num_seqs=8, videos_per_prompt=3)
    )
    trainer = fit(asking_model_dir, synth_dir, tmp_path, engine)
    metrics = trainer.callback_metrics
    # 2 prompts x 3 episodes; each: two malformed requests, one too many, a last turn that asks.
    assert trainer.episodes.turns == [[4] * 6, [4] * 6]  # type: ignore[attr-defined]
    assert float(metrics["tool/requests_per_episode"]) == 4.0
    assert (
        float(metrics["tool/rejected_malformed"]) == 12
        and float(metrics["tool/rejected_too_many_calls"]) == 6
    )
    assert float(metrics["tool/unanswered_fraction"]) == 1.0
    # Where the rows name the answer's stretch, each step says how much of it the episodes saw:
    # nothing, having been served no frame.
    assert float(metrics["tool/span_hit_rate"]) == 0.0 and float(metrics["tool/span_coverage"]) == 0.0
    # RL batches are collated for RL: prompts and their videos, then the rollouts; no
    # teacher-forcing layout, no trace frames decoded.
    for keys in trainer.episodes.batch_keys:  # type: ignore[attr-defined]
        assert {"prompts", "meta", "experience"} <= keys
        assert not keys & {"input_ids", "labels", "video_mask", "target_pixel_values_videos"}
    # Every sampled token of every turn, scored by the trainer with the replies in place, has
    # the engine's log-prob up to float32 rounding (a reply misplaced moves it by > 1e-2).
    assert float(metrics["rollout/logprob_diff_max"]) < 1e-3


def test_tool_use_refuses_a_setup_that_cannot_run(
    asking_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="tool_use: true"):
        fit(asking_model_dir, synth_dir, tmp_path, TransformersEngine(), tool_use=False)
    with pytest.raises(ValueError, match="videos_per_prompt: 3"):
        fit(asking_model_dir, synth_dir, tmp_path, VLLMEngine(dtype="float32"))
    with pytest.raises(ValueError, match="unknown settings"):
        RolloutCallback(engine=TransformersEngine(), tool_use={"max_call": 2})


def test_request_turns_alone_take_the_policy_gradient(
    asking_model_dir: Path, synth_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each episode: four one-token turns (three requests answered by the tool, a fourth that
    # asks again and ends the episode). The loss must see each row's advantage on the first
    # three turns' tokens and 0 on the last turn's, the tool's replies and the padding.
    seen: list[torch.Tensor] = []
    real_loss = models.grpo.policy_loss

    def spied(*args: torch.Tensor, **kw: Any) -> Any:
        logprobs, old, advantages, mask = args
        seen.append(advantages.detach().cpu().clone())
        return real_loss(logprobs, old, advantages, mask, **kw)

    monkeypatch.setattr(models.grpo, "policy_loss", spied)
    trainer = fit(
        asking_model_dir, synth_dir, tmp_path, TransformersEngine(), steps=1,
        rewards=("test_row_order",), kl_coef=0.0, policy_gradient_turns="requests",
    )  # fmt: skip
    assert trainer.episodes.turns == [[4] * 6]  # type: ignore[attr-defined]
    (advantages,) = seen
    # Rewards 0, 1, 2 in each group: the middle episode's advantage is 0 and, with no KL term,
    # its row is skipped; the other four train.
    assert advantages.dim() == 2 and advantages.shape[0] == 4
    for row in advantages:
        trained = row.nonzero().flatten().tolist()
        assert len(trained) == 3, row  # the three request turns' tokens, nothing after them
        assert len(set(row[trained].tolist())) == 1 and row[trained][0] != 0  # the row's advantage
        assert trained[-1] < row.shape[0] - 1  # the last turn's token stands after them, at 0
    # Single-turn rollouts have no request turn to train: refused before the run.
    with pytest.raises(ValueError, match="policy_gradient_turns=requests"):
        GRPOModule(str(asking_model_dir), policy_gradient_turns="requests").check_experience(3, None)
    with pytest.raises(ValueError, match="policy_gradient_turns must be one of"):
        GRPOModule(str(asking_model_dir), policy_gradient_turns="answers")
    with pytest.raises(ValueError, match="ratio_level=token"):
        GRPOModule(str(asking_model_dir), policy_gradient_turns="requests", ratio_level="sequence")


def test_validation_runs_tool_use_episodes(asking_model_dir: Path, synth_dir: Path, tmp_path: Path) -> None:
    from models.sft import SFTModule

    module = SFTModule(str(asking_model_dir), max_new_tokens=8, val_tool_use={"max_calls": 1})
    data = LongVideoReasonDataModule(
        val_shards=str(synth_dir / "val-*.tar"),
        processor_path=str(asking_model_dir),
        num_frames=8,
        batch_size=4,
        num_workers=0,
        tool_use=True,
    )
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.validate(module, datamodule=data)
    metrics = trainer.callback_metrics
    # A malformed request, one too many, and a last turn that asks again: 3 requests, no frames
    # served, so each answer saw the 8 overview frames only; none answers, none is right.
    assert float(metrics["val/requests_per_answer"]) == 3.0
    assert float(metrics["val/frames_per_answer"]) == 8.0
    assert float(metrics["val/accuracy"]) == 0.0
    # Each answer's record keeps its requests, frames served and every turn the model wrote.
    (result,) = module.val_results
    assert {r["frame_requests"] for r in result.predictions} == {3}
    assert {r["frames_served"] for r in result.predictions} == {0}
    assert all(r["turns"].count("</tool_call>") == 3 for r in result.predictions)
