"""bench/zoom_cost.py on a CPU: the rows it times are a GRPO step's rows (videos where the grids
say, the tool's reply out of the loss, the served frames at their true times), its JSON has
every case, and the pass trains the language model; the real-width build path (a model made on
its device in its dtype, head_dim not hidden / heads, tied embeddings) runs in bfloat16."""

from __future__ import annotations

import json
import math
import re
import sys

import pytest
import torch
from helpers.cli import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT))

from bench import zoom_cost
from families import published

FPS = 2.0
SIDE = 64  # 4x4 patches of 16 pixels, merged 2x2: 4 tokens per temporal patch of 2 frames
TOKENS_PER_FRAME_PAIR = (SIDE // 32) ** 2
# 64 frames at 2 fps; the served stretch is the middle one of 16 stretches of 4 frames.
SETTINGS = ["--device", "cpu", "--video-frames", "64", "--fps", str(FPS), "--frame-size", f"{SIDE}x{SIDE}"]
SERVED = 4
SERVED_FRAMES = [32, 33, 34, 35]
TINY = [
    *SETTINGS,
    *("--model", "tiny", "--dense", "8", "4", "--overview", "4", "--served", str(SERVED)),
    *("--completion", "72", "--request-tokens", "60", "--group", "2"),
]


def merged_tokens(grid: torch.Tensor) -> int:
    """Visual tokens of a video of ``grid`` (temporal, height, width patches): merged 2x2."""
    t, h, w = (int(x) for x in grid.reshape(3))
    return t * h * w // 4


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory: pytest.TempPathFactory) -> tuple[zoom_cost.Report, dict]:
    """One run of the tiny settings and the JSON it wrote."""
    out = tmp_path_factory.mktemp("zoom_cost") / "cost.json"
    report = zoom_cost.main([*TINY, "--json", str(out)])
    return report, json.loads(out.read_text())


def test_the_json_has_every_case_with_finite_times_and_its_frames(tiny_report):
    _, numbers = tiny_report
    cases = {case["case"]: case for case in numbers["cases"]}
    assert list(cases) == ["tool", "dense-4", "dense-8"]
    assert {name: case["frames_seen"] for name, case in cases.items()} == {
        "tool": 8,
        "dense-4": 4,
        "dense-8": 8,
    }
    assert cases["tool"]["frames_encoded"] == 8  # the G episodes asked for one span: encoded once
    for case in cases.values():
        assert case["status"] == "ok"
        for key in ("encode_ms", "score_ms", "logprob_sum"):
            assert math.isfinite(case[key]) and case[key] != 0, (case["case"], key)
        assert case["encode_peak_gib"] is None and case["score_peak_gib"] is None  # not measured on a CPU
    assert numbers["device"] == "cpu" and numbers["model"] == "tiny" and numbers["parameters"]["total"] > 0
    assert numbers["gradient_checkpointing"] and not numbers["share_prompts"]


def test_gradients_reach_every_language_model_tensor(tiny_report):
    _, numbers = tiny_report
    for case in numbers["cases"]:
        assert case["lm_params_with_grad"] == numbers["trainable_tensors"] > 0


