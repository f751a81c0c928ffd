#!/usr/bin/env bash
# The prepared GPU check (docs/planning-memory.md), for a lent GPU machine: its own CUDA torch and
# transformers, this tree as it is; results to $OUT (or runs/gpu_check). About 3 minutes on an H100.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-runs/gpu_check}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > /dev/null 2>&1 \
  && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "${out%/}-device.txt" || true
python3 bench/gpu_check.py --layers 2 --frames 512 --out "$out"
