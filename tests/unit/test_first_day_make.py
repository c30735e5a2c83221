"""Issue 34 item 5: `make test` as a non-root user runs what it can and says which tests it skips and why; as root
(CI) it installs the packages and runs them all. `make test-plan` prints the plan `make test` prints first."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _plan(*prefix: str, env: dict | None = None) -> str:
    done = subprocess.run(
        [*prefix, "make", "-s", "-C", str(REPO), "test-plan"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_plan_as_root_installs_and_runs_everything():
    if os.geteuid() != 0:
        pytest.skip("not root here: the non-root plan is the other test")
    assert "as root" in _plan(env={**os.environ, "CI": ""}) and "runs every test" in _plan()


@pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("runuser") is None or os.geteuid() != 0,
    reason="needs root to start make as another user (runuser)",
)
def test_as_another_user_without_the_slurm_packages_it_names_what_it_skips_and_why():
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}  # /usr/sbin (slurmctld, slurmd, munged) not on it
    out = _plan("runuser", "-u", "nobody", "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()))  # no CI=true
    assert "as nobody (not root): runs every test it can" in out
    assert "skipped: the SLURM tests" in out and "needs root" in out and "sudo make slurm" in out
    assert "installs" not in out


def test_make_test_prints_that_plan_and_lists_skipped_tests_with_their_reason():
    text = (REPO / "Makefile").read_text()
    recipe = text.split("\ntest: install")[1].split("\n\n")[0]
    assert "$(TEST_PLAN); plan;" in recipe and "pytest -rs" in recipe and recipe.rstrip().endswith("[ $$src -eq 0 ]")
