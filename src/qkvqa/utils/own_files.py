"""Run directories and caches in shared roots: the user's own folders, and files never opened through a link.

On a cluster's scratch (a 1777 folder) another user may create `ROOT/RUN_ID` before the run does, with `.lock` or
`metrics.csv` as symlinks to a file of the victim's: a run that accepted the folder truncated and overwrote the link's
target. So a run directory or cache folder is used only when it is a real folder owned by this user and not
world-writable (`check_own_dir`), and the files qkvqa writes or reads as records there are opened with `O_NOFOLLOW`
(`open_no_follow`): a link in their place is refused in one line naming it (docs/security.md).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import IO

from qkvqa.errors import ConfigError


def own_dir_problem(path: str | os.PathLike) -> str | None:
    """Why `path` is not a folder of this user's that nobody else may write (None when it is, or does not exist)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc.strerror or str(exc)
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink (a link planted in a shared root would send the run's files elsewhere)"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.geteuid():
        return f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    if info.st_mode & stat.S_IWOTH:
        return f"is world-writable (mode {stat.S_IMODE(info.st_mode):04o}), so anyone can plant files in it"
    return None


def check_own_dir(path: str | os.PathLike, what: str, fix: str) -> None:
    """Refuse `path` (ConfigError, one line) unless it is absent or a real folder of this user's, not world-writable."""
    problem = own_dir_problem(path)
    if problem is not None:
        raise ConfigError(f"{what} {path} {problem}; {fix}")


def _link_error(path: str | os.PathLike) -> ConfigError:
    return ConfigError(
        f"{path} is a symlink where qkvqa keeps its own file, and it is never written or read through a link (someone "
        f"may have planted it); remove the link, or use a run_id / cache folder of your own"
    )


def open_no_follow(path: str | os.PathLike, flags: int, mode: int = 0o666) -> int:
    """`os.open` with O_NOFOLLOW: a symlink at `path` is refused in one line (ConfigError), never followed."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EMLINK and os.path.islink(path)):
            raise _link_error(path) from None
        raise


def fopen_no_follow(path: str | os.PathLike, mode: str = "r", **kwargs) -> IO:
    """`open(path, mode)` that never follows a symlink at `path` (refused in one line, `open_no_follow`)."""
    flags = {
        "r": os.O_RDONLY,
        "rb": os.O_RDONLY,
        "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        "r+b": os.O_RDWR,
        "r+": os.O_RDWR,
    }[mode]
    fd = open_no_follow(path, flags)
    try:
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def refuse_link(path: str | os.PathLike) -> Path:
    """`path`, after refusing it in one line when it is a symlink (for files read by name, e.g. a cache manifest)."""
    if os.path.islink(path):
        raise _link_error(path)
    return Path(path)
