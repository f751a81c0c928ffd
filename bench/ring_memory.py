"""Ring attention's transient memory, measured: how many float32 score chunks its forward and backward
hold at once, in real gloo processes on the CPU.

Each of ``--ranks`` processes holds one zigzag slice of a row of ``--tokens`` positions (``--heads``
heads of ``--head-dim``), runs :func:`parallel.ring.ring_attention` forward, then backward. A score
chunk is ``heads x QUERY_CHUNK x block`` float32 values (the largest product a rank computes: its
whole slice against a whole received block); with thousands of positions per rank the chunks
dwarf every other tensor of the pass, so the pass's peak above its start, divided by one chunk,
counts the chunks alive at once.

Measured as in ``bench/plan_check.py``: the kernel's high-water mark of resident memory (``VmHWM``),
reset (``/proc/self/clear_refs``) just before the pass, with glibc's mmap threshold pinned at
128 KiB so that every tensor above it is its own mapping, returned when freed. The gradients'
SHA-256 is printed too: two code versions that compute the same gradients print the same digest.

Usage: python bench/ring_memory.py [--ranks 2] [--tokens 16384] [--heads 4] [--head-dim 64]
       [--out bench/results/ring_memory/<name>.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

# Run as `python bench/ring_memory.py`, Python puts bench/ first on sys.path; keep the repo's packages.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

MMAP_THRESHOLD = str(128 * 1024)


def _resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_high_water() -> int:
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts from now
    return _resident_kib("VmRSS")


def _rank(rank: int, args: argparse.Namespace, store_path: str, results: str) -> None:
    import torch
    import torch.distributed as dist

    from parallel.ring import QUERY_CHUNK, ring_attention
    from parallel.shard import SequenceShard

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, args.ranks)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=args.ranks)
    shard = SequenceShard(group=dist.group.WORLD, attention="ring")
    per_rank = args.tokens // args.ranks
    generator = torch.Generator().manual_seed(rank)

    def tensor() -> torch.Tensor:
        shape = (1, args.heads, per_rank, args.head_dim)
        return torch.randn(shape, generator=generator).requires_grad_()

    query, key, value = tensor(), tensor(), tensor()
    grad_out = torch.randn(1, per_rank, args.heads, args.head_dim, generator=generator)
    scaling = args.head_dim**-0.5
    dist.barrier()
    start = _reset_high_water()
    out = ring_attention(query, key, value, shard, scaling)
    forward_peak = _resident_kib("VmHWM") - start
    dist.barrier()
    start = _reset_high_water()
    out.backward(grad_out)
    backward_peak = _resident_kib("VmHWM") - start
    digest = hashlib.sha256()
    for grad in (query.grad, key.grad, value.grad):
        digest.update(grad.numpy().tobytes())
    chunk_kib = 4 * args.heads * QUERY_CHUNK * per_rank / 1024
    record = {
        "rank": rank,
        "forward_peak_kib": forward_peak,
        "backward_peak_kib": backward_peak,
        "score_chunk_kib": chunk_kib,
        "forward_chunks": forward_peak / chunk_kib,
        "backward_chunks": backward_peak / chunk_kib,
        "gradient_sha256": digest.hexdigest(),
    }
    Path(results, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16384, help="positions of the whole row")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="also write the summary here (JSON)")
    args = parser.parse_args()
    if args.tokens % (2 * args.ranks):
        parser.error("--tokens must cut into 2 x --ranks equal zigzag chunks")

    import torch.multiprocessing as mp

    os.environ["MALLOC_MMAP_THRESHOLD_"] = MMAP_THRESHOLD  # read by glibc as each rank starts
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(args, str(Path(tmp) / "store"), tmp), nprocs=args.ranks)
        ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(args.ranks)]
    from evaluation.provenance import provenance

    summary = {
        **provenance(["python", "bench/ring_memory.py", *sys.argv[1:]]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "forward_chunks": max(r["forward_chunks"] for r in ranks),
        "backward_chunks": max(r["backward_chunks"] for r in ranks),
        "gradient_sha256": [r["gradient_sha256"] for r in ranks],
        "ranks": ranks,
    }
    print(
        f"score chunk {ranks[0]['score_chunk_kib'] / 1024:.0f} MiB; alive at once (largest rank): "
        f"forward {summary['forward_chunks']:.2f}, backward {summary['backward_chunks']:.2f}"
    )
    for record in ranks:
        print(f"  rank {record['rank']} gradients sha256 {record['gradient_sha256'][:16]}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
