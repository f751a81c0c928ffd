"""Cost of the build's video probe per video, by the number of frames it decodes (``--probe-frames``).

Two synthetic H.264 mp4 videos: a short one (64 frames of 56x56, the demo's size) and an
hour-long one (3,600 frames of 224x224 at 1 fps, a keyframe every 250 frames, as in
``bench/data.py``). Each probe opens the file, reads the headers and decodes the requested
frames spread from the first to the last (seeking to the keyframe before each); the best of
``--repeats`` runs is printed, so other load on the machine inflates the figures less.

Usage: python bench/probe.py [--frames 2 16 64] [--repeats 5] [--out bench/results/input_pipeline/probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root
sys.path.insert(0, str(Path(__file__).resolve().parent))

from data import hour_long_video  # bench/data.py

from datatools.video_encode import encode_video
from datatools.video_probe import probe_video
from evaluation.tables import Column, Table, render_table


def short_video() -> bytes:
    levels = (np.arange(64) * 3).astype(np.uint8)
    frames = np.broadcast_to(levels[:, None, None, None], (64, 56, 56, 3)).copy()
    frames[:, 20:36, 20:36] = 255
    return encode_video(frames, 4.0, "mp4")


def best_seconds(path: Path, frames: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        probe_video(path, frames)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, nargs="+", default=[2, 16, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        videos = {
            "64 frames 56x56": Path(folder) / "short.mp4",
            "3,600 frames 224x224": Path(folder) / "hour.mp4",
        }
        videos["64 frames 56x56"].write_bytes(short_video())
        videos["3,600 frames 224x224"].write_bytes(hour_long_video(60, 1.0, 224))
        seconds = {
            name: {n: best_seconds(path, n, args.repeats) for n in args.frames}
            for name, path in videos.items()
        }
    columns = [Column("video", "left"), *(Column(f"--probe-frames {n}") for n in args.frames)]
    rows = [(name, *(f"{best[n] * 1000:.0f} ms" for n in args.frames)) for name, best in seconds.items()]
    print(render_table(Table(columns, rows)))
    if args.out:
        from evaluation.provenance import provenance

        report = {
            **provenance([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "repeats": args.repeats,
            "best_seconds": {name: {str(n): s for n, s in best.items()} for name, best in seconds.items()},
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