def test_video_slots_are_the_grids_tokens(tiny_report):
    report, _ = tiny_report
    for frames in (4, 8):
        batch = report.runs[f"dense-{frames}"].batch
        assert batch.video_mask.sum(dim=1).tolist() == [frames // 2 * TOKENS_PER_FRAME_PAIR] * 2
    tool = report.runs["tool"]
    for row, episode in enumerate(tool.episodes):
        overview, segment = episode.prompt.video_grid_thw, episode.segments[0].grid_thw
        assert overview.tolist() == [2, 4, 4] and segment.reshape(3).tolist() == [SERVED // 2, 4, 4]
        assert int(tool.batch.video_mask[row].sum()) == merged_tokens(overview) + merged_tokens(segment)


def test_the_tool_reply_and_only_it_is_out_of_the_loss(tiny_report):
    report, numbers = tiny_report
    tool = report.runs["tool"]
    tokenizer_decode = report.tokenizer.decode
    for row, episode in enumerate(tool.episodes):
        request, last = episode.turn_lengths
        reply = len(episode) - request - last
        expected = [1.0] * request + [0.0] * reply + [1.0] * last
        assert tool.batch.completion_mask[row, : len(episode)].tolist() == expected
        reply_ids = episode.token_ids[request : request + reply]
        text = tokenizer_decode(reply_ids)
        assert text.startswith("<|im_end|>\n<|im_start|>user\n<tool_response>")
        assert "frames 00:16.0-00:17.5, 4 frames, 0.50 s apart" in text
        assert text.endswith("<|im_start|>assistant\n")
        # The request the scripted turn wrote is what the tool served.
        assert tokenizer_decode(episode.token_ids[:request]).endswith(
            '{"start": 16, "end": 18}}\n</tool_call>'
        )
    tool_case = next(case for case in numbers["cases"] if case["case"] == "tool")
    assert tool_case["reply_tokens"] == reply and tool_case["seq_len"] == len(episode.prompt) + len(episode)


def test_the_served_frames_stand_at_their_true_times(tiny_report):
    """Qwen3-VL reads a frame's time from the text before its patch (the ``frames`` rule gives each
    patch's run the temporal position where it starts): the reply writes the served frames' true
    times, and each run of the segment starts one past the token before it."""
    report, _ = tiny_report
    tool = report.runs["tool"]
    episode = tool.episodes[0]
    truth = [i / FPS for i in SERVED_FRAMES]
    patches = [(truth[i] + truth[i + 1]) / 2 for i in range(0, SERVED, 2)]  # the processor's patch times
    segment = episode.segments[0]
    assert segment.timestamps == pytest.approx(patches)
    assert segment.second_per_grid == pytest.approx(2 * (1 / FPS))  # true interval x temporal patch
    text = report.tokenizer.decode(episode.token_ids)
    written = [float(t) for t in re.findall(r"<([0-9.]+) seconds>", text)]
    assert written == [float(f"{t:.1f}") for t in patches]
    start = len(episode.prompt)
    slots = tool.batch.video_mask[0, start : start + len(episode)].tolist()
    positions = tool.batch.position_ids[:, 0, start : start + len(episode)]
    runs = [i for i, slot in enumerate(slots) if slot and (i == 0 or not slots[i - 1])]
    assert len(runs) == SERVED // 2
    for first in runs:
        run = positions[:, first : first + TOKENS_PER_FRAME_PAIR]
        assert (run[0] == positions[0, first - 1] + 1).all()
        assert (run[1:] - run[0]).flatten().tolist() == [0, 0, 1, 1, 0, 1, 0, 1]  # (h, w) of a 2x2 grid


def test_a_case_out_of_memory_is_reported_and_the_others_still_run(monkeypatch, capsys):
    scored = zoom_cost.score_group

    def out_of_memory_at_8_frames(setup, batch, embeds, segments):
        if segments is None and int(batch.video_mask[0].sum()) == 4 * TOKENS_PER_FRAME_PAIR:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return scored(setup, batch, embeds, segments)

    monkeypatch.setattr(zoom_cost, "score_group", out_of_memory_at_8_frames)
    cases = {case["case"]: case for case in zoom_cost.main(TINY).numbers["cases"]}
    assert {name: case["status"] for name, case in cases.items()} == {
        "tool": "ok",
        "dense-4": "ok",
        "dense-8": "OOM (scoring)",
    }
    assert cases["dense-8"]["encode_ms"] > 0 and cases["dense-8"]["score_ms"] is None
    assert cases["dense-4"]["score_ms"] > 0  # timed after the failure
    printed = capsys.readouterr().out
    assert re.search(r"^dense-8 .* [0-9.]+ +n/a +OOM +OOM +OOM \(scoring\)$", printed, re.M)
    assert "dense / tool" in printed


def test_a_time_budget_skips_the_cases_left(capsys):
    numbers = zoom_cost.main([*TINY, "--dense", "4", "--time-budget", "0"]).numbers
    assert [case["status"] for case in numbers["cases"]] == ["skipped: time budget"] * 2
    assert re.search(r"^tool .* skipped: time budget$", capsys.readouterr().out, re.M)


def test_the_real_width_build_path_runs_in_bfloat16(monkeypatch):
    """A published-style spec (head_dim 128 with 2 heads of a 160-wide model, tied embeddings,
    DeepStack levels) made directly on the device in bfloat16, scored with gradients."""
    spec = {
        "text": {
            "vocab_size": 4096,
            "hidden_size": 160,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 128,
            "rope_parameters": published.QWEN3_VL_ROPE,
        },
        "vision": {
            **published.QWEN3_VL_VISION,
            "depth": 2,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_heads": 4,
        }
        | {"deepstack_visual_indexes": [0, 1], "out_hidden_size": 160},
        "tie_word_embeddings": True,
    }
    monkeypatch.setitem(published.QWEN3_VL_PUBLISHED, "mini", spec)
    mini = ("--model", "mini", "--dtype", "bfloat16", "--dense", "4", "--overview", "2", "--served", "2")
    report = zoom_cost.main(
        [*SETTINGS, *mini, "--completion", "64", "--request-tokens", "60", "--group", "2"]
    )
    numbers = report.numbers
    assert [case["status"] for case in numbers["cases"]] == ["ok", "ok"]
    assert all(math.isfinite(case["score_ms"]) for case in numbers["cases"])
    assert numbers["dtype"] == "bfloat16" and numbers["attention"] == "sdpa"
    # vocab 4096 x 160, tied: counted once
    assert numbers["parameters"]["text"] < 2 * 4096 * 160
