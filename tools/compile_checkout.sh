#!/usr/bin/env bash
# Writes the bytecode of the checkout's own packages (their __pycache__, ignored by git), for
# processes that run with PYTHONDONTWRITEBYTECODE set: compileall skips a module whose bytecode
# matches its source, so a second run costs only the look-ups.
set -euo pipefail
py=${1:-.venv/bin/python}
cd "$(dirname "$0")/.."
packages=$("$py" - <<'PY'
import tomllib
from pathlib import Path

found = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
print(" ".join(sorted(p.rstrip("*") for p in found["include"])))
PY
)
# shellcheck disable=SC2086 # the package names are separate words on purpose
"$py" -m compileall -q -j 0 $packages tests/helpers > /dev/null
