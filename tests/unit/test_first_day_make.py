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


def _nobody_reaches_the_checkout() -> bool:
    """Whether `nobody` can read the checkout's Makefile (a clone in a private folder, a home at 0700 or a `mktemp -d`,
    is out of its reach)."""
    done = subprocess.run(
        ["runuser", "-u", "nobody", "--", "test", "-r", str(REPO / "Makefile")], capture_output=True, timeout=30
    )
    return done.returncode == 0


@pytest.fixture
def traversable_checkout():
    """Let `nobody` reach the checkout as the SLURM tests do (tests/slurm/cluster.py `_grant_traversal`): a traverse-only
    ACL entry (`setfacl -m u:nobody:x`, no read) on each folder above it that others cannot traverse, taken back after.
    Without setfacl, or when that is not enough, the test is skipped with the reason (issue 44 item 6)."""
    granted = []
    if not _nobody_reaches_the_checkout() and shutil.which("setfacl"):
        for folder in sorted(f for f in (REPO, *REPO.parents) if not f.stat().st_mode & 0o001):
            had_acl = bool(
                subprocess.run(["getfacl", "--skip-base", "-p", str(folder)], capture_output=True, text=True).stdout
            )
            if subprocess.run(["setfacl", "-m", "u:nobody:x", str(folder)], capture_output=True).returncode == 0:
                granted.append((folder, had_acl))
    try:
        if not _nobody_reaches_the_checkout():
            pytest.skip(
                f"user nobody cannot reach {REPO} (a clone in a private folder, e.g. a home at 0700 or a mktemp -d) "
                "and setfacl is not there to grant it traverse: install the acl package, or clone into a "
                "traversable folder"
            )
        yield
    finally:
        for folder, had_acl in granted:
            undo = ["-x", "u:nobody"] if had_acl else ["-b"]
            subprocess.run(["setfacl", *undo, str(folder)], capture_output=True)


@pytest.mark.skipif(
    shutil.which("make") is None or shutil.which("runuser") is None or os.geteuid() != 0,
    reason="needs root to start make as another user (runuser)",
)
def test_as_another_user_without_the_slurm_packages_it_names_what_it_skips_and_why(traversable_checkout):
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp"}  # /usr/sbin (slurmctld, slurmd, munged) not on it
    out = _plan("runuser", "-u", "nobody", "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()))  # no CI=true
    assert "as nobody (not root): runs every test it can" in out
    assert "skipped: the SLURM tests" in out and "needs root" in out and "sudo make slurm" in out
    assert "installs" not in out


def test_make_test_prints_that_plan_and_lists_skipped_tests_with_their_reason():
    text = (REPO / "Makefile").read_text()
    recipe = text.split("\ntest: ")[1].split("\n\n")[0]
    assert "$(TEST_PLAN); plan;" in recipe and "pytest -rs" in recipe and recipe.rstrip().endswith("[ $$src -eq 0 ]")
