"""Test helper: a shard with good samples and broken ones (truncated mp4, malformed JSON, bad row)."""

from __future__ import annotations

import json
from pathlib import Path

import webdataset as wds

from datatools.synthetic import SynthConfig, encode_sample

BROKEN_KEYS = ("broken-truncated-video", "broken-json", "broken-row", "broken-no-video")


def write_shard_with_broken_samples(path: Path, config: SynthConfig, good: int = 4) -> list[str]:
    """Writes ``good`` valid samples plus one of each broken kind; returns the valid keys."""
    good_keys = []
    with wds.TarWriter(str(path), encoder=False) as writer:
        for index in range(good):
            key, video, row = encode_sample(config, "train", index)
            writer.write({"__key__": key, "mp4": video, "json": json.dumps(row).encode()})
            good_keys.append(key)
            if index == 1:
                _, video, row = encode_sample(config, "train", 100)
                row = {**row, "problem_id": BROKEN_KEYS[0], "videos": f"{BROKEN_KEYS[0]}.mp4"}
                writer.write(
                    {
                        "__key__": BROKEN_KEYS[0],
                        "mp4": video[: len(video) // 3],
                        "json": json.dumps(row).encode(),
                    }
                )
                writer.write(
                    {"__key__": BROKEN_KEYS[1], "mp4": video, "json": b'{"problem_id": "x", "videos": '}
                )
                writer.write(
                    {
                        "__key__": BROKEN_KEYS[2],
                        "mp4": video,
                        "json": json.dumps({**row, "answer": "<answer>Z</answer>"}).encode(),
                    }
                )
                writer.write({"__key__": BROKEN_KEYS[3], "json": json.dumps(row).encode()})
    return good_keys
