"""`lvrl data build` on hostile input: any bytes, paths, ids, lengths and damaged videos.

One build runs a table of hostile lines (each with the fate it must get: a shard or a named
rejection), so the whole table costs one build; every test also checks that written +
rejected equals the rows of the file (lines with more than JSON whitespace).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import threading
from pathlib import Path

import av
import numpy as np
import pytest

from app.commands.data import register
from datamodules.shards import resolve_shards
from datamodules.video import VideoDecodeError, decode_video
from datatools import released_build as build_module
from datatools.ingest import sample_key
from datatools.released import REJECT_REASONS, TextLimits
from datatools.released_build import BuildReport, BuildSettings, build_shards
from datatools.video_encode import encode_video
from datatools.video_probe import probe_video

SHARD = "shard"
LIMITS = TextLimits()


def _video(num_frames: int = 8, shade: int = 0) -> bytes:
    levels = (np.arange(num_frames) * 9 + shade).astype(np.uint8)
    frames = np.broadcast_to(levels[:, None, None, None], (num_frames, 56, 56, 3)).copy()
    frames[:, 20:36, 20:36] = 255
    return encode_video(frames, 4.0, "mp4")


def _row(problem_id: object = "q", video: object = "a.mp4", **changes: object) -> dict:
    row = {
        "problem_id": problem_id,
        "data_type": "video",
        "videos": video,
        "problem": "Which?\nA. x\nB. y",
        "problem_type": "multiple choice",
        "reasoning": "Because.",
        "answer": "<answer>B</answer>",
    }
    row.update(changes)
    return row


def _line(row: object) -> bytes:
    return json.dumps(row, ensure_ascii=False).encode("utf-8")


def _good(problem_id: str, **changes: object) -> bytes:
    return _line(_row(problem_id, **changes))


def _raw(problem_id: str, inside: str) -> bytes:
    """A row whose JSON text around a field is written by hand (``inside`` goes before the last brace)."""
    return _good(problem_id)[:-1] + b", " + inside.encode() + b"}"


def _rows_of(jsonl: Path) -> int:
    """Rows by the documented rule, counted independently of the build's reader."""
    data = jsonl.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    if lines and lines[0].startswith(b"\xef\xbb\xbf"):
        lines[0] = lines[0][3:]
    return sum(1 for line in lines if line.strip(b" \t\r"))


def _fates(out: Path, split: str = "train") -> dict[int, str]:
    """Line number -> ``shard`` or the rejection reason, read back from the shards and rejects file."""
    fates: dict[int, str] = {}
    for record in (out / f"{split}-rejects.jsonl").read_bytes().decode("utf-8").split("\n"):
        if record:
            reject = json.loads(record)
            assert reject["line"] not in fates and reject["message"]
            fates[reject["line"]] = reject["reason"]
    keys = set()
    for sample in _shard_samples(out, split):
        assert sample["__key__"] not in keys  # keys are unique across the whole build
        keys.add(sample["__key__"])
        assert sample["__key__"] == sample_key(sample["json"]["problem_id"])
        assert sample["json"]["source_line"] not in fates
        fates[sample["json"]["source_line"]] = SHARD
    return fates


def _strict_json(data: bytes) -> dict:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-standard JSON {name} in a shard")

    return json.loads(data.decode("utf-8"), parse_constant=refuse)


def _shard_samples(out: Path, split: str = "train") -> list[dict]:
    import tarfile

    samples: dict[str, dict] = {}
    for shard in resolve_shards(str(out / f"{split}-*.tar")) if list(out.glob(f"{split}-*.tar")) else []:
        with tarfile.open(shard) as tar:
            for member in tar:
                key, extension = member.name.split(".", 1)
                handle = tar.extractfile(member)
                assert handle is not None
                sample = samples.setdefault(key, {"__key__": key})
                data = handle.read()
                sample[extension] = _strict_json(data) if extension == "json" else data
    return list(samples.values())


