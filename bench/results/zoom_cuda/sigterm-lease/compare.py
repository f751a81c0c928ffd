"""Two greedy tool-use evaluations of one export (CPU, CUDA): how many questions have the same
transcript, character for character, and the same answer.

    python compare.py CPU_PREDICTIONS.jsonl CUDA_PREDICTIONS.jsonl
"""

import json
import sys
from pathlib import Path
from typing import Any

Records = dict[str, dict[str, Any]]


def load(path: str) -> Records:
    lines = Path(path).read_text().splitlines()
    return {record["problem_id"]: record for record in map(json.loads, lines)}


def mean(records: Records, ids: set[str], value: str) -> float:
    return sum(float(records[k][value]) for k in ids) / max(len(ids), 1)


def main(cpu_path: str, cuda_path: str) -> None:
    cpu, cuda = load(cpu_path), load(cuda_path)
    shared = cpu.keys() & cuda.keys()
    same_text = sum(cpu[k]["turns"] == cuda[k]["turns"] for k in shared)
    same_answer = sum(cpu[k]["predicted"] == cuda[k]["predicted"] for k in shared)
    print(f"questions {len(shared)} (cpu {len(cpu)}, cuda {len(cuda)})")
    print(f"identical transcripts {same_text}; same answer {same_answer}")
    print(f"accuracy cpu {mean(cpu, shared, 'correct'):.4f} cuda {mean(cuda, shared, 'correct'):.4f}")
    print(
        f"frames served per answer cpu {mean(cpu, shared, 'frames_served'):.2f} "
        f"cuda {mean(cuda, shared, 'frames_served'):.2f}"
    )
    differing = sorted(k for k in shared if cpu[k]["turns"] != cuda[k]["turns"])
    if differing:
        first = differing[0]
        print(f"first differing: {first}")
        print(f" cpu:  {cpu[first]['turns'][:300]}\n cuda: {cuda[first]['turns'][:300]}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
