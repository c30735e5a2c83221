"""Issue 37 item 1: DataLoader workers of a process whose gloo threads are live. A worker forked while a gloo thread
held CPython 3.11's thread-state lock waited for ever in its after-fork code, and its rank with it (a 2-rank
evaluation under srun, once in three). `tests.helpers.fork_hazard` holds that lock at every fork of the process, so
the hang is certain: workers forked from the rank time out; workers from qkvqa's fork server load every item, in
order, through a group SIGUSR1 that the server ignores."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ddp, pytest.mark.slow]


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


@pytest.mark.skipif(
    sys.version_info[:2] != (3, 11),
    reason="the lock held at fork is CPython 3.11's (_PyRuntime.interpreters.mutex: tests/helpers/fork_hazard.py)",
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
    # the server was started with every stop signal blocked (not only by its preload's SIG_IGN): the tracker's own
    # start unblocks SIGINT and SIGTERM on its way out, and a SIGTERM during the server's imports would have killed it
    assert {"SIGINT", "SIGTERM", "SIGUSR1"} <= set(out["server"]["SigBlk"]), out["server"]
    assert {"SIGINT", "SIGTERM", "SIGUSR1"} <= set(out["server"]["SigIgn"]), out["server"]


def _alive(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_rank_killed_outright_takes_the_fork_server_and_its_workers_with_it(tmp_path):
    """Each child of the fork server holds a copy of the server's "alive" pipe, and the server is the workers' parent
    (what torch's worker watchdog checks): a SIGKILLed rank left both running for ever, until its workers let go of
    the pipe (samplers.release_fork_server)."""
    rank = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fork_hazard", str(tmp_path / "store"), "killed"],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    pids: dict = {}
    try:
        ready, _, _ = select.select([rank.stdout], [], [], 120)
        assert ready, "the rank printed nothing in 120 s"
        pids = json.loads(rank.stdout.readline())
        assert len(pids["workers"]) == 2 and all(_alive(pid) for pid in [pids["server"], *pids["workers"]]), pids
        rank.kill()
        rank.wait(30)
        # torch's watchdog looks every 5 s once the server, the workers' parent, is gone
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(pid) for pid in [pids["server"], *pids["workers"]]):
            time.sleep(0.2)
        left = [pid for pid in [pids.get("server"), *pids.get("workers", [])] if _alive(pid)]
        assert not left, f"still running 30 s after the rank was killed: {left} of {pids}"
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.wait(30)
        for pid in [pids.get("server"), *pids.get("workers", [])]:
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)  # by the pid it printed