def _check_accounting(report: BuildReport, jsonl: Path, fates: dict[int, str]) -> None:
    rows = _rows_of(jsonl)
    assert report.rows == rows == len(fates)
    assert report.written + sum(report.rejected.values()) == rows
    assert report.written == sum(1 for fate in fates.values() if fate == SHARD)
    assert set(report.rejected) <= set(REJECT_REASONS)


def _build_within(settings: BuildSettings, seconds: float = 300, **kwargs: object) -> BuildReport:
    """Build in a daemon thread: opening a FIFO outside the root would block, and must fail the test."""
    result: list[object] = []
    thread = threading.Thread(
        target=lambda: result.append(_capture(lambda: build_shards(settings, progress=False, **kwargs))),
        daemon=True,
    )
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the build blocked (did it open the FIFO outside the videos root?)"
    if isinstance(result[0], BaseException):
        raise result[0]
    assert isinstance(result[0], BuildReport)
    return result[0]


def _capture(call):
    try:
        return call()
    except BaseException as err:  # re-raised in the test's thread
        return err


def _layout(tmp_path: Path) -> tuple[Path, Path]:
    """videos/ (the root) beside outside/, with every kind of path trap; returns (root, outside)."""
    root, outside = tmp_path / "videos", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    good = _video()
    (root / "a.mp4").write_bytes(good)
    (root / "sub" / "b.mp4").write_bytes(_video(shade=60))
    (root / "notes.txt").write_text("not a video")
    (outside / "secret.mp4").write_bytes(good)
    os.mkfifo(outside / "pipe.mp4")  # anything that opens it blocks
    os.mkfifo(root / "inside_pipe.mp4")
    (root / "link_out.mp4").symlink_to(outside / "secret.mp4")
    (root / "link_pipe.mp4").symlink_to(outside / "pipe.mp4")
    (root / "link_dir").symlink_to(outside, target_is_directory=True)
    (root / "link_in.mp4").symlink_to(root / "sub" / "b.mp4")
    (root / "loop1.mp4").symlink_to(root / "loop2.mp4")
    (root / "loop2.mp4").symlink_to(root / "loop1.mp4")
    return root, outside


