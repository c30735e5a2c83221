"""One job per run directory: rank zero holds an exclusive flock on `RUN/.lock` (with its PID and host) while it runs.

Two `resume=auto` launches of one run_id (a SLURM requeue while the old job still runs) once both
trained into one directory. The second launch is now refused, naming the holder. The lock is the
kernel's: it goes with the process, so a lock left by a killed job is simply free again (its file
still names the dead holder, and is taken over).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from qkvqa.errors import ConfigError
from qkvqa.utils.own_files import open_no_follow

LOCK_FILE = ".lock"


class RunLock:
    """An acquired lock on a run directory; `release()` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def acquire(cls, run_dir: str | os.PathLike) -> "RunLock":
        """Take the run directory's lock, or raise ConfigError naming the PID and host that hold it."""
        path = Path(run_dir) / LOCK_FILE
        fd = open_no_follow(path, os.O_RDWR | os.O_CREAT, 0o666)  # a planted link is refused, never truncated
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
            raise ConfigError(
                f"run directory {Path(run_dir)} is in use by PID {holder.get('pid', '?')} on "
                f"{holder.get('host', '?')} (since {since}): wait for that job to end or stop it, or "
                "choose another run_id"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}).encode())
        os.fsync(fd)
        return cls(path, fd)

    def release(self) -> None:
        """Free the lock (its file stays, naming the last holder)."""
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def is_held(run_dir: str | os.PathLike) -> bool:
    """Whether a live process holds the run directory's lock (a `running` status without one is a killed run)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock taken to test
    return False


def _holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return json.loads(os.read(fd, 4096).decode() or "{}")
    except (OSError, ValueError):
        return {}
