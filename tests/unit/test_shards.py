"""WebDataset shard writing and resolving, and ``lvrl data synth`` end to end (real tar, PyAV, webdataset)."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest
import webdataset as wds

from app.commands import data as data_commands
from datamodules.rows import CATEGORIES, parse_row
from datamodules.shards import resolve_shards
from datamodules.video import decode_video
from datatools.shard_writer import count_samples, write_manifest, write_shards
from datatools.synthetic import SynthConfig, encoded_samples, make_row

TINY = SynthConfig(num_frames=16, fps=2.0, size=28, min_scenes=2, max_scenes=3)


def _fake_samples(count: int) -> list[tuple[str, bytes, dict]]:
    # Shard mechanics do not care what the bytes are; real videos are covered below.
    return [(f"k{i:03d}", bytes([i]) * 10, {"i": i}) for i in range(count)]


def test_synth_shards_list_with_tar_and_read_back_with_webdataset(tmp_path: Path) -> None:
    paths = write_shards(
        encoded_samples(TINY, "train", 5), tmp_path, "train", max_samples_per_shard=2, progress=False
    )
    assert [Path(p).name for p in paths] == ["train-00000.tar", "train-00001.tar", "train-00002.tar"]
    assert [count_samples(p) for p in paths] == [2, 2, 1]

    listing = subprocess.run(
        ["tar", "tf", paths[0]], check=True, capture_output=True, text=True
    ).stdout.split()
    assert listing == [
        "synth-train-000000.json",
        "synth-train-000000.mp4",
        "synth-train-000001.json",
        "synth-train-000001.mp4",
    ]

    samples = list(wds.WebDataset(paths, shardshuffle=False, empty_check=False))
    assert [s["__key__"] for s in samples] == [f"synth-train-{i:06d}" for i in range(5)]
    for index, sample in enumerate(samples):
        row = parse_row(json.loads(sample["json"]))
        assert row == make_row(TINY, "train", index)
        video = decode_video(sample["mp4"], num_frames=TINY.num_frames, max_pixels=28 * 28)
        assert video.frames.shape == (TINY.num_frames, 28, 28, 3)


def test_write_shards_is_reproducible_and_leaves_no_partial_files(tmp_path: Path) -> None:
    first = write_shards(_fake_samples(3), tmp_path / "a", "val", max_samples_per_shard=2, progress=False)
    second = write_shards(_fake_samples(3), tmp_path / "b", "val", max_samples_per_shard=2, progress=False)
    assert [Path(p).read_bytes() for p in first] == [Path(p).read_bytes() for p in second]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["val-00000.tar", "val-00001.tar"]
    assert write_shards([], tmp_path / "c", "test", progress=False) == []
    assert list((tmp_path / "c").iterdir()) == []


@pytest.mark.parametrize("bad_key", ["has.dot", ""])
def test_write_shards_rejects_bad_keys_and_drops_the_open_shard(tmp_path: Path, bad_key: str) -> None:
    samples = [*_fake_samples(3), (bad_key, b"x", {})]
    with pytest.raises(ValueError, match="invalid sample key"):
        write_shards(samples, tmp_path, "train", max_samples_per_shard=2, progress=False)
    # The completed shard stays, the interrupted one is removed rather than left half-written.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train-00000.tar"]
    with pytest.raises(ValueError, match="duplicate sample key"):
        write_shards([*_fake_samples(2), ("k000", b"x", {})], tmp_path / "dup", "train", progress=False)


def test_resolve_shards_expands_braces_globs_and_lists(tmp_path: Path) -> None:
    for name in ["train-00002.tar", "train-00000.tar", "train-00001.tar", "val-00000.tar"]:
        (tmp_path / name).write_bytes(b"")
    train = [str(tmp_path / f"train-{i:05d}.tar") for i in range(3)]
    assert resolve_shards(str(tmp_path / "train-{00000..00002}.tar")) == train
    assert resolve_shards(str(tmp_path / "train-*.tar")) == train
    assert resolve_shards([str(tmp_path / "val-00000.tar"), str(tmp_path / "train-0000[01].tar")]) == [
        str(tmp_path / "val-00000.tar"),
        *train[:2],
    ]
    assert resolve_shards(tmp_path / "val-00000.tar") == [str(tmp_path / "val-00000.tar")]
    assert resolve_shards("pipe:cat remote.tar") == ["pipe:cat remote.tar"]


def test_resolve_shards_errors_name_the_spec(tmp_path: Path) -> None:
    (tmp_path / "train-00000.tar").write_bytes(b"")
    spec = str(tmp_path / "train-{00000..00001}.tar")
    with pytest.raises(
        FileNotFoundError, match=r"train-00001\.tar.*does not exist.*train-\{00000\.\.00001\}"
    ):
        resolve_shards(spec)
    with pytest.raises(FileNotFoundError, match=r"no shard matches the glob .*test-\*\.tar"):
        resolve_shards(str(tmp_path / "test-*.tar"))
    with pytest.raises(FileNotFoundError, match="names the folder"):
        resolve_shards(str(tmp_path))
    for empty in ("", [], [""], "  "):
        with pytest.raises(ValueError, match="empty shard spec"):
            resolve_shards(empty)


def test_write_manifest_counts_samples(tmp_path: Path) -> None:
    paths = write_shards(_fake_samples(5), tmp_path, "train", max_samples_per_shard=2, progress=False)
    manifest = json.loads(write_manifest(tmp_path, {"train": paths, "val": []}, {"seed": 3}).read_text())
    assert manifest["config"] == {"seed": 3}
    assert manifest["splits"]["train"]["num_samples"] == 5
    assert manifest["splits"]["train"]["pattern"] == "train-{00000..00002}.tar"
    assert [s["num_samples"] for s in manifest["splits"]["train"]["shards"]] == [2, 2, 1]
    assert manifest["splits"]["val"] == {"num_samples": 0, "shards": []}


def _synth_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lvrl data")
    data_commands.register(parser)
    return parser


TINY_ARGS = ["--frames", "16", "--size", "28", "--max-scenes", "3", "--samples-per-shard", "4"]


def test_data_synth_command_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "synth"
    argv = ["synth", "--out", str(out), "--num-train", "9", "--num-val", "4", "--num-test", "0", *TINY_ARGS]
    args = _synth_parser().parse_args(argv)
    args.run(args)
    printed = capsys.readouterr().out
    assert "train: 9 samples in 3 shards" in printed and "val: 4 samples in 1 shard," in printed
    assert "test: skipped" in printed

    manifest = json.loads((out / "dataset.json").read_text())
    assert manifest["config"]["num_frames"] == 16 and manifest["config"]["size"] == 28
    assert manifest["splits"]["train"]["num_samples"] == 9
    train = resolve_shards(str(out / manifest["splits"]["train"]["pattern"]))
    rows = [
        parse_row(json.loads(s["json"])) for s in wds.WebDataset(train, shardshuffle=False, empty_check=False)
    ]
    assert [r.problem_id for r in rows] == [f"synth-train-{i:06d}" for i in range(9)]
    assert {r.category for r in rows} == set(CATEGORIES)
    assert all(r.extra["video_meta"]["num_frames"] == 16 for r in rows)

    # A second run must not silently mix with the first one's shards.
    with pytest.raises(SystemExit, match="--overwrite"):
        args.run(args)
    args = _synth_parser().parse_args(
        [*argv[:4], "2", "--num-val", "0", "--num-test", "0", *TINY_ARGS, "--overwrite"]
    )
    args.run(args)
    assert sorted(p.name for p in out.iterdir()) == ["dataset.json", "train-00000.tar"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--size", "57"], "even side"),
        (["--frames", "6", "--max-scenes", "4"], "too few"),
        (["--min-scenes", "2", "--max-scenes", "7"], "distinct colours"),
    ],
)
def test_data_synth_rejects_bad_values(tmp_path: Path, extra: list[str], message: str) -> None:
    args = _synth_parser().parse_args(["synth", "--out", str(tmp_path), *extra])
    with pytest.raises(SystemExit, match=message):
        args.run(args)
    assert list(tmp_path.iterdir()) == []


def test_data_synth_options_are_documented(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _synth_parser()
    synth = parser._subparsers._group_actions[0].choices["synth"]  # argparse keeps sub-parsers here
    assert all(action.help for action in synth._actions)
    with pytest.raises(SystemExit):
        parser.parse_args(["synth", "--out", "x", "--num-train", "-1"])
    assert "negative" in capsys.readouterr().err