def _hostile_table(root: Path, outside: Path) -> list[tuple[bytes, str | None]]:
    """(line bytes, fate); fate ``None``: a blank line, not a row."""
    long_text = "w " * 3000
    nested = "[" * 40 + "]" * 40
    return [
        # Encoding and blank lines.
        (b"\xef\xbb\xbf" + _good("bom-first"), SHARD),  # a BOM on line 1 is an encoding marker
        (b"   \t\r", None),
        (b"", None),
        (b"\xef\xbb\xbf" + _good("bom-later"), "malformed"),
        (_good("bad-utf8")[:-2] + b'\xff"}', "not_utf8"),
        (_good("overlong")[:-1] + b', "x": "\xc0\xaf"}', "not_utf8"),
        (_good("cesu")[:-1] + b', "x": "\xed\xa0\x80"}', "not_utf8"),
        (b"\x0c", "malformed"),  # form feed: not JSON whitespace, so a row
        # Not standard JSON.
        (b"{not json", "malformed"),
        (_raw("nan", '"score": NaN'), "malformed"),
        (_raw("inf", '"score": Infinity'), "malformed"),
        (_raw("-inf", '"score": -Infinity'), "malformed"),
        (_raw("overflow", '"score": 1e999'), "malformed"),
        (_raw("bigint", '"score": 1' + "0" * 5000), "malformed"),
        (_raw("deep", '"x": ' + "[" * 100_000 + "]" * 100_000), "malformed"),
        (_raw("nested", f'"x": {nested}'), "malformed"),
        (_raw("twice", '"problem_id": "other"'), "malformed"),
        (_raw("lone-surrogate", '"note": "half a pair \\ud800"'), "malformed"),
        (_good("nul", problem="Which?\u0000\nA. x\nB. y"), "malformed"),
        (_good("bell-extra", note="ring \u0007"), "malformed"),
        (_line({**_row("ctl-key"), "k\u0001": 1}), "malformed"),
        (_good("tabs-ok", reasoning="a\tb\r\nc", note=["x", 1, None, {"y": 2.5}]), SHARD),
        # Wrong types anywhere.
        (b"[1, 2]", "malformed"),
        (b'"a row"', "malformed"),
        (b"null", "malformed"),
        (b"17", "malformed"),
        (_line(_row(3)), SHARD),  # an integer id, as NVlabs' generation script writes it: "3"
        (_line(_row(True)), "malformed"),  # a boolean is no id
        (_line(_row(3.5)), "malformed"),
        (_line(_row(["list-id"])), "malformed"),
        (_line(_row("dict-video", {"path": "a.mp4"})), "malformed"),
        (_good("null-problem", problem=None), "malformed"),
        (_good("null-option", problem="Which?", options=["x", None]), "malformed"),
        (_good("number-option", problem="Which?", options=["x", 2]), "malformed"),
        (_good("string-options", problem="Which?", options="A. x B. y"), "malformed"),
        (_good("answer-number", problem_type="numerical", problem="How many?", answer=3), "malformed"),
        (_good("reasoning-list", reasoning=["a"]), "malformed"),
        (_good("reasoning-zero", reasoning=0), "malformed"),
        (_good("data-type-list", data_type=["video"]), "malformed"),
        (_good("too-many-options", problem="Which?", options=[f"o{i}" for i in range(11)]), "too_long"),
        # Lengths.
        (b'{"x": "' + b"y" * LIMITS.line_bytes + b'"}', "too_long"),
        (b" " * (LIMITS.line_bytes + 10), None),  # a blank line, however long
        (_good("long-q", problem="Q" * (LIMITS.question_chars + 1) + "\nA. x\nB. y"), "too_long"),
        (_good("max-q", problem="Q" * LIMITS.question_chars + "\nA. x\nB. y"), SHARD),
        (_good("long-problem", problem=long_text * 10 + "\nA. x\nB. y"), "too_long"),
        (_good("long-r", reasoning="r" * (LIMITS.reasoning_chars + 1)), "too_long"),
        (_good("long-o", problem="Which?\nA. " + "o" * (LIMITS.option_chars + 1) + "\nB. y"), "too_long"),
        (_good("long-a", problem_type="open-ended", problem="Why?", answer="z" * 4001), "too_long"),
        (_good("i" * (LIMITS.id_chars + 1)), "too_long"),
        # Paths.
        (_good("up", video="../outside/secret.mp4"), "outside_root"),
        (_good("up-pipe", video="../outside/pipe.mp4"), "outside_root"),
        (_good("abs-out", video=str(outside / "secret.mp4")), "outside_root"),
        (_good("abs-pipe", video=str(outside / "pipe.mp4")), "outside_root"),
        (_good("abs-in", video=str(root / "sub" / "b.mp4")), SHARD),  # absolute, inside the root
        (_good("climb", video="sub/../../outside/secret.mp4"), "outside_root"),
        (_good("link-out", video="link_out.mp4"), "outside_root"),
        (_good("link-pipe", video="link_pipe.mp4"), "outside_root"),
        (_good("link-dir", video="link_dir/secret.mp4"), "outside_root"),
        (_good("link-in", video="link_in.mp4"), SHARD),
        (_good("dotdot-in", video="sub/../a.mp4"), SHARD),
        (_good("nested-in", video="sub/b.mp4"), SHARD),
        (_good("empty-video", video=""), "malformed"),
        (_good("nul-video", video="a.mp4\u0000.txt"), "malformed"),
        (_good("dot", video="."), "missing_video"),
        (_good("folder", video="sub"), "missing_video"),
        (_good("fifo-in", video="inside_pipe.mp4"), "missing_video"),
        (_good("loop", video="loop1.mp4"), "missing_video"),
        (_good("long-name", video="n" * 300 + ".mp4"), "missing_video"),
        (_good("absent", video="nope.mp4"), "missing_video"),
        (_good("text", video="notes.txt"), "unsupported_container"),
        # Ids: every one that survives gets its own key.
        (_good("a/b"), SHARD),
        (_good("a_b"), SHARD),
        (_good("A_B"), SHARD),
        (_good("."), SHARD),
        (_good(".."), SHARD),
        (_good("vidéo/ü"), SHARD),
        (_good("视频"), SHARD),
        (_good("e" * 900), SHARD),
        (_good("e" * 899 + "f"), SHARD),
        (_good(" a/b "), "duplicate_id"),  # ids are stripped: the same as line "a/b"
        (_good("a_b"), "duplicate_id"),
    ]


