"""The zoom task's oracle-trace data as a copy of an existing random-trace build: the same rows and
the same video bytes, each row's tool trace replaced by the oracle trace.

The issue-48 comparison trains its oracle-crop baseline on ``lvrl data zoom --trace-requests
oracle`` and every other setting on the random-trace build. Built separately, the two need not
hold the same videos: an encoder change between the builds (617409d made the encoding
byte-stable) leaves decoded frames a few levels apart, so the baseline would see other pixels
than the runs it is compared with. This tool renders the oracle rows with the random build's
settings (the videos of that render are discarded), checks that every row but its trace is the
same, and writes shards with the random build's video bytes and the oracle rows, under the same
shard names. ``provenance.json`` says how it was made.

    python bench/zoom_oracle_data.py --random DATA --out ORACLE_DATA
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import tarfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.grpo_runs import run_lvrl
from evaluation.provenance import provenance

RENDER_FLAGS = {
    "num_frames": "--frames",
    "fps": "--fps",
    "slots": "--slots",
    "size": "--size",
    "seed": "--seed",
    "listed_times": "--listed-times",
    "trace_calls": "--trace-calls",
}
"""The build settings ``lvrl data zoom`` takes as flags (the others are its fixed defaults, and
the rendered manifest is checked against the random build's, so a difference there is caught)."""


def render_command(random_data: Path, out: Path) -> list[str]:
    """``lvrl data zoom`` arguments that render ``random_data``'s rows with oracle traces."""
    manifest = json.loads((random_data / "dataset.json").read_text())
    config, splits = manifest["config"], manifest["splits"]
    command = ["data", "zoom", "--out", str(out), "--trace-requests", "oracle"]
    for key, flag in RENDER_FLAGS.items():
        command += [flag, str(config[key])]
    for split in ("train", "val", "test"):
        command += [f"--num-{split}", str(splits.get(split, {}).get("num_samples", 0))]
    first = next(iter(splits.values()))["shards"][0]["num_samples"]
    return [*command, "--samples-per-shard", str(first)]


def shard_members(shard: Path) -> dict[str, dict[str, bytes]]:
    """``key -> extension -> bytes`` of one shard, in the shard's order."""
    members: dict[str, dict[str, bytes]] = {}
    with tarfile.open(shard) as tar:
        for member in tar.getmembers():
            key, _, extension = member.name.rpartition(".")
            reader = tar.extractfile(member)
            if reader is not None:
                members.setdefault(key, {})[extension] = reader.read()
    return members


def write_members(target: Path, members: dict[str, dict[str, bytes]]) -> None:
    """A shard at ``target`` of ``key -> extension -> bytes`` samples, in order, written whole
    (to a ``.partial`` file first, renamed when complete)."""
    partial = target.with_name(target.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        for key, files in members.items():
            for extension, payload in sorted(files.items()):
                info = tarfile.TarInfo(f"{key}.{extension}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    partial.rename(target)


def without_trace(row: dict[str, Any]) -> dict[str, Any]:
    """The row without its tool trace (a key of the row as written; ``extra.tool_trace`` once read)."""
    return {key: value for key, value in row.items() if key != "tool_trace"}


def compose(random_data: Path, oracle_rows: Path, out: Path) -> int:
    """Shards in ``out`` named as ``random_data``'s, each sample its video bytes and
    ``oracle_rows``' row; returns the number of samples. Refuses rows that differ in anything
    but the trace, and shards whose keys differ."""
    manifest = json.loads((oracle_rows / "dataset.json").read_text())
    random_config = json.loads((random_data / "dataset.json").read_text())["config"]
    # The traces may differ (the random build may give some rows the oracle request); nothing else.
    traces = {"trace_requests": "random", "given_oracle_share": random_config.get("given_oracle_share", 0.0)}
    if {**manifest["config"], **traces} != random_config:
        raise ValueError("the oracle render's settings differ from the random build's beyond its traces")
    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for shard in sorted(random_data.glob("*.tar")):
        videos, rows = shard_members(shard), shard_members(oracle_rows / shard.name)
        if list(videos) != list(rows):
            raise ValueError(f"{shard.name}: the oracle render holds other samples than the random build")
        for key, files in videos.items():
            if without_trace(json.loads(files["json"])) != without_trace(json.loads(rows[key]["json"])):
                raise ValueError(f"{key}: the oracle render's row differs beyond its trace")
        write_members(
            out / shard.name, {key: {**files, "json": rows[key]["json"]} for key, files in videos.items()}
        )
        count += len(videos)
    (out / "dataset.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return count


def build(random_data: Path, out: Path, log_dir: Path) -> int:
    """Render the oracle rows (``lvrl data zoom``'s output and attempt record in ``log_dir``),
    write the copy to ``out`` with its ``provenance.json``; returns the number of samples."""
    rows = out.with_name(out.name + ".rows")
    run_lvrl(log_dir, render_command(random_data, rows), log_name="data-oracle.log")
    count = compose(random_data, rows, out)
    shutil.rmtree(rows)
    record = {**provenance(sys.argv), "videos_from": str(random_data), "samples": count}
    (out / "provenance.json").write_text(json.dumps(record, indent=1) + "\n")
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--random", type=Path, required=True, help="the random-trace build (lvrl data zoom)")
    parser.add_argument("--out", type=Path, required=True, help="the oracle-trace copy to write")
    args = parser.parse_args()
    if (args.out / "dataset.json").exists():
        sys.exit(f"{args.out} holds a dataset already")
    count = build(args.random, args.out, args.out.with_name(args.out.name + "-render"))
    print(f"{count} samples: {args.random}'s videos with oracle traces -> {args.out}")


if __name__ == "__main__":
    main()
