"""The judge reward against a OpenAI-compatible server: batches, time-outs, retries, bad replies."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rewards.combine import RewardSpec, compute_rewards
from rewards.judge import JudgeClient, JudgeSettings

SERVER = Path(__file__).resolve().parents[1] / "helpers" / "judge_server.py"


@pytest.fixture()
def judge_url():
    process = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.kill()
        process.wait()


def _stats(url: str) -> dict:
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats", timeout=5) as response:
        return json.loads(response.read())


def test_judgements_are_concurrent_and_failures_are_scored_not_raised(judge_url, caplog):
    settings = JudgeSettings(
        judge_url, "judge", timeout_s=0.8, max_retries=1, concurrency=4, failure_score=0.25
    )
    client = JudgeClient(settings)
    items = [
        ("What is shown?", "a red car", "A red car, parked."),
        ("What is shown?", "a red car", "a blue car"),
        ("What is shown?", "x", "SLOW x"),
        ("What is shown?", "x", "GARBAGE x"),
        ("What is shown?", "x", "NOTJSON x"),
        ("What is shown?", "x", "FLAKY x"),
        *[("Count?", "two", f"two times ({i})") for i in range(6)],
    ]
    keys = [f"sample-{i}" for i in range(len(items))]
    start = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="rewards.judge"):
        judgements = client.judge(items, keys)
    elapsed = time.perf_counter() - start

    assert [j.score for j in judgements] == [1.0, 0.0, 0.25, 0.25, 0.25, 1.0] + [1.0] * 6
    assert [j.ok for j in judgements] == [True, True, False, False, False, True] + [True] * 6
    assert "TimeoutError" in judgements[2].detail and "yes/no" in judgements[3].detail
    assert "chat-completions" in judgements[4].detail
    stats = _stats(judge_url)
    # The time-out is retried once, the 503 once; a malformed reply is not retried.
    assert stats["seen"]["SLOW x"] == 2 and stats["seen"]["FLAKY x"] == 2 and stats["seen"]["GARBAGE x"] == 1
    assert stats["max_in_flight"] >= 3  # batched: requests overlap
    # 12 requests of 0.2 s, 4 at a time, plus one slow sample's two 0.8 s time-outs: well under serial.
    assert elapsed < 12 * 0.2 + 2 * 0.8
    assert client.failures == 3 and client.requests == 14
    message = caplog.text
    assert (
        "3 of 12 judgements failed, scored 0.25" in message
        and "sample-2" in message
        and "sample-4" in message
    )


def test_judged_accuracy_routes_by_problem_type(judge_url):
    judge = {"base_url": judge_url, "model": "judge", "timeout_s": 2.0}
    completions = [
        "<think>r</think><answer>B</answer>",  # multiple choice: rule-based, never sent
        "<think>r</think><answer>It is a red car.</answer>",
        "<think>r</think><answer>A truck.</answer>",
        "<think>r</think> no answer block",  # open-ended without an answer: 0, not sent
        "<think>r</think><answer>3.0</answer>",  # numerical: rule-based
    ]
    fields = {
        "answer": ["B", "red car", "red car", "red car", "3"],
        "problem_type": ["multiple choice", "open-ended", "Open-Ended", "open-ended", "numerical"],
        "options": [["x", "y"], [], [], [], []],
        "problem": ["Which?", "What is it?", "What is it?", "What is it?", "How many?"],
        "key": ["k0", "k1", "k2", "k3", "k4"],
    }
    breakdown = compute_rewards([RewardSpec("judged_accuracy", 1.0, {"judge": judge})], completions, fields)
    assert breakdown.per_function["judged_accuracy"] == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert set(_stats(judge_url)["seen"]) == {"It is a red car.", "A truck."}


def test_an_unreachable_judge_scores_the_failure_score_quickly():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = JudgeSettings(f"http://127.0.0.1:{port}/v1", "judge", timeout_s=1.0, max_retries=1)
    start = time.perf_counter()
    judgements = JudgeClient(settings).judge([("q", "a", "a")] * 3)
    assert [j.score for j in judgements] == [0.0] * 3 and not any(j.ok for j in judgements)
    assert "URLError" in judgements[0].detail and time.perf_counter() - start < 5


def test_bad_judge_settings_fail_clearly():
    with pytest.raises(ValueError, match="http"):
        JudgeSettings("localhost:8000", "judge")
    with pytest.raises(ValueError, match="timeout_s"):
        JudgeSettings("http://localhost:8000/v1", "judge", timeout_s=0)
