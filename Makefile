# qkvqa: `make test` and `make demo` are the only set-up a fresh clone needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export WANDB_MODE ?= disabled
export WANDB_SILENT ?= true
export TOKENIZERS_PARALLELISM ?= false
PYTEST_FLAGS ?=
# Tiny models gain nothing from intra-op threads, and DDP tests run two processes on two cores.
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
EXP ?= evqa_qff
SWEEP ?= alpha_sweep
RUNS ?= checkpoints

.PHONY: help install slurm browser test test-slurm test-fast test-gpu lint train sweep compare demo bench clean clean-runs

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

# setup.cfg gives compatible ranges; constraints.txt pins the one verified set, which the install uses exactly
$(STAMP): setup.cfg setup.py pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24" "setuptools>=70" wheel
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

install: $(STAMP) ## create .venv with the pinned set (constraints.txt) and qkvqa in editable mode (idempotent)

slurm: ## install the Debian SLURM packages the slurm tests need (root; nothing when present)
	bash .ci/install_slurm.sh

browser: ## install Debian's chromium and chromium-driver, which the `qkvqa inspect` browser test drives (root; nothing when present)
	bash .ci/install_browser.sh

# The main suite runs on two pytest-xdist workers: one test process left the second core mostly idle (tests run with
# one intra-op thread). --dist loadfile keeps a file's tests, and so its module fixtures (the learning test's trained
# models), in one worker. 12:33 against 17:44 in one process, side by side on one tree; TEST_WORKERS= runs it in one.
TEST_WORKERS ?= -n 2 --dist loadfile
# The real-SLURM tests spend most of their time waiting on the cluster (requeue delays, time-limit signals), so
# `make test` runs them in a second pytest alongside the rest and prints their log at the end; both must pass.
SLURM_LOG := $(VENV)/slurm-tests.log
test: install slurm browser ## the suite CI runs: everything but gpu and online tests (ddp, slow and the real-SLURM ones included)
	@$(TEST_ENV) $(PY) -m pytest -m "slurm and not gpu and not online" $(PYTEST_FLAGS) > $(SLURM_LOG) 2>&1 & slurm=$$!; \
	$(TEST_ENV) $(PY) -m pytest -m "not gpu and not online and not slurm" $(TEST_WORKERS) --durations=25 $(PYTEST_FLAGS); rc=$$?; \
	wait $$slurm; src=$$?; echo "=== the SLURM tests, run alongside (exit $$src; $(SLURM_LOG)):"; cat $(SLURM_LOG); \
	[ $$rc -eq 0 ] && [ $$src -eq 0 ]

test-slurm: install slurm ## the real-SLURM tests (installs the Debian packages; starts and stops its own cluster)
	$(TEST_ENV) $(PY) -m pytest -m slurm $(PYTEST_FLAGS)

test-fast: install ## the quick loop: no slow, ddp or gpu tests, on two pytest-xdist workers, property tests at a tenth of their examples
	$(TEST_ENV) QKVQA_FAST_LOOP=1 $(PY) -m pytest -n 2 -m "not slow and not ddp and not gpu and not online" $(PYTEST_FLAGS)

test-gpu: install ## the GPU checks (needs a CUDA device)
	$(PY) -m pytest -m gpu $(PYTEST_FLAGS)

train: install ## train: make train EXP=evqa_qff
	$(VENV)/bin/qkvqa train experiment=$(EXP)

sweep: install ## offline sweep: make sweep SWEEP=alpha_sweep
	$(VENV)/bin/qkvqa sweep experiments/sweeps/$(SWEEP).yaml

compare: install ## compare run records: make compare RUNS=checkpoints
	$(VENV)/bin/qkvqa compare $(RUNS)

demo: install ## run the whole method on the synthetic world; prints a comparison and the report path
	$(TEST_ENV) $(VENV)/bin/qkvqa demo

bench: install ## run every benchmark in bench/ and write bench/RESULTS.md (tens of minutes on 2 cores)
	$(PY) bench/run_all.py

clean: ## remove caches
	rm -rf .pytest_cache .hypothesis build dist src/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-runs: ## remove every run directory under checkpoints/
	find checkpoints -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