def test_every_hostile_line_gets_its_own_named_fate(tmp_path):
    root, outside = _layout(tmp_path)
    table = _hostile_table(root, outside)
    jsonl = tmp_path / "hostile.jsonl"
    jsonl.write_bytes(b"".join(line + b"\n" for line, _ in table))
    out = tmp_path / "shards"
    report = _build_within(BuildSettings(jsonl, root, out, max_samples_per_shard=7))

    expected = {number: fate for number, (_, fate) in enumerate(table, start=1) if fate is not None}
    fates = _fates(out)
    wrong = {
        n: (fates.get(n), fate, table[n - 1][0][:80]) for n, fate in expected.items() if fates.get(n) != fate
    }
    assert not wrong, wrong
    _check_accounting(report, jsonl, fates)
    manifest = json.loads((out / "dataset.json").read_text())["splits"]["train"]["build"]
    assert manifest["rejected"] == report.rejected and manifest["rows"] == len(expected)

    # What went in is the row as given: texts kept exactly, options from the problem.
    samples = {s["json"]["problem_id"]: s for s in _shard_samples(out)}
    assert samples["tabs-ok"]["json"]["reasoning"] == "a\tb\r\nc"
    assert samples["tabs-ok"]["json"]["note"] == ["x", 1, None, {"y": 2.5}]
    assert samples["link-in"]["mp4"] == (root / "sub" / "b.mp4").read_bytes()
    assert samples["视频"]["__key__"].startswith("__-") and samples["."]["__key__"].startswith("_-")
    # The rejects name the line's id and video where the row had them as strings.
    rejects = [json.loads(r) for r in (out / "train-rejects.jsonl").read_text().split("\n") if r]
    up = next(r for r in rejects if r["problem_id"] == "up")
    assert up["video"] == "../outside/secret.mp4" and "--allow-outside-root" in up["message"]


def test_outside_paths_need_the_flag(tmp_path):
    root, outside = _layout(tmp_path)
    table = [
        (_good("up", video="../outside/secret.mp4"), SHARD),
        (_good("abs-out", video=str(outside / "secret.mp4")), SHARD),
        (_good("link-out", video="link_out.mp4"), SHARD),
        (_good("inside", video="a.mp4"), SHARD),
        (_good("absent", video=str(outside / "nope.mp4")), "missing_video"),
    ]
    jsonl = tmp_path / "outside.jsonl"
    jsonl.write_bytes(b"".join(line + b"\n" for line, _ in table))
    refused = _build_within(BuildSettings(jsonl, root, tmp_path / "refused"))
    assert refused.written == 1 and refused.rejected == {"outside_root": 4}
    allowed = _build_within(BuildSettings(jsonl, root, tmp_path / "allowed", allow_outside_root=True))
    fates = _fates(tmp_path / "allowed")
    assert fates == {n: fate for n, (_, fate) in enumerate(table, start=1)}
    _check_accounting(allowed, jsonl, fates)
    secret = (outside / "secret.mp4").read_bytes()
    assert all(s["mp4"] == secret for s in _shard_samples(tmp_path / "allowed"))


