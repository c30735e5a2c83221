"""The `slurm` tests' cluster: installed by `make test` (.ci/install_slurm.sh), started once per session here."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.slurm.cluster import SlurmCluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = [cmd for cmd in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(cmd) is None]
    if missing:
        pytest.fail(f"SLURM is not installed ({', '.join(missing)} missing): run .ci/install_slurm.sh (make test does)")
    # Not under pytest's temp root (mode 0700): the job user reads slurm.conf and writes its job directories here.
    root = Path(tempfile.mkdtemp(prefix="qkvqa-slurm-"))
    cluster = SlurmCluster(root)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def reference(slurm):
    """An uninterrupted run of docs/training.md's recipe (once for the session): its final checkpoint, every rank's
    sample order, its job id and what the controller said of it (read at once: SLURM forgets a job MinJobAge after
    its end). Every preemption test ends bitwise equal to it."""
    import torch

    from tests.slurm import recipes

    work = slurm.workdir("reference")
    seen = work / "ref.jsonl"
    job = recipes.submit(slurm, "training-sbatch", work, TOY_SEEN_FILE=str(seen), TOY_STEP_SLEEP="0")
    state = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 240)
    assert state == "COMPLETED", recipes.told(slurm, work, recipes.run_dir(work, job))
    ckpt = torch.load(recipes.run_dir(work, job) / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == recipes.STEPS
    fields = {name: slurm.job_field(job, name) for name in ("TresPerNode", "UserId", "Requeue")}
    return ckpt, recipes.order(seen), job, fields


@pytest.fixture(autouse=True)
def no_job_left_behind(request):
    """After each test, cancel whatever jobs it left (a failed test's job would hold the node's CPUs, and every later
    test's jobs would wait behind it until they time out: one failure became six)."""
    yield
    if "slurm" in request.fixturenames:
        cluster = request.getfixturevalue("slurm")
        for user in {"root", cluster.unprivileged}:
            cluster.run("scancel", "--user", user, check=False)
