# oddl: every target works on a fresh machine with Python 3.11+ and make; it creates .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv demo test lint protos check-protos bench fuzz soak lab clean torch-suite

help:
	@echo "make demo    - run the emulated four-node testbed end to end"
	@echo "make test    - run the whole test suite (make lint included; TEST_WORKERS=2)"
	@echo "make lint    - ruff, stale generated code, the layer contracts (import-linter), mypy"
	@echo "make bench   - run the benchmarks and write benchmarks/results/"
	@echo "make fuzz    - coverage-guided fuzzing of every parser (FUZZ_ARGS=--runs 1000000)"
	@echo "make soak    - 10 minutes of traffic under kills and stalls (SOAK_ARGS=--minutes 60)"
	@echo "make protos  - regenerate the gRPC code from protos/oddl.proto"
	@echo "make torch-suite - PyTorch's distributed suite on oddl and gloo (TORCH_SUITE_ARGS=--fast)"
	@echo "make lab     - rehearse a five-host lab in network namespaces (root; LAB_ARGS=--keep)"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "oddl needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

# the test suite also runs the PyTorch tests (torch 2.13.0, CPU build) and PyTorch Lightning's
# DDP on the backend (tests/top/test_torch_lightning.py)
TORCH_STAMP := $(VENV)/.installed-torch
$(TORCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,torch,lightning]'
	@touch $(TORCH_STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/oddl demo

# the suite on TEST_WORKERS processes (pytest-xdist), each taking whole files, so a module's
# testbed is started once (docs/decisions/0046-the-suite-runs-on-two-workers.md)
TEST_WORKERS ?= 2
test: $(TORCH_STAMP) lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# style, the generated code, the floors (docs/decisions/0011-the-house.md) and the types
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python protos/generate.py --check
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy

protos: $(STAMP)
	$(BIN)/python protos/generate.py

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info runs .pytest_cache .ruff_cache .hypothesis

# coverage-guided fuzzing (atheris, Linux x86-64 wheels); not part of `make test`, which runs
# a short smoke of the same targets (tests/e2e/test_fuzz_smoke.py)
FUZZ_STAMP := $(VENV)/.installed-fuzz
$(FUZZ_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,fuzz]'
	@touch $(FUZZ_STAMP)

FUZZ_ARGS ?=
fuzz: $(FUZZ_STAMP)
	$(BIN)/python fuzz/run.py --json fuzz/last-run.json $(FUZZ_ARGS)

# traffic under a chaos schedule; not part of `make test`
SOAK_ARGS ?=
soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py --json benchmarks/results/soak.json $(SOAK_ARGS)

# the lab rehearsal (docs/how-to/lab-bring-up.md): five hosts in network namespaces on this machine, the wheel
# installed as a lab installs it, the units' command lines; needs root. `make test` runs it too
# when the machine allows it (tests/e2e/test_lab_rehearsal.py) and says why it skips otherwise.
LAB_ARGS ?=
lab: $(TORCH_STAMP)
	$(BIN)/python -m lab --json runs/lab.json $(LAB_ARGS)

# PyTorch's own distributed suite (the wheel's distributed_test.py) on the oddl backend and on
# gloo in the same run, on the emulated testbed (docs/how-to/torch-backend.md); `make test` runs its
# fast subset (tests/top/test_torch_suite.py)
TORCH_SUITE_ARGS ?= --parallel
torch-suite: $(TORCH_STAMP)
	$(BIN)/python tests/workers/torch_suite.py --json runs/torch-suite.json $(TORCH_SUITE_ARGS)
