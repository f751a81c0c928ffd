"""`lvrl data build --format videomme|longvideobench|mlvu|lvbench`: a benchmark's annotation file +
videos -> shards of multiple-choice rows, a rejects file and the manifest.

Each format's fixture (tests/fixtures/benchmarks/, the published layout) gets a few hostile
entries appended (a path out of the root, a missing video, a repeated id) and tiny videos made
here; `lvrl data build` runs in this process (:func:`helpers.cli.run_lvrl`): the process
boundary is not what is tested.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers.cli import TESTS_DIR, run_lvrl, run_lvrl_expecting_failure

from datamodules.shards import resolve_shards
from datamodules.stream import VideoQAStream
from datatools import released_build as build_module
from datatools.benchmarks import LONGVIDEOBENCH, LVBENCH, MLVU, VIDEOMME
from datatools.released_build import BuildError, BuildSettings, build_shards
from datatools.video_encode import encode_video

FIXTURES = TESTS_DIR / "fixtures" / "benchmarks"


def _video(shade: int) -> bytes:
    levels = (np.arange(8) * 9 + shade).astype(np.uint8)
    frames = np.broadcast_to(levels[:, None, None, None], (8, 56, 56, 3)).copy()
    frames[:, 20:36, 20:36] = 255  # a square, so the codec has edges to encode
    return encode_video(frames, 4.0, "mp4")


def _videos(root: Path, names: list[str]) -> Path:
    videos = root / "videos"
    videos.mkdir(parents=True)
    for shade, name in enumerate(names):
        (videos / name).write_bytes(_video(20 * shade))
    (root / "outside.mp4").write_bytes(_video(200))  # beside the root, where '../' points
    return videos


def _json_list(path: Path, entries: list[Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entries, indent=1, ensure_ascii=False), encoding="utf-8")
    return path


def _fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))


def _videomme(root: Path) -> tuple[Path, Path]:
    entries = _fixture("videomme.json")
    entries += [
        {**entries[0], "question_id": "003-1", "videoID": "../outside"},
        {**entries[0], "question_id": "004-1", "videoID": "nope"},
        {**entries[1], "question": "Asked again."},  # question_id 001-2 again
    ]
    return _json_list(root / "videomme.json", entries), _videos(root, ["fFjv93ACGo8.mp4", "rXHfXBarT1o.mp4"])


def _longvideobench(root: Path) -> tuple[Path, Path]:
    entries = _fixture("lvb_val.json")
    videos = _videos(root, ["86CxyhFV9MI.mp4", "uK8X6S1JwQo.mp4"])
    (videos / "link.mp4").symlink_to(root / "outside.mp4")
    entries += [
        {**entries[2], "id": "abs_0", "video_path": str(root / "outside.mp4")},
        {**entries[2], "id": "link_0", "video_path": "link.mp4"},
        {**entries[2], "id": "choice_0", "correct_choice": 4},
    ]
    return _json_list(root / "lvb_val.json", entries), videos


def _mlvu(root: Path) -> tuple[Path, Path]:
    entries = _fixture("mlvu_1_plotQA.json")
    entries += [
        entries[0],  # the same question on the same video: the same id
        {**entries[2], "video": "../outside.mp4"},
        {**entries[2], "answer": "It starts to snow"},
    ]
    return _json_list(root / "1_plotQA.json", entries), _videos(root, ["movie101_66.mp4", "movie101_8.mp4"])


def _lvbench(root: Path) -> tuple[Path, Path]:
    lines = (FIXTURES / "lvbench_video_info.meta.jsonl").read_text(encoding="utf-8").splitlines()
    video = json.loads(lines[1])
    lines += [
        json.dumps(video),  # record 3's video and question again: a duplicate of a written row
        json.dumps({**video, "key": "../outside", "qa": [{**video["qa"][0], "uid": 141}]}),
        "{broken",
        json.dumps({**video, "key": "absent", "qa": [{**video["qa"][0], "uid": "142"}]}),
    ]
    root.mkdir(parents=True)
    jsonl = root / "video_info.meta.jsonl"
    jsonl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return jsonl, _videos(root, ["7Ldmdtg0rQk.mp4", "Xe2xQ9dJ3Lg.mp4"])


# format -> (inputs, {problem_id: (answer, source_category)} of the rows written,
#            {record number: reason} of the rows rejected)
CASES: dict[str, tuple[Any, dict[str, tuple[str, Any]], dict[int, str]]] = {
    VIDEOMME: (
        _videomme,
        {
            "001-1": ("C", "Counting Problem"),
            "001-2": ("A", "Information Synopsis"),
            "002-1": ("B", "Temporal Reasoning"),
        },
        {4: "outside_root", 5: "missing_video", 6: "duplicate_id"},
    ),
    LONGVIDEOBENCH: (
        _longvideobench,
        {"86CxyhFV9MI_0": ("A", "TOS"), "86CxyhFV9MI_1": ("D", "E3E"), "uK8X6S1JwQo_0": ("B", "O2E")},
        {4: "outside_root", 5: "outside_root", 6: "answer_not_an_option"},
    ),
    MLVU: (
        _mlvu,
        {},  # ids are derived; checked by their answers below
        {4: "duplicate_id", 5: "outside_root", 6: "answer_not_an_option"},
    ),
    LVBENCH: (
        _lvbench,
        {
            "5": ("A", ["key information retrieval"]),
            "6": ("C", ["reasoning", "event understanding"]),
            "140": ("D", ["entity recognition"]),
        },
        {4: "duplicate_id", 5: "outside_root", 6: "malformed", 7: "missing_video"},
    ),
}


def _rejects(out: Path, split: str) -> dict[int, str]:
    lines = (out / f"{split}-rejects.jsonl").read_text(encoding="utf-8").splitlines()
    return {json.loads(line)["line"]: json.loads(line)["reason"] for line in lines}


@pytest.mark.parametrize("benchmark", [VIDEOMME, LONGVIDEOBENCH, MLVU, LVBENCH])
def test_a_benchmark_builds_into_multiple_choice_shards_with_named_rejects(benchmark, tmp_path):
    make_inputs, written, rejected = CASES[benchmark]
    annotations, videos = make_inputs(tmp_path / "inputs")
    out = tmp_path / "shards"
    done = run_lvrl(
        "data", "build", "--format", benchmark, "--annotations", str(annotations),
        "--videos-root", str(videos), "--out", str(out), "--split", benchmark, "--no-progress",
    )  # fmt: skip
    rows = 3 + len(rejected)
    assert f"{benchmark}: {rows} rows, 3 written" in done.stdout, done.stdout
    assert _rejects(out, benchmark) == rejected
    if benchmark == LVBENCH:  # numbers are records (questions), and the messages say so
        records = (out / f"{benchmark}-rejects.jsonl").read_text(encoding="utf-8").splitlines()
        assert json.loads(records[0])["message"] == "problem_id also on record 3"
        assert json.loads(records[2])["message"].startswith("line 5: not JSON")

    # The shards stream as ordinary multiple-choice samples with the video decoded.
    stream = VideoQAStream(resolve_shards(str(out / f"{benchmark}-*.tar")), num_frames=4, max_pixels=56 * 56)
    samples = {s.row.problem_id: s for s in stream}
    assert stream.skipped.value == 0 and len(samples) == 3
    for sample in samples.values():
        row = sample.row
        assert row.is_multiple_choice and row.category is None and row.extra["benchmark"] == benchmark
        assert len(row.options) >= 4 and row.answer in "ABCDE"
        assert sample.video.frames.shape[1:] == (56, 56, 3)
    if benchmark == MLVU:
        assert sorted(s.row.answer for s in samples.values()) == ["A", "B", "C"]
        assert {s.row.extra["source_category"] for s in samples.values()} == {"plotQA"}
    else:
        assert {k: (s.row.answer, s.row.extra["source_category"]) for k, s in samples.items()} == written

    manifest = json.loads((out / "dataset.json").read_text())["splits"][benchmark]["build"]
    assert manifest["format"] == benchmark and manifest["rows"] == rows
    assert manifest["per_category"] == {"none": 3}


def test_a_resumed_lvbench_build_gives_the_same_bytes(tmp_path, monkeypatch):
    """LVBench records are questions, not lines: an interruption between two questions of one
    video line resumes at the right one."""
    annotations, videos = _lvbench(tmp_path / "inputs")

    def settings(out: str) -> BuildSettings:
        return BuildSettings(
            annotations, videos, tmp_path / out, max_samples_per_shard=1, source_format=LVBENCH
        )

    build_shards(settings("whole"), progress=False)
    expected = {p.name: p.read_bytes() for p in sorted((tmp_path / "whole").iterdir())}
    real_probe, calls = build_module.probe, []

    def probe_then_crash(item):
        calls.append(item)
        if len(calls) == 3:  # questions 1 and 2 (one video line) are in complete shards
            raise KeyboardInterrupt
        return real_probe(item)

    monkeypatch.setattr(build_module, "probe", probe_then_crash)
    with pytest.raises(KeyboardInterrupt):
        build_shards(settings("resumed"), progress=False)
    monkeypatch.setattr(build_module, "probe", real_probe)
    state = json.loads((tmp_path / "resumed" / "train-build-state.json").read_text())
    assert state["next_line"] == 2 and not state["complete"]  # the second question of line 1
    report = build_shards(settings("resumed"), progress=False)
    assert report.resumed_from_line == 2
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "resumed").iterdir())} == expected

    # Another format over the same output is other inputs: refused without --overwrite.
    with pytest.raises(BuildError, match="format"):
        build_shards(
            BuildSettings(annotations, videos, tmp_path / "resumed", max_samples_per_shard=1), progress=False
        )


def test_a_file_that_is_not_annotations_is_one_line_and_exit_2(tmp_path):
    parquet = tmp_path / "test-00000-of-00001.parquet"
    parquet.write_bytes(b"PAR1" + bytes(64) + b"PAR1")
    videos = tmp_path / "videos"
    videos.mkdir()
    common = ["data", "build", "--videos-root", str(videos), "--out", str(tmp_path / "o"), "--no-progress"]
    failed = run_lvrl_expecting_failure(*common, "--format", VIDEOMME, "--annotations", str(parquet))
    errors = [line for line in failed.stderr.splitlines() if "error:" in line]
    assert failed.returncode == 2 and len(errors) == 1 and "Parquet" in errors[0], failed.stderr
    assert not list((tmp_path / "o").glob("train-*"))  # refused before anything was written
    broken = _json_list(tmp_path / "lvb_val.json", [{"id": "x"}])
    broken.write_text(broken.read_text()[:-3])
    failed = run_lvrl_expecting_failure(*common, "--format", LONGVIDEOBENCH, "--annotations", str(broken))
    assert failed.returncode == 2 and "is not a JSON list" in failed.stderr
    assert "Traceback" not in failed.stderr
    failed = run_lvrl_expecting_failure(*common, "--format", "kinetics", "--annotations", str(broken))
    assert failed.returncode == 2 and "invalid choice: 'kinetics'" in failed.stderr


def _as_parquet(json_path: Path, benchmark: str) -> Path:
    """The JSON list's entries as the benchmark's Parquet file: Video-MME's columns as they are,
    LongVideoBench's candidates as ``option0`` .. ``option4`` padded with "N/A" (its validation
    parquet, the file lmms-eval reads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    entries = json.loads(json_path.read_text(encoding="utf-8"))
    if benchmark == LONGVIDEOBENCH:
        for entry in entries:
            candidates = entry.pop("candidates")
            entry.update({f"option{i}": (candidates + ["N/A"] * 5)[i] for i in range(5)})
    name = "test-00000-of-00001.parquet" if benchmark == VIDEOMME else "validation-00000-of-00001.parquet"
    path = json_path.with_name(name)
    pq.write_table(pa.Table.from_pylist(entries), path)
    return path


