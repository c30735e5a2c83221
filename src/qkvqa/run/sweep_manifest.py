"""The sweep manifest (`sweep_manifest.json`: trial -> overrides -> status -> run dir) and the runner lock."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Optional

from qkvqa.errors import ConfigError
from qkvqa.utils.io import atomic_write_json, pid_alive, read_json

MANIFEST_NAME = "sweep_manifest.json"
LOCK_NAME = ".runner.lock"


def now() -> str:
    """A timestamp in the format of the run records."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Manifest:
    """One sweep's manifest; every change is written atomically, so a crash never leaves half a file."""

    def __init__(self, sweep_dir: str | os.PathLike, data: dict):
        self.sweep_dir = Path(sweep_dir)
        self.data = data

    @property
    def path(self) -> Path:
        return self.sweep_dir / MANIFEST_NAME

    @property
    def trials(self) -> dict[str, dict]:
        """trial id -> its entry."""
        return self.data["trials"]

    @classmethod
    def load(cls, sweep_dir: str | os.PathLike) -> Optional["Manifest"]:
        """The manifest in `sweep_dir`, or None when there is none yet."""
        path = Path(sweep_dir) / MANIFEST_NAME
        return cls(sweep_dir, read_json(path)) if path.exists() else None

    @classmethod
    def create(cls, sweep_dir: str | os.PathLike, header: dict[str, Any]) -> "Manifest":
        """A new, empty manifest with the sweep's description."""
        return cls(sweep_dir, {**header, "created_at": now(), "updated_at": now(), "trials": {}})

    def save(self) -> None:
        """Write the manifest (atomically)."""
        self.data["updated_at"] = now()
        atomic_write_json(self.path, self.data)

    def update_trial(self, trial_id: str, **fields: Any) -> dict:
        """Change one trial's entry and save."""
        self.trials[trial_id].update(fields)
        self.save()
        return self.trials[trial_id]


class RunnerLock:
    """Only one runner per sweep directory; a lock left by a dead runner on this host is taken over."""

    def __init__(self, sweep_dir: str | os.PathLike):
        self.path = Path(sweep_dir) / LOCK_NAME

    def __enter__(self) -> "RunnerLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": now()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            except FileExistsError:
                try:
                    holder = json.loads(self.path.read_text() or "{}")
                except (OSError, json.JSONDecodeError):
                    holder = {}
                if (
                    holder.get("host") == me["host"]
                    and isinstance(holder.get("pid"), int)
                    and not pid_alive(holder["pid"])
                ):
                    self.path.unlink(missing_ok=True)
                    continue
                raise ConfigError(
                    f"sweep directory {self.path.parent} is in use by a runner (pid {holder.get('pid')} "
                    f"on {holder.get('host')}); if that runner is gone, delete {self.path}"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            return self
        raise ConfigError(f"could not take the sweep lock {self.path}")

    def __exit__(self, *exc: Any) -> None:
        self.path.unlink(missing_ok=True)
