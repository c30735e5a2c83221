"""Shared fixtures: offline environment, an isolated run root, and the experiments directory."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run, so CI never fails on a fresh random draw;
# `pytest --hypothesis-profile=explore` draws new ones.
settings.register_profile("qkvqa", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("qkvqa")

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("QKVQA_PROGRESS", "0")

# `make test` runs the SLURM tests in a background pytest, and a shell without job control starts background jobs
# with SIGINT ignored; every process they start inherits that, so a test's Ctrl-C (SIGINT) to a child did nothing
# (CI: the sweep Ctrl-C test's runner ran on and exited 0). A handler set here is reset to the default on exec, so the
# children get a terminal's Ctrl-C again, and a Ctrl-C at the terminal stops this pytest too.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _isolated_run_env(monkeypatch, tmp_path):
    """Each test starts without an inherited run identity, W&B sweep variables or SLURM job (`make test` inside an
    sbatch or salloc job: a test's SIGUSR1 stop would `scontrol requeue` that job, and Lightning would see SLURM).
    Whatever a test leaves in os.environ (an in-process `main()` setting QKVQA_LOG_LEVEL, Lightning's PL_GLOBAL_SEED) is
    undone after it, so that no later test in the same worker depends on which tests ran before it."""
    saved = dict(os.environ)
    for key in ("QKVQA_RUN_ID", "QKVQA_RUN_DIR", "WANDB_RUN_ID", "WANDB_SWEEP_ID"):
        monkeypatch.delenv(key, raising=False)
    for key in [k for k in os.environ if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("QKVQA_TINY_DIR", str(tmp_path / "tiny"))
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture
def single_thread():
    """One intra-op thread for the test (tiny models run fastest so: OpenMP hand-offs cost more than their
    matmuls); a module opts in with `pytestmark = pytest.mark.usefixtures("single_thread")`."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def run_root(tmp_path) -> Path:
    """A fresh checkpoints root for one test."""
    root = tmp_path / "checkpoints"
    root.mkdir()
    return root


@pytest.fixture
def experiments_root() -> Path:
    """The repository's experiments/ directory."""
    return REPO / "experiments"


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> dict:
    """A small synthetic KB-VQA world (36 entities), generated once per test session.

    Returns world.json with `dir` added. Tests must not modify its files; copy what they change.
    """
    from tests.fixtures_world import make_world

    return make_world(tmp_path_factory.mktemp("world"))


@pytest.fixture(scope="session")
def eval_env(world, tmp_path_factory):
    """experiments/ with `world_eval.yaml` (tiny components on the synthetic world) and a built stage-1 index (the
    integration tests and the real tier)."""
    from tests.helpers.eval_env import build_eval_env

    return build_eval_env(tmp_path_factory.mktemp("evaluate"), world)