@pytest.mark.parametrize("benchmark", [VIDEOMME, LONGVIDEOBENCH])
def test_a_parquet_annotation_file_builds_as_its_json_rows(benchmark, tmp_path):
    # The same entries as the JSON test above, in the Parquet file the benchmark publishes: the
    # same rows written (ids, letters, options, videos) and the same rejects.
    make_inputs, written, rejected = CASES[benchmark]
    annotations, videos = make_inputs(tmp_path / "inputs")
    built = {}
    for layout, path in (("json", annotations), ("parquet", _as_parquet(annotations, benchmark))):
        out = tmp_path / layout
        run_lvrl(
            "data", "build", "--format", benchmark, "--annotations", str(path),
            "--videos-root", str(videos), "--out", str(out), "--split", benchmark, "--no-progress",
        )  # fmt: skip
        stream = VideoQAStream(
            resolve_shards(str(out / f"{benchmark}-*.tar")), num_frames=4, max_pixels=56 * 56
        )
        rows = {s.row.problem_id: (s.row.answer, s.row.options, s.row.video) for s in stream}
        built[layout] = (rows, _rejects(out, benchmark))
    assert built["parquet"] == built["json"]
    assert set(built["parquet"][0]) == set(written) and built["parquet"][1] == rejected
    if benchmark == LONGVIDEOBENCH:  # the 4-candidate question: its "N/A" padding is no option
        assert len(built["parquet"][0]["86CxyhFV9MI_1"][1]) == 4


