"""bench/zoom_oracle_data.py: the oracle-trace copy of a random-trace zoom build holds the random
build's videos byte for byte and the oracle render's rows, and refuses renders that differ in
anything but the traces (a tiny zoom build: 512 frames in 4 stretches, 6 questions)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest
from helpers.cli import run_lvrl

from bench.zoom_oracle_data import compose, render_command, shard_members

TINY = ["--frames", "512", "--slots", "4", "--num-train", "4", "--num-val", "2", "--num-test", "0"]


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("zoom")
    random, rows = root / "random", root / "rows"
    run_lvrl("data", "zoom", "--out", str(random), *TINY, "--samples-per-shard", "2")
    run_lvrl(*render_command(random, rows))
    return random, rows


def test_the_copy_has_the_random_builds_videos_and_the_oracle_rows(builds, tmp_path: Path) -> None:
    random, rows = builds
    assert compose(random, rows, tmp_path / "oracle") == 6
    shards = sorted(p.name for p in random.glob("*.tar"))
    assert sorted(p.name for p in (tmp_path / "oracle").glob("*.tar")) == shards
    for name in shards:
        copy, videos, oracle = (
            shard_members(folder / name) for folder in (tmp_path / "oracle", random, rows)
        )
        assert list(copy) == list(videos)
        for key, files in copy.items():
            assert files["mp4"] == videos[key]["mp4"]  # the random build's bytes
            assert files["json"] == oracle[key]["json"]
            assert json.loads(files["json"])["tool_trace"]["kind"] == "oracle"
    manifest = json.loads((tmp_path / "oracle" / "dataset.json").read_text())
    assert manifest["config"]["trace_requests"] == "oracle"


def test_a_render_that_differs_beyond_the_traces_is_refused(builds, tmp_path: Path) -> None:
    random, rows = builds
    tampered = tmp_path / "rows"
    tampered.mkdir()
    (tampered / "dataset.json").write_text((rows / "dataset.json").read_text())
    for shard in rows.glob("*.tar"):
        with tarfile.open(shard) as source, tarfile.open(tampered / shard.name, "w") as target:
            for member in source.getmembers():
                payload = source.extractfile(member).read()  # type: ignore[union-attr]
                if member.name == "synth-val-000001.json":
                    payload = json.dumps({**json.loads(payload), "answer": "<answer>Z</answer>"}).encode()
                    member.size = len(payload)
                target.addfile(member, io.BytesIO(payload))
    with pytest.raises(
        ValueError, match="synth-val-000001: the oracle render's row differs beyond its trace"
    ):
        compose(random, tampered, tmp_path / "oracle")


def test_a_render_with_other_settings_is_refused(builds, tmp_path: Path) -> None:
    random, rows = builds
    other = tmp_path / "rows"
    other.mkdir()
    for shard in rows.glob("*.tar"):
        (other / shard.name).write_bytes(shard.read_bytes())
    manifest = json.loads((rows / "dataset.json").read_text())
    manifest["config"]["noise"] = 3
    (other / "dataset.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="settings differ"):
        compose(random, other, tmp_path / "oracle")


def test_a_random_build_with_given_oracle_rows_is_copied_too(builds, tmp_path: Path) -> None:
    # Its share of given rows is a trace setting: its oracle copy is the plain build's, byte for byte.
    plain, rows = builds
    mixed = tmp_path / "mixed"
    run_lvrl(
        "data", "zoom", "--out", str(mixed), *TINY, "--samples-per-shard", "2", "--given-oracle-share", "1"
    )
    assert compose(mixed, rows, tmp_path / "from-mixed") == compose(plain, rows, tmp_path / "from-plain") == 6
    for shard in plain.glob("*.tar"):
        assert (tmp_path / "from-mixed" / shard.name).read_bytes() == (
            tmp_path / "from-plain" / shard.name
        ).read_bytes()
