"""`lvrl fit --config configs/demo/grpo_sp2.yaml`: 2 CPU processes, one sequence-parallel group, vLLM.

Two GRPO steps run end to end, a validation pass after them counts each question once (the
peers evaluate the same ones), and the first step's loss and gradient norm (gradients summed
over the group by the strategy) equal a one-process computation on the very same rollout batch:
with Ulysses attention under Lightning's launcher, on tool-use episodes the peers play together,
and with ring attention over two "nodes" (one torchrun per node rank on this machine), on single
turns. Each attention runs under one launcher: what the ranks compute does not depend on who
started them (tests/distributed/test_sequence_parallel.py compares both attentions with one
process in ranks of its own), and lvrl's strategy under one torchrun of two processes is
tests/e2e/test_exit_hygiene.py's and tests/e2e/test_sharded_resume.py's.

The multi-process runs are `lvrl` subprocesses (a launcher starts the ranks); the layouts
refused before any process is launched are checked through the CLI in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from helpers.biased_models import save_biased_model
from helpers.cli import PROBES_ENV, REPO_ROOT, free_port, run_cli, run_lvrl_expecting_failure
from helpers.rollout_settings import engine_gap_bar, tiny_rollout_settings
from helpers.runs import logged, tiny_data_args
from helpers.tolerances import GRADIENT_ULPS, assert_float32_close

from models.grpo import loss_normalizers
from models.loading import load_model
from models.logprobs import completion_logprobs
from models.rl.losses import policy_loss
from rollout.experience import RolloutBatch

STEPS = 2


def sp_config(tmp_path: Path, attention: str) -> Path:
    config = tiny_rollout_settings("configs/demo/grpo_sp2.yaml")
    assert config["trainer"]["devices"] == 2
    config["trainer"]["strategy"]["init_args"]["sequence_parallel_attention"] = attention
    callbacks = config["trainer"]["callbacks"]
    callbacks.insert(
        1,
        {
            "class_path": "helpers.sp_probe.FixedAdvantagesAndRecord",
            "init_args": {"out_dir": str(tmp_path / "probe")},
        },
    )
    path = tmp_path / "grpo_sp2.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def sp2_fit(
    launcher: str,
    config: Path,
    run_dir: Path,
    model_dir: Path,
    synth_dir: Path,
    kl_coef: float,
    validate: bool = False,
) -> None:
    """``lvrl fit`` of ``config`` on 2 processes, started by Lightning's launcher or by two
    torchruns as two nodes of one process each; with ``validate``, a validation pass over the 8
    validation questions (one batch, 8-token answers) after the last step."""
    validation = ["--trainer.limit_val_batches", "0"]
    if validate:
        validation = ["--trainer.val_check_interval", str(STEPS), "--model.init_args.max_new_tokens", "8"]
    args = [
        "fit",
        "--config", str(config),
        "--trainer.default_root_dir", str(run_dir),
        "--trainer.max_steps", str(STEPS),
        *validation,
        "--model.init_args.model_path", str(model_dir),
        "--model.init_args.kl_coef", str(kl_coef),
        "--model.init_args.learning_rate", "1e-3",
        *tiny_data_args(str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")),
    ]  # fmt: skip
    if launcher == "lightning":
        run_cli(*args, extra_env=PROBES_ENV)
        return
    assert launcher == "torchrun-2-nodes", launcher
    torchrun = [str(Path(sys.executable).parent / "torchrun"), "--master_port", str(free_port())]
    env = {**os.environ, "WANDB_MODE": "offline", **PROBES_ENV}
    # Two "nodes" on this machine: one torchrun per node rank, one process each, meeting at the
    # first node's address as the nodes of a cluster do (docs/sequence-parallelism.md, "Multi-node").
    nodes = [
        subprocess.Popen(
            [
                *torchrun, "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
                "--master_addr", "127.0.0.1", "-m", "app", *args,
                "--trainer.num_nodes", "2", "--trainer.devices", "1",
            ],
            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
        )
        for node in (0, 1)
    ]  # fmt: skip
    for node in nodes:
        _, stderr = node.communicate(timeout=600)
        assert node.returncode == 0, stderr[-4000:]


def with_tool_use(config: Path) -> None:
    """Tool-use episodes (at most 2 requests, vLLM taking 3 videos a prompt) in ``config``."""
    settings = yaml.safe_load(config.read_text())
    rollout = settings["trainer"]["callbacks"][0]["init_args"]
    rollout["tool_use"] = {"max_calls": 2}
    rollout["engine"]["init_args"]["videos_per_prompt"] = 3
    settings["data"]["init_args"]["tool_use"] = True
    config.write_text(yaml.safe_dump(settings))


@pytest.mark.parametrize(
    ("attention", "launcher", "tool_use"),
    [
        # Tool-use episodes of a model that always asks: two peers play a step's episodes together
        # (each samples a share of every round, the group serves the replies) and train on the same
        # ones, scored sequence-parallel with the replies in place.
        ("ulysses", "lightning", True),
        # Two nodes of one process each (torchrun per node rank, on this machine).
        ("ring", "torchrun-2-nodes", False),
    ],
)
def test_sp2_fit_matches_one_process(
    attention: str, launcher: str, tool_use: bool, tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    kl_coef = 0.01
    config = sp_config(tmp_path, attention)
    model_dir = tiny_model_dir
    if tool_use:
        model_dir = save_biased_model(tiny_model_dir, tmp_path / "asking", "</tool_call>")
        with_tool_use(config)
    sp2_fit(launcher, config, run_dir, model_dir, synth_dir, kl_coef, validate=True)
    losses, grad_norms = logged(run_dir, "train/loss"), logged(run_dir, "train/grad_norm")
    assert len(losses) == STEPS and len(grad_norms) == STEPS
    # Sequence-parallel peers evaluate the same questions: the 8 validation questions count once.
    assert logged(run_dir, "val/questions") == [8.0]
    # Every sampled token (of every turn) has the engine's log-prob.
    assert max(logged(run_dir, "rollout/logprob_diff_max")) <= engine_gap_bar(model_dir)

    # Both ranks trained on one rollout batch (sequence-parallel peers share rollouts).
    first, second = (
        torch.load(tmp_path / "probe" / f"rollout0-rank{r}.pt", weights_only=False) for r in (0, 1)
    )
    assert torch.equal(first.scoring.input_ids, second.scoring.input_ids)
    assert torch.equal(first.scoring.completion_ids, second.scoring.completion_ids)
    assert torch.equal(first.advantages, second.advantages)
    rollout: RolloutBatch = first
    if tool_use:
        # Each episode: two malformed requests, one too many, a last turn that asks again.
        assert logged(run_dir, "tool/requests_per_episode") == [4.0] * STEPS
        assert rollout.episodes is not None and [e.turns for e in rollout.episodes] == [4] * len(rollout)

    # One process, the same batch: the GRPOModule loss (policy = reference at step 0, so KL is 0).
    model = load_model(model_dir).train()
    segments = rollout.segment_embeds(range(len(rollout)))
    logprobs = completion_logprobs(model, rollout.scoring, rollout.video_embeds(), segment_embeds=segments)
    mask = rollout.scoring.completion_mask * rollout.row_mask.unsqueeze(-1)
    loss, _ = policy_loss(
        logprobs,
        rollout.old_logprobs,
        rollout.advantages,
        mask,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=3.0,
        kl_coef=kl_coef,
        ref_logprobs=logprobs.detach(),
        kl_kind="k3",
        **loss_normalizers(mask, "token_mean"),
    )
    loss.backward()
    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
    # Two sequence-parallel ranks vs one process: the same values up to reordered reductions.
    # The loss is a mean of -A r terms (|A| <= max |A|, r ~ 1 at step 0) that largely cancel,
    # so its rounding scales with max |A|, not with the (small) result; the gradient norm with
    # itself. A rank counting its tokens twice or missing a slice is off by >= 1/2 of either.
    why = "2 sequence-parallel ranks vs one process"
    assert_float32_close(
        losses[0],
        float(loss),
        ulps=GRADIENT_ULPS,
        scale=float(rollout.advantages.abs().max()),
        reason=f"loss, {why}",
    )
    assert_float32_close(grad_norms[0], float(grad_norm), ulps=GRADIENT_ULPS, reason=f"grad norm, {why}")


@pytest.mark.parametrize(
    ("devices", "size", "message"),
    [
        ("2", "3", "sequence_parallel_size=3 does not divide the world size 2"),
        # The tiny model has 4 attention heads: Ulysses cannot split them over 3 ranks.
        ("3", "3", "Ulysses attention splits the model's 4 attention heads"),
    ],
)
def test_impossible_sequence_parallel_layouts_fail_at_start_up(
    devices: str, size: str, message: str, tiny_model_dir: Path, synth_dir: Path, tmp_path: Path
) -> None:
    started = time.perf_counter()
    result = run_lvrl_expecting_failure(
        "fit",
        "--config", str(REPO_ROOT / "configs/demo/grpo_sp2.yaml"),
        "--trainer.default_root_dir", str(tmp_path / "run"),
        "--trainer.devices", devices,
        "--trainer.strategy.init_args.sequence_parallel_size", size,
        "--model.init_args.model_path", str(tiny_model_dir),
        *tiny_data_args(str(synth_dir / "train-*.tar"), str(synth_dir / "val-*.tar")),
    )  # fmt: skip
    assert message in result.stderr
    assert "Initializing a V1 LLM engine" not in result.stderr  # before any rollout engine starts
    assert time.perf_counter() - started < 120
