"""Long-video input pipeline benchmarks, measured side by side in one run (read the ratios).

1. Memory: an hour-long synthetic video sampled to each frame count, decoded in a fresh
   process; prints the peak RSS and its growth over the process after imports (decoding keeps
   only the sampled frames, resized while decoding, so the growth must stay near their size).
2. Throughput: copies of the video in a WebDataset shard streamed by the training input path
   (``VideoQAStream`` in a ``DataLoader``) at 1 and 4 workers, in sampled frames per second,
   against what a CoT-SFT training step of the ``small`` model consumes at that frame count
   (frames per batch / step time, measured here too). A ratio above 1: decoding keeps up.

Usage: python bench/data.py [--frames 64 1024] [--workers 1 4] [--minutes 60] [--fps 1] [--size 224]
       [--out bench/results/input_pipeline/pipeline.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root

from datamodules.collate import VideoQACollator
from datamodules.rows import MULTIPLE_CHOICE, QARow
from datamodules.stream import VideoQAStream
from datatools.shard_writer import write_shards
from datatools.video_encode import encode_video

MAX_PIXELS = 56 * 56  # the demo's per-frame budget: the step time is the small model's at it

# Peak RSS from /proc (VmHWM): getrusage's ru_maxrss would carry over the parent's peak (it
# survives exec), VmHWM belongs to the child's own address space.
_PEAK_RSS_PROBE = """
import json, re, sys, time
from datamodules.video import decode_video
def peak_kib():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
before = peak_kib()
start = time.perf_counter()
video = decode_video(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
seconds = time.perf_counter() - start
out = {"before_kib": before, "peak_kib": peak_kib(), "seconds": seconds, "frames_bytes": video.frames.nbytes}
print(json.dumps(out))
"""


def hour_long_video(minutes: float, fps: float, size: int) -> bytes:
    """A white square crossing a slowly changing gradient, ``minutes`` long (mp4, H.264)."""
    count = int(minutes * 60 * fps)
    ramp = np.linspace(0, 255, size, dtype=np.float32)
    frames = np.empty((count, size, size, 3), dtype=np.uint8)
    side = size // 6
    for i in range(count):
        shade = (ramp[None, :] + i * 0.7) % 256
        frames[i] = shade[..., None].astype(np.uint8)
        x = int((i * 3) % (size - side))
        frames[i, size // 3 : size // 3 + side, x : x + side] = 255
    return encode_video(frames, fps, "mp4")


def peak_rss(path: Path, frames: int) -> dict:
    """Decode ``frames`` frames of ``path`` in a fresh process; its RSS figures and decode time."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS_PROBE, str(path), str(frames), str(MAX_PIXELS)],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def stream_frames_per_second(shard: str, frames: int, workers: int) -> float:
    """Sampled frames per second the training input path delivers (decode + resize, no model).

    Timed in the steady state: the clock starts once every worker has filled its prefetch
    queue (start-up and the backlog built meanwhile would flatter more workers).
    """
    warmup = 2 * max(1, workers) + 1
    measured = 6 * max(1, workers) + 6
    stream = VideoQAStream([shard] * 4 * max(1, workers), num_frames=frames, max_pixels=MAX_PIXELS)
    loader = torch.utils.data.DataLoader(
        stream,
        batch_size=None,
        num_workers=workers,
        multiprocessing_context="spawn" if workers else None,
        prefetch_factor=2 if workers else None,
    )
    iterator = iter(loader)
    for _ in range(warmup):
        next(iterator)
    start = time.perf_counter()
    decoded = sum(len(next(iterator).video.frame_indices) for _ in range(measured))
    return decoded / (time.perf_counter() - start)


def sft_step_seconds(model_dir: Path, shard: str, frames: int, batch_size: int, steps: int = 3) -> float:
    """Seconds per CoT-SFT step (forward, backward, AdamW) of a model on batches of the video."""
    from models.sft import SFTModule

    module = SFTModule(str(model_dir), learning_rate=1e-4)
    module.configure_model()
    stream = VideoQAStream([shard], num_frames=frames, max_pixels=MAX_PIXELS)
    samples = [s for _, s in zip(range(batch_size), stream, strict=False)]
    batch = VideoQACollator(module.processor, with_targets=True)(samples)
    optimizer = torch.optim.AdamW(module.model.parameters(), lr=1e-4)
    times = []
    for _ in range(steps + 1):  # the first step warms up allocators and kernels
        start = time.perf_counter()
        loss = module.token_mean_loss(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--frames", type=int, nargs="+", default=[64, 1024], help="sampled frames per video")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4], help="dataloader worker counts")
    parser.add_argument("--minutes", type=float, default=60.0, help="length of the synthetic video")
    parser.add_argument("--fps", type=float, default=1.0, help="frame rate of the synthetic video")
    parser.add_argument("--size", type=int, default=224, help="side of the synthetic frames in pixels")
    parser.add_argument("--copies", type=int, default=8, help="videos in the throughput shard")
    parser.add_argument("--batch-size", type=int, default=1, help="videos per training step")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args()
    from evaluation.provenance import provenance

    report: dict = {
        **provenance([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "video": {"minutes": args.minutes, "fps": args.fps, "size": args.size, "max_pixels": MAX_PIXELS},
        "memory": [],
        "throughput": [],
    }

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        video = hour_long_video(args.minutes, args.fps, args.size)
        path = root / "long.mp4"
        path.write_bytes(video)
        count = int(args.minutes * 60 * args.fps)
        print(
            f"video: {args.minutes:g} min at {args.fps:g} fps = {count} frames of {args.size}x{args.size}, "
            f"{len(video) / 1e6:.1f} MB (written in {time.perf_counter() - start:.1f} s); frames resized to "
            f"fit {MAX_PIXELS} pixels; {os.cpu_count()} CPU cores"
        )

        print("\n== memory: decoding in a fresh process")
        for frames in args.frames:
            rss = peak_rss(path, frames)
            growth = (rss["peak_kib"] - rss["before_kib"]) / 1024
            report["memory"].append({"frames": frames, **rss})
            print(
                f"{frames:5d} frames: peak RSS {rss['peak_kib'] / 1024:6.1f} MiB (+{growth:5.1f} MiB over "
                f"the {rss['before_kib'] / 1024:.1f} MiB after imports; the frames are "
                f"{rss['frames_bytes'] / 2**20:.1f} MiB), decoded in {rss['seconds']:.2f} s"
            )

        row = QARow("long", "long.mp4", "What moves?", MULTIPLE_CHOICE, "A square.", "A", None, ("a", "b"))
        samples = ((f"long{i}", video, row.to_json()) for i in range(args.copies))
        shard = write_shards(samples, root, "bench", max_samples_per_shard=args.copies, progress=False)[0]

        from models.build import build_model_dir

        model_dir = build_model_dir("small", root / "small", seed=0)
        print(
            "\n== throughput: sampled frames/s of the input path vs a CoT-SFT step of `small` "
            f"(batch {args.batch_size})"
        )
        # More workers than cores is the point of the comparison here, not a mistake.
        warnings.filterwarnings("ignore", message=".*max number of worker.*")
        for frames in args.frames:
            step = sft_step_seconds(model_dir, shard, frames, args.batch_size)
            consumed = args.batch_size * frames / step
            print(f"{frames:5d} frames: training step {step:.2f} s -> consumes {consumed:7.1f} frames/s")
            delivered_by_workers = {}
            for workers in args.workers:
                delivered = stream_frames_per_second(shard, frames, workers)
                delivered_by_workers[str(workers)] = delivered
                print(
                    f"      {workers} worker{'s' if workers > 1 else ' '}: decodes {delivered:7.1f} frames/s "
                    f"= x{delivered / consumed:.2f} what the step consumes"
                )
            report["throughput"].append(
                {
                    "frames": frames,
                    "step_seconds": step,
                    "consumed": consumed,
                    "delivered": delivered_by_workers,
                }
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
