"""`lvrl data build`: released JSONL rows + video files -> shards, rejects file, manifest; resumable.

The first build is an `lvrl data build` subprocess (the entry point of the data tools); the
refused arguments go through the same command in this process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers.cli import run_lvrl, run_lvrl_expecting_failure

from datamodules.longvideo_reason import LongVideoReasonDataModule
from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from datatools import released_build as build_module
from datatools.released_build import BuildError, BuildSettings, build_shards
from datatools.shard_writer import shard_name
from datatools.video_encode import encode_video

# Good rows: problem_id -> what the normalised row must hold.
GOOD = {
    "mc-lines": {"options": ["red", "blue", "green", "yellow"], "answer": "B", "member": "mp4"},
    "mc-inline": {"options": ["one", "two", "three", "four"], "answer": "C", "member": "webm"},
    "open-1": {"options": [], "answer": "The square grows.", "member": "mkv"},
    "open/2.x": {"options": [], "answer": "Twice", "member": "mp4"},
}
# Bad rows: line number in the file (a blank line 5 is skipped, not a row) -> reason code.
BAD = {
    6: "missing_video",
    7: "undecodable",
    8: "duplicate_id",
    9: "answer_not_an_option",
    10: "no_answer",
    11: "malformed",
    12: "no_options",
    13: "undecodable",
    14: "malformed",
}


def _video(num_frames: int, shade: int, extension: str) -> bytes:
    levels = (np.arange(num_frames) * 7 + shade).astype(np.uint8)
    frames = np.broadcast_to(levels[:, None, None, None], (num_frames, 56, 56, 3)).copy()
    frames[:, 20:36, 20:36] = 255  # a square, so the codec has edges to encode
    return encode_video(frames, 4.0, extension)


def _row(problem_id: str, video: str, problem: str, answer: str, **extra: object) -> dict:
    row = {
        "problem_id": problem_id,
        "data_type": "video",
        "videos": video,
        "problem": problem,
        "problem_type": "multiple choice",
        "reasoning": "Because.",
        "answer": answer,
    }
    row.update(extra)
    return row


def write_released(root: Path) -> tuple[Path, Path]:
    """A JSONL in the released row format, one row per case, and its videos folder."""
    videos = root / "videos"
    (videos / "sub").mkdir(parents=True)
    (videos / "a.mp4").write_bytes(_video(24, 0, "mp4"))
    (videos / "b.webm").write_bytes(_video(20, 40, "webm"))
    (videos / "sub" / "c.mkv").write_bytes(_video(16, 80, "mkv"))
    (videos / "d.mp4").write_bytes(_video(30, 120, "mp4"))
    (videos / "garbage.mp4").write_bytes(b"\x00\x01 not a video " * 50)
    good = _video(40, 10, "mp4")
    (videos / "truncated.mp4").write_bytes(good[: len(good) // 2])
    open_ended = {"problem_type": "open-ended"}
    lines = [
        _row(
            "mc-lines",
            "a.mp4",
            "Which colour?\nA. red\nB. blue\nC. green\nD. yellow",
            "<answer>B</answer>",
            category="Temporal",
        ),
        _row(
            "mc-inline",
            "b.webm",
            "How many? Options: (A) one (B) two (C) three (D) four",
            "<answer>C.</answer>",
            category="plot",
        ),
        _row("open-1", "sub/c.mkv", "What happens?", "<answer>The square grows.</answer>", **open_ended),
        _row("open/2.x", "d.mp4", "How often?", "Twice", **open_ended),
        _row("missing", "nope.mp4", "Which?\nA. x\nB. y", "<answer>A</answer>"),
        _row("garbage", "garbage.mp4", "Which?\nA. x\nB. y", "<answer>A</answer>"),
        _row("mc-lines", "a.mp4", "Which colour again?\nA. red\nB. blue", "<answer>A</answer>"),
        _row("no-such-option", "a.mp4", "Which?\nA. x\nB. y\nC. z", "<answer>D</answer>"),
        _row("no-answer", "a.mp4", "Which?\nA. x\nB. y", ""),
        None,  # a line that is not JSON
        _row("no-options", "a.mp4", "Which colour is it?", "<answer>A</answer>"),
        _row("truncated", "truncated.mp4", "Which?\nA. x\nB. y", "<answer>B</answer>"),
        {"problem_id": "no-problem", "videos": "a.mp4", "answer": "<answer>A</answer>"},
    ]
    jsonl = root / "train.jsonl"
    with jsonl.open("w", encoding="utf-8") as out:
        for i, row in enumerate(lines):
            out.write("{not json\n" if row is None else json.dumps(row) + "\n")
            if i == 3:
                out.write("\n")  # blank lines are not rows
    return jsonl, videos


@pytest.fixture()
def released(tmp_path: Path) -> tuple[Path, Path]:
    return write_released(tmp_path / "released")


def _rejects(out: Path) -> dict[int, str]:
    lines = (out / "train-rejects.jsonl").read_text().splitlines()
    return {json.loads(line)["line"]: json.loads(line)["reason"] for line in lines}


def _bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("train-*"))}


def test_build_writes_every_good_row_and_rejects_every_bad_one_with_its_reason(released, tmp_path):
    jsonl, videos = released
    out = tmp_path / "shards"
    done = run_lvrl(
        "data",
        "build",
        "--jsonl",
        str(jsonl),
        "--videos-root",
        str(videos),
        "--out",
        str(out),
        "--workers",
        "2",
        "--shard-size",
        "5KB",
        "--no-progress",
    )
    assert "14 rows, 4 written" not in done.stdout  # the blank line is not a row
    assert "13 rows, 4 written" in done.stdout, done.stdout
    assert "rejected 9" in done.stdout

    # Rejects: exactly the bad lines, each with its reason, naming the row.
    assert _rejects(out) == BAD
    first = json.loads((out / "train-rejects.jsonl").read_text().splitlines()[0])
    assert first["problem_id"] == "missing" and "nope.mp4" in first["message"]

    # The good rows stream through WebDataset, each with its own container, and nothing else.
    shards = resolve_shards(str(out / "train-*.tar"))
    assert len(shards) >= 2  # the 5 KB limit split them (videos are ~2 KB)
    stream = VideoQAStream(shards, num_frames=8, max_pixels=56 * 56)
    samples = {s.row.problem_id: s for s in stream}
    assert stream.skipped.value == 0
    assert set(samples) == set(GOOD)
    for problem_id, expected in GOOD.items():
        row = samples[problem_id].row
        assert list(row.options) == expected["options"] and row.answer == expected["answer"]
        assert samples[problem_id].video.frames.shape[1:] == (56, 56, 3)
    assert samples["mc-lines"].row.problem == "Which colour?"
    assert samples["mc-inline"].row.problem == "How many?" and samples["mc-inline"].row.category == "Plot"
    assert samples["open-1"].row.problem_type == "open-ended"
    assert samples["open/2.x"].row.extra["duration"] == pytest.approx(30 / 4.0)
    assert samples["mc-inline"].row.extra["source_problem"].startswith("How many? Options:")

    # The manifest counts what was written and rejected.
    manifest = json.loads((out / "dataset.json").read_text())["splits"]["train"]
    assert manifest["num_samples"] == 4 and sum(s["num_samples"] for s in manifest["shards"]) == 4
    assert manifest["build"]["rows"] == 13
    assert manifest["build"]["rejected"] == {
        "malformed": 2,
        "no_answer": 1,
        "no_options": 1,
        "answer_not_an_option": 1,
        "duplicate_id": 1,
        "missing_video": 1,
        "undecodable": 2,
    }
    assert manifest["build"]["per_container"] == {"mkv": 1, "mp4": 2, "webm": 1}
    assert manifest["build"]["per_category"] == {"Plot": 1, "Temporal": 1, "none": 2}

    # One worker gives the same bytes as two.
    single = tmp_path / "single"
    build_shards(BuildSettings(jsonl, videos, single, max_bytes_per_shard=5_000), progress=False)
    assert _bytes(single).keys() == _bytes(out).keys()
    assert {k: v for k, v in _bytes(single).items() if k.endswith(".tar")} == {
        k: v for k, v in _bytes(out).items() if k.endswith(".tar")
    }


def test_built_shards_feed_the_datamodule(released, tmp_path, tiny_model_dir):
    jsonl, videos = released
    out = tmp_path / "shards"
    build_shards(BuildSettings(jsonl, videos, out), progress=False)
    data = LongVideoReasonDataModule(
        train_shards=str(out / "train-*.tar"),
        processor_path=str(tiny_model_dir),
        num_frames=4,
        max_pixels_per_frame=56 * 56,
        batch_size=2,
        num_workers=0,
        shuffle_buffer=0,
    )
    data.setup("fit")
    keys = [meta["problem_id"] for batch in data.train_dataloader() for meta in batch["meta"]]
    assert sorted(keys) == sorted(GOOD) and data.skipped_samples == 0


def test_an_interrupted_build_resumes_to_the_same_output(released, tmp_path, monkeypatch):
    jsonl, videos = released
    settings = BuildSettings(jsonl, videos, tmp_path / "whole", max_bytes_per_shard=5_000)
    build_shards(settings, progress=False)
    expected = _bytes(settings.out)

    interrupted = BuildSettings(jsonl, videos, tmp_path / "resumed", max_bytes_per_shard=5_000)
    real_probe = build_module.probe
    calls = []

    def probe_then_crash(item):
        calls.append(item)
        if len(calls) == 7:  # the last good row's shard is open, earlier ones are complete
            raise KeyboardInterrupt
        return real_probe(item)

    monkeypatch.setattr(build_module, "probe", probe_then_crash)
    with pytest.raises(KeyboardInterrupt):
        build_shards(interrupted, progress=False)
    monkeypatch.setattr(build_module, "probe", real_probe)
    state = json.loads((interrupted.out / "train-build-state.json").read_text())
    assert not state["complete"] and state["shards"] and state["next_line"] > 1
    # What a SIGKILL would leave besides: a partial shard and rejects past the recorded line.
    unfinished = shard_name("train", len(state["shards"])) + ".partial"
    (interrupted.out / unfinished).write_bytes(b"half a tar")
    with (interrupted.out / "train-rejects.jsonl").open("a") as rejects:
        rejects.write(json.dumps({"line": 99, "reason": "undecodable", "message": "stale"}) + "\n")

    report = build_shards(interrupted, progress=False)
    assert report.resumed_from_line == state["next_line"]
    assert _bytes(interrupted.out) == expected
    assert _rejects(interrupted.out) == BAD

    # Complete: a re-run changes nothing; other inputs need --overwrite.
    assert build_shards(interrupted, progress=False).written == 4
    assert _bytes(interrupted.out) == expected
    with jsonl.open("a") as more:
        more.write(json.dumps(_row("late", "a.mp4", "Which?\nA. x\nB. y", "A")) + "\n")
    with pytest.raises(BuildError, match="--overwrite"):
        build_shards(interrupted, progress=False)
    assert build_shards(interrupted, overwrite=True, progress=False).written == 5


def test_build_refuses_bad_arguments_clearly(released, tmp_path):
    jsonl, videos = released
    with pytest.raises(BuildError, match="no videos folder"):
        build_shards(BuildSettings(jsonl, tmp_path / "none", tmp_path / "o"), progress=False)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "train-00000.tar").write_bytes(b"")
    with pytest.raises(BuildError, match="no build state"):
        build_shards(BuildSettings(jsonl, videos, tmp_path / "taken"), progress=False)
    done = run_lvrl_expecting_failure(
        "data",
        "build",
        "--jsonl",
        str(jsonl),
        "--videos-root",
        str(videos),
        "--out",
        str(tmp_path / "o"),
        "--shard-size",
        "lots",
    )
    assert "not a size like 1GB" in done.stderr


def test_released_rows_as_their_generators_write_them(tmp_path):
    # NVlabs' LongVideo-Reason generation script writes integer ids; answers come in lower case;
    # a video named .mp4 in the row may sit on disk as .MP4 or .mkv (Video-MME's, which lmms-eval
    # accepts). An id whose first line was rejected (its video missing) keeps its good row: the first
    # *written* row of an id holds it, and a later repeat of that one is the duplicate.
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "upper.MP4").write_bytes(_video(20, 0, "mp4"))
    (videos / "other.mkv").write_bytes(_video(20, 40, "mkv"))
    (videos / "a.mp4").write_bytes(_video(20, 80, "mp4"))
    question = "Which colour?\nA. red\nB. blue\nC. green\nD. yellow"
    rows = [
        _row(7, "a.mp4", question, "<answer>b</answer>"),  # 1: written as id "7", answer B
        _row("twice", "absent.mp4", question, "<answer>A</answer>"),  # 2: missing_video
        _row("twice", "a.mp4", question, "<answer>C</answer>"),  # 3: written: its id's first written row
        _row("twice", "a.mp4", question, "<answer>D</answer>"),  # 4: duplicate of line 3
        _row("upper", "upper.mp4", question, "<answer>(d)</answer>"),  # 5: finds upper.MP4
        _row("other", "other.mp4", question, "<answer>A</answer>"),  # 6: finds other.mkv
    ]
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    out = tmp_path / "shards"
    report = build_shards(BuildSettings(jsonl, videos, out), progress=False)
    assert report.written == 4 and report.rejected == {"missing_video": 1, "duplicate_id": 1}
    rejects = [json.loads(line) for line in (out / "train-rejects.jsonl").read_text().splitlines()]
    assert [(r["line"], r["reason"]) for r in rejects] == [(2, "missing_video"), (4, "duplicate_id")]
    assert rejects[1]["message"] == "problem_id also on line 3"
    written = {
        sample.row.problem_id: (sample.row.answer, sample.row.extra.get("source_line"), sample.video_bytes)
        for sample in VideoQAStream(
            resolve_shards(str(out / "train-*.tar")), num_frames=4, max_pixels=56 * 56, keep_video_bytes=True
        )
    }
    assert {pid: (answer, line) for pid, (answer, line, _) in written.items()} == {
        "7": ("B", 1),
        "twice": ("C", 3),
        "upper": ("D", 5),
        "other": ("A", 6),
    }
    assert written["other"][2] == (videos / "other.mkv").read_bytes()