def test_text_limits_are_settings(tmp_path):
    root, _ = _layout(tmp_path)
    jsonl = tmp_path / "limits.jsonl"
    lines = [_good("short", reasoning="r" * 50), _good("long", reasoning="r" * 51)]
    jsonl.write_bytes(b"\n".join(lines))  # no newline after the last row: still a row
    settings = BuildSettings(jsonl, root, tmp_path / "out", limits=TextLimits(reasoning_chars=50))
    report = build_shards(settings, progress=False)
    assert _fates(settings.out) == {1: SHARD, 2: "too_long"}
    _check_accounting(report, jsonl, _fates(settings.out))


# ---- Keys across interruptions -------------------------------------------------------------

KEY_IDS = ["a/b", "x", "a_b", "a/b", "A/B", "a_b", "y", "."]


def _key_rows(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "videos"
    root.mkdir()
    (root / "a.mp4").write_bytes(_video())
    jsonl = tmp_path / "keys.jsonl"
    jsonl.write_bytes(b"".join(_good(problem_id) + b"\n" for problem_id in KEY_IDS))
    return jsonl, root


def _tree(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != "dataset.json"}


@pytest.mark.parametrize("interrupt_at", range(2, 8))
def test_a_build_interrupted_anywhere_resumes_to_the_same_bytes(tmp_path, monkeypatch, interrupt_at):
    jsonl, root = _key_rows(tmp_path)
    whole = BuildSettings(jsonl, root, tmp_path / "whole", max_samples_per_shard=1)
    report = build_shards(whole, progress=False)
    assert report.written == 6 and report.rejected == {"duplicate_id": 2}
    expected = _tree(whole.out)

    resumed = BuildSettings(jsonl, root, tmp_path / "resumed", max_samples_per_shard=1)
    real_probe, calls = build_module.probe, []

    def probe_then_crash(item):
        calls.append(item)
        if len(calls) == interrupt_at + 1:
            raise KeyboardInterrupt
        return real_probe(item)

    monkeypatch.setattr(build_module, "probe", probe_then_crash)
    with pytest.raises(KeyboardInterrupt):
        build_shards(resumed, progress=False)
    monkeypatch.setattr(build_module, "probe", real_probe)
    again = build_shards(resumed, progress=False)
    assert again.resumed_from_line > 1
    assert _tree(resumed.out) == expected  # shards (keys included), rejects and state, byte for byte
    fates = _fates(resumed.out)
    assert fates == {
        1: SHARD,
        2: SHARD,
        3: SHARD,
        4: "duplicate_id",
        5: SHARD,
        6: "duplicate_id",
        7: SHARD,
        8: SHARD,
    }
    _check_accounting(again, jsonl, fates)


# ---- A damaged middle ------------------------------------------------------------------------


def _mdat_payload(data: bytes) -> tuple[int, int]:
    position = 0
    while position < len(data):
        size, kind = int.from_bytes(data[position : position + 4], "big"), data[position + 4 : position + 8]
        if kind == b"mdat":
            return position + 8, position + size
        position += size
    raise AssertionError("no mdat box")


def _middle_damaged_mp4() -> tuple[bytes, bytes]:
    """A 600-frame mp4 (keyframes every 120-250 frames) and a copy with the middle 10% of its
    frame data zeroed: the first and last GOPs are intact, the middle ones are not."""
    count, size = 600, 56
    frames = np.empty((count, size, size, 3), dtype=np.uint8)
    for i in range(count):
        frames[i] = (i * 3) % 200
        frames[i, 20:36, (i * 2) % (size - 16) : (i * 2) % (size - 16) + 16] = 255
    good = encode_video(frames, 25.0, "mp4")
    start, end = _mdat_payload(good)
    width = (end - start) // 10
    middle = (start + end) // 2 - width // 2
    return good, good[:middle] + bytes(width) + good[middle + width :]


def _decodes_fully(data: bytes) -> bool:
    try:
        with av.open(io.BytesIO(data)) as container:
            for _ in container.decode(video=0):
                pass
    except av.error.FFmpegError:
        return False
    return True


def test_the_probe_finds_a_damaged_middle_that_first_and_last_frames_miss(tmp_path):
    good, damaged = _middle_damaged_mp4()
    # Preconditions: the damage is real (PyAV cannot decode the whole file, and sampling frames
    # over it fails as training would), yet the old probe of the first and last frame passes.
    assert _decodes_fully(good) and not _decodes_fully(damaged)
    with pytest.raises(VideoDecodeError, match="Invalid data"):
        decode_video(damaged, 16, 56 * 56)
    assert probe_video(damaged, 2).num_frames == 600
    assert probe_video(good).num_frames == 600

    root = tmp_path / "videos"
    root.mkdir()
    (root / "good.mp4").write_bytes(good)
    (root / "damaged.mp4").write_bytes(damaged)
    jsonl = tmp_path / "videos.jsonl"
    jsonl.write_bytes(_good("good", video="good.mp4") + b"\n" + _good("damaged", video="damaged.mp4") + b"\n")
    report = build_shards(BuildSettings(jsonl, root, tmp_path / "out"), progress=False)
    assert _fates(tmp_path / "out") == {1: SHARD, 2: "undecodable"}
    _check_accounting(report, jsonl, _fates(tmp_path / "out"))
    message = json.loads((tmp_path / "out" / "train-rejects.jsonl").read_text())["message"]
    assert "decoding fails between" in message and " s and " in message  # names the failing time
    # --probe-frames 2 is the old probe: the damaged video would be written.
    old = build_shards(BuildSettings(jsonl, root, tmp_path / "old", probe_frames=2), progress=False)
    assert old.written == 2


def test_videos_beyond_the_duration_and_size_limits_are_rejected(tmp_path):
    root = tmp_path / "videos"
    root.mkdir()
    (root / "a.mp4").write_bytes(_video(8))  # 2 s at 4 fps
    (root / "b.mp4").write_bytes(_video(16))  # 4 s
    jsonl = tmp_path / "v.jsonl"
    jsonl.write_bytes(_good("a", video="a.mp4") + b"\n" + _good("b", video="b.mp4") + b"\n")
    report = build_shards(BuildSettings(jsonl, root, tmp_path / "o1", max_video_seconds=3), progress=False)
    assert _fates(tmp_path / "o1") == {1: SHARD, 2: "video_too_long"}
    _check_accounting(report, jsonl, _fates(tmp_path / "o1"))
    limit = (root / "a.mp4").stat().st_size
    report = build_shards(BuildSettings(jsonl, root, tmp_path / "o2", max_video_bytes=limit), progress=False)
    assert _fates(tmp_path / "o2") == {1: SHARD, 2: "video_too_large"}


# ---- Bad arguments: one line, exit 2 ---------------------------------------------------------


def _cli_build(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``lvrl data build ARGV`` in-process (the parser and handler the CLI uses): exit status, stderr."""
    parser = argparse.ArgumentParser(prog="lvrl data")
    register(parser)
    with pytest.raises(SystemExit) as exited:
        args = parser.parse_args(["build", *argv])
        args.run(args)
    return exited.value.code, capsys.readouterr().err


def test_a_bad_split_or_output_is_one_line_and_exit_2(tmp_path, capsys):
    root = tmp_path / "videos"
    root.mkdir()
    jsonl = tmp_path / "x.jsonl"
    jsonl.write_bytes(_good("a") + b"\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    common = ["--jsonl", str(jsonl), "--videos-root", str(root), "--no-progress"]
    for extra, needle in (
        (["--out", str(tmp_path / "o"), "--split", "../escape"], "not a safe file-name part"),
        (["--out", str(a_file)], "is a file, not a folder"),
        (["--out", str(a_file / "below")], "cannot create the output folder"),
    ):
        status, stderr = _cli_build([*common, *extra], capsys)
        errors = [line for line in stderr.splitlines() if "error:" in line]
        assert status == 2 and len(errors) == 1 and needle in errors[0], stderr
        assert "Traceback" not in stderr
    for split in ("", "a/b", "-x", "a.b", "x" * 65):
        with pytest.raises(build_module.BuildError, match="safe file-name part"):
            build_shards(BuildSettings(jsonl, root, tmp_path / "o", split=split), progress=False)