def test_lvbench_videos_as_its_download_script_stores_them(tmp_path):
    # LVBench's scripts/download.sh runs video2dataset with --output_format files: numbered shard
    # folders of numbered videos, each with a sidecar JSON whose url is the YouTube address built
    # from the annotation's key. The build finds each key's video through its sidecar.
    annotations = tmp_path / "video_info.meta.jsonl"
    annotations.write_bytes((FIXTURES / "lvbench_video_info.meta.jsonl").read_bytes())
    videos = tmp_path / "videos"
    (videos / "00000").mkdir(parents=True)
    for number, (key, shade) in enumerate([("Xe2xQ9dJ3Lg", 60), ("7Ldmdtg0rQk", 30)]):
        stem = videos / "00000" / f"00000{number:04d}"
        stem.with_suffix(".mp4").write_bytes(_video(shade))
        meta = {"url": f"https://www.youtube.com/watch?v={key}", "key": stem.name, "status": "success"}
        stem.with_suffix(".json").write_text(json.dumps(meta), encoding="utf-8")
    (videos / "00000" / "000000002.json").write_text('{"url": "https://example.org/x"}', encoding="utf-8")
    out = tmp_path / "shards"
    report = build_shards(BuildSettings(annotations, videos, out, source_format=LVBENCH), progress=False)
    assert report.written == 3 and not report.rejected
    shards = resolve_shards(str(out / "train-*.tar"))
    stream = VideoQAStream(shards, num_frames=4, max_pixels=56 * 56, keep_video_bytes=True)
    sources = {sample.row.problem_id: sample.video_bytes for sample in stream}
    assert sources["5"] == sources["6"] == (videos / "00000" / "000000001.mp4").read_bytes()  # 7Ldmdtg0rQk
    assert sources["140"] == (videos / "00000" / "000000000.mp4").read_bytes()  # Xe2xQ9dJ3Lg
