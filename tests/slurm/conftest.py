"""The `slurm` tests' cluster: installed by `make test` (.ci/install_slurm.sh), started once per session here."""
from __future__ import annotations

import shutil

import pytest

from tests.slurm.cluster import SlurmCluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = [cmd for cmd in ("sbatch", "slurmctld", "slurmd", "munged") if shutil.which(cmd) is None]
    if missing:
        pytest.fail(f"SLURM is not installed ({', '.join(missing)} missing): run .ci/install_slurm.sh (make test does)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()
