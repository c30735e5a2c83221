"""The on-disk run record: config.yaml, status.json, metrics.csv (append-only) and summary.json."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from omegaconf import DictConfig

from qkvqa.config.load import to_yaml
from qkvqa.errors import DataError
from qkvqa.utils.io import atomic_write_json, atomic_write_text, cut_torn_tail, read_json
from qkvqa.utils.logging import get_logger
from qkvqa.utils.own_files import fopen_no_follow

log = get_logger(__name__)

METRICS_COLUMNS = ["time", "step", "name", "value"]
STATES = ("running", "finished", "failed", "interrupted")


def git_commit() -> Optional[str]:
    """The commit of the qkvqa checkout (with '+dirty' when modified), or None outside git."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


_SOURCE: list = []


def qkvqa_version() -> dict:
    """The installed qkvqa: its package version and the sha256 (16 hex) of its source files, recorded in every run
    attempt, so that a resume under another qkvqa is seen (`git_commit` is null outside a checkout)."""
    import hashlib
    from importlib import metadata

    import qkvqa

    try:
        version = metadata.version("qkvqa")
    except metadata.PackageNotFoundError:
        version = getattr(qkvqa, "__version__", None)
    if not _SOURCE:
        digest = hashlib.sha256()
        package = Path(qkvqa.__file__).resolve().parent
        for path in sorted(package.rglob("*.py")):
            digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
        _SOURCE.append(digest.hexdigest()[:16])
    return {"version": version, "source_sha256": _SOURCE[0]}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class RunRecord:
    """Reads and writes the files of one run directory; only rank zero should write."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)

    @property
    def config_path(self) -> Path:
        return self.run_dir / "config.yaml"

    @property
    def status_path(self) -> Path:
        return self.run_dir / "status.json"

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / "metrics.csv"

    @property
    def summary_path(self) -> Path:
        return self.run_dir / "summary.json"

    def write_config(self, cfg: DictConfig) -> None:
        """Save the resolved config as config.yaml."""
        atomic_write_text(self.config_path, to_yaml(cfg))

    def status(self) -> dict:
        """The current status.json contents (empty when absent)."""
        return read_json(self.status_path) if self.status_path.exists() else {}

    def observed_state(self) -> Optional[str]:
        """The status's state, except that a `running` run whose directory lock no live process holds is `killed`
        (SIGKILL, the OOM killer or a lost node leave no chance to write the record)."""
        from qkvqa.run.lock import is_held

        state = self.status().get("state")
        return "killed" if state == "running" and not is_held(self.run_dir) else state

    def start(self, run_id: str, world_size: int, command: str, extra: Optional[Mapping[str, Any]] = None) -> None:
        """Mark the run as running; a restart appends to `attempts` instead of starting over."""
        status = self.status()
        attempts = status.get("attempts", [])
        installed = qkvqa_version()
        before = status.get("qkvqa")
        if before and before != installed:  # the attempts before this one ran another qkvqa: said and recorded
            log.warning(
                "run %s was run so far by qkvqa %s (source %s); this attempt runs qkvqa %s (source %s): its results "
                "may mix the two versions (status.json `qkvqa_changes`); start a new run_id for one version's numbers",
                run_id,
                before.get("version"),
                before.get("source_sha256"),
                installed["version"],
                installed["source_sha256"],
            )
            status.setdefault("qkvqa_changes", []).append({"at": _now(), "from": before, "to": installed})
        attempts.append(
            {
                "started_at": _now(),
                "host": socket.gethostname(),
                "world_size": world_size,
                "git_commit": git_commit(),
                "qkvqa": installed,
                "pid": os.getpid(),
                "argv": sys.argv,
                "cwd": os.getcwd(),
            }
        )  # relative paths in the config are relative to it (compare)
        status.update(
            {
                "run_id": run_id,
                "state": "running",
                "command": command,
                "created_at": status.get("created_at", _now()),
                "updated_at": _now(),
                "finished_at": None,
                "host": socket.gethostname(),
                "world_size": world_size,
                "git_commit": git_commit(),
                "qkvqa": installed,
                "attempts": attempts,
                "error": None,
            }
        )
        status.update(extra or {})
        atomic_write_json(self.status_path, status)

    def finish(self, state: str = "finished", error: Optional[str] = None) -> None:
        """Mark the run finished, failed or interrupted."""
        if state not in STATES:
            raise ValueError(f"unknown run state {state!r}")
        status = self.status()
        status.update({"state": state, "updated_at": _now(), "finished_at": _now(), "error": error})
        try:
            atomic_write_json(self.status_path, status)
        except OSError as e:
            # A full disk (often what failed the run) has no room for a second file: overwrite the file in place,
            # compact, so it fits in the blocks status.json already holds, and never stays `running`.
            log.warning("%s: %s; rewriting it in place", self.status_path, e.strerror or e)
            status["error"] = (error or "")[:300] or None
            text = json.dumps(status, separators=(",", ":"), ensure_ascii=False, default=str).encode()
            with fopen_no_follow(self.status_path, "r+b") as f:
                f.write(text)
                f.truncate()

    def append_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Append one row per metric to metrics.csv (long format; the file is never truncated)."""
        new = not self.metrics_path.exists()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cut_torn_tail(self.metrics_path)  # a row a kill tore would glue onto the next one
        with fopen_no_follow(self.metrics_path, "a", newline="", encoding="utf-8") as f:  # never through a link
            writer = csv.writer(f)
            if new:
                writer.writerow(METRICS_COLUMNS)
            t = f"{time.time():.3f}"
            for name, value in metrics.items():
                writer.writerow([t, int(step), name, repr(float(value))])
            f.flush()

    def compact_metrics(self) -> int:
        """Keep the last row of each (step, name) in metrics.csv (a resumed run logged again the steps it replayed;
        the values are the same); returns how many older copies went. A torn last row is cut first."""
        if not self.metrics_path.exists():
            return 0
        cut_torn_tail(self.metrics_path)
        with open(self.metrics_path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        if len(rows) < 2:
            return 0
        header, body = rows[0], rows[1:]
        last = {(r[1], r[2]): i for i, r in enumerate(body) if len(r) == len(METRICS_COLUMNS)}
        kept = [r for i, r in enumerate(body) if len(r) != len(METRICS_COLUMNS) or last[(r[1], r[2])] == i]
        if len(kept) == len(body):
            return 0
        out = io.StringIO()
        csv.writer(out).writerows([header, *kept])
        atomic_write_text(self.metrics_path, out.getvalue())
        return len(body) - len(kept)

    def read_metrics(self) -> list[dict]:
        """Every metrics.csv row as a dict with typed step and value."""
        if not self.metrics_path.exists():
            return []
        with open(self.metrics_path, newline="", encoding="utf-8") as f:
            raw = list(csv.DictReader(f))
        rows = []
        for i, r in enumerate(raw):
            try:
                rows.append(
                    {"time": float(r["time"]), "step": int(r["step"]), "name": r["name"], "value": float(r["value"])}
                )
            except (TypeError, ValueError, KeyError):
                if i != len(raw) - 1:
                    raise DataError(f"{self.metrics_path}: line {i + 2}: malformed metrics row {dict(r)}") from None
                log.warning("%s: ignoring its last row, torn by a kill: %s", self.metrics_path, dict(r))
        return rows

    def summary(self) -> dict:
        """The current summary.json contents (empty when absent)."""
        return read_json(self.summary_path) if self.summary_path.exists() else {}

    def update_summary(self, values: Mapping[str, Any]) -> dict:
        """Merge values into summary.json (atomically) and return the new summary."""
        summary = self.summary()
        summary.update({k: _jsonable(v) for k, v in values.items()})
        atomic_write_json(self.summary_path, summary)
        return summary


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)
