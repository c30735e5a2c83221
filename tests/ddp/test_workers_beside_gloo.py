"""Issue 37 item 1: DataLoader workers of a process whose gloo threads are live. A worker forked while a gloo thread
held CPython 3.11's thread-state lock waited for ever in its after-fork code, and its rank with it (a 2-rank
evaluation under srun, once in three). `tests.helpers.fork_hazard` holds that lock at every fork of the process, so
the hang is certain: workers forked from the rank time out; workers from qkvqa's fork server load every item, in
order, through a group SIGUSR1 that the server ignores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.ddp,
    pytest.mark.slow,
    pytest.mark.skipif(
        sys.version_info[:2] != (3, 11),
        reason="the lock held at fork is CPython 3.11's (_PyRuntime.interpreters.mutex: tests/helpers/fork_hazard.py)",
    ),
]


def _run(tmp_path: Path, start: str, timeout_s: float) -> subprocess.CompletedProcess:
    """tests.helpers.fork_hazard in a session of its own (the group SIGUSR1 reaches it, its server and workers only)."""
    return subprocess.run(
        [sys.executable, "-m", "tests.helpers.fork_hazard", str(tmp_path / f"store-{start}"), start, str(timeout_s)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        start_new_session=True,
    )


def test_workers_beside_a_live_group_start_from_a_fork_server_that_a_held_lock_does_not_reach(tmp_path):
    # the control: the same loaders with workers forked from this process hang, so the lock is really held at fork
    forked = _run(tmp_path, "fork", 5)
    assert forked.returncode != 0 and "DataLoader timed out after 5.0 seconds" in forked.stderr, forked.stderr[-3000:]

    done = _run(tmp_path, "default", 120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [[index for index, _ in rows] for rows in out["passes"]] == [list(range(6))] * 3
    parents = {parent for rows in out["passes"] for _, parent in rows}
    assert parents == {out["servers"][0]} and out["pid"] not in parents, out  # every worker came from the server
    # the group's SIGUSR1 reached this process (noted) and left the server alive: the later passes used it
    assert out["stops"] == 1 and out["servers"] == [out["servers"][0]] * 2, out
    # and the resource tracker the server's queues use (their named semaphores) was not killed by it either
    assert "resource_tracker" not in done.stderr, done.stderr[-3000:]
