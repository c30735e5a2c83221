"""Runs as comparable rows, read from local run records (offline) or from the W&B public API."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

from qkvqa.errors import ConfigError
from qkvqa.run.record import RunRecord
from qkvqa.run.sweep_manifest import MANIFEST_NAME, Manifest
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

# W&B logs Lightning's step as this metric; its own `_step` counts log calls.
WANDB_STEP_KEY = "trainer/global_step"
Series = list[tuple[int, float]]


@dataclass
class RunRow:
    """One run: identity, flattened config, final metrics, and a reader for one metric's history."""

    run_id: str
    state: Optional[str]
    experiment: Optional[str]
    config: dict[str, Any]  # dotted keys -> values
    summary: dict[str, float]  # final numeric metrics
    runtime_s: Optional[float]
    source: str  # run directory or entity/project/run_id
    series: Callable[[str], Series] = field(repr=False, compare=False, default=lambda name: [])
    task: Optional[str] = None  # the command that ran it (status.json; W&B: job_type)
    cwd: Optional[str] = None  # where it was launched (relative config paths start there)

    def best(self, metric: str, goal: str) -> tuple[Optional[float], Optional[int]]:
        """(best value, its step) of `metric` over the run's history; the summary value when it has none."""
        points = [(s, v) for s, v in self.series(metric) if not math.isnan(v)]
        if points:
            pick = min if goal_sign(goal) < 0 else max
            best_value = pick(v for _, v in points)
            return best_value, min(s for s, v in points if v == best_value)
        value = self.summary.get(metric)
        return (value, None) if value is not None else (None, None)

    def last(self, metric: str) -> tuple[Optional[float], Optional[int]]:
        """(last value, its step) of `metric` in the run's history; the summary value when it has none."""
        points = [(s, v) for s, v in self.series(metric) if not math.isnan(v)]
        if points:
            step, value = points[-1]
            return value, step
        value = self.summary.get(metric)
        return (value, None) if value is not None else (None, None)

    def value(self, metric: str, which: str, goal: str = "max") -> tuple[Optional[float], Optional[int]]:
        """`best` (by goal) or `last` value of `metric`, with its step."""
        if which == "best":
            return self.best(metric, goal)
        if which == "last":
            return self.last(metric)
        raise ConfigError(f"which value of a run's history: best or last, got {which!r}")


def goal_sign(goal: str) -> int:
    """-1 for min/minimize, +1 for max/maximize."""
    if goal in ("min", "minimize"):
        return -1
    if goal in ("max", "maximize"):
        return 1
    raise ConfigError(f"goal must be min or max (minimize or maximize), got {goal!r}")


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys; lists stay values; keys starting with '_' (W&B internals) dropped."""
    out: dict[str, Any] = {}
    for key, value in d.items():
        if str(key).startswith("_"):
            continue
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def numeric_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """The numeric, non-internal entries of a summary (paths, strings and booleans left out)."""
    return {
        k: float(v)
        for k, v in summary.items()
        if not str(k).startswith("_") and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def dedupe_steps(points: Iterable[tuple[int, float]]) -> Series:
    """One value per step, the last one logged (a resumed run may log a step twice), sorted by step."""
    by_step: dict[int, float] = {}
    for step, value in points:
        by_step[int(step)] = float(value)
    return sorted(by_step.items())


def _seconds_between(start: Optional[str], end: Optional[str]) -> Optional[float]:
    if not start or not end:
        return None
    fmt = "%Y-%m-%dT%H:%M:%S%z"
    return (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()


def _local_series(record: RunRecord) -> Callable[[str], Series]:
    def series(name: str) -> Series:
        return dedupe_steps((r["step"], r["value"]) for r in record.read_metrics() if r["name"] == name)

    return series


def row_from_run_dir(run_dir: str | os.PathLike) -> RunRow:
    """A row from `config.yaml`, `status.json`, `summary.json` and `metrics.csv` (no W&B files)."""
    from omegaconf import OmegaConf

    from qkvqa.loggers.wandb import compact_config

    record = RunRecord(run_dir)
    config = OmegaConf.to_container(OmegaConf.load(record.config_path)) if record.config_path.exists() else {}
    config = compact_config(config)  # a tiny model's word list is data, not a setting to compare
    status = record.status()
    flat = flatten(config)
    if status.get("command") == "evaluate":
        flat.update(trained_with(flat.get("qff.checkpoint"), record.run_dir))
    return RunRow(
        run_id=status.get("run_id") or config.get("run_id") or record.run_dir.name,
        state=record.observed_state(),
        experiment=config.get("experiment"),
        config=flat,
        summary=numeric_metrics(record.summary()),
        # wall time from the first launch to the last update (gaps between resumed attempts included)
        runtime_s=_seconds_between(status.get("created_at"), status.get("finished_at") or status.get("updated_at")),
        source=str(record.run_dir),
        series=_local_series(record),
        task=status.get("command"),
        cwd=next((a.get("cwd") for a in status.get("attempts", []) if a.get("cwd")), None),
    )


# The training settings an evaluation shows as `trained.KEY`, read from the run that trained the QFF it evaluated.
TRAINED_PREFIXES = (
    "qff.",
    "trainer.max_steps",
    "trainer.max_epochs",
    "trainer.accumulate_grad_batches",
    "seed",
    "data.batch_size",
)


def training_run_of(checkpoint: Any, eval_run_dir: Path) -> Optional[Path]:
    """The run directory that wrote `checkpoint` (RUN/qff, RUN/qff_best or RUN/*.ckpt), looked up as given (from
    where it was run), then beside the evaluation's own run directory; None when none holds a config.yaml."""
    if not checkpoint or not isinstance(checkpoint, str):
        return None
    path = Path(checkpoint).expanduser()
    for candidate in (path, eval_run_dir.parent / path.parent.name / path.name, eval_run_dir.parent.parent / path):
        run_dir = candidate.parent
        if (run_dir / "config.yaml").is_file() and run_dir.resolve() != eval_run_dir.resolve():
            return run_dir
    return None


def trained_with(checkpoint: Any, eval_run_dir: Path) -> dict[str, Any]:
    """`trained.KEY` for the training settings (TRAINED_PREFIXES) of the run that made `checkpoint`: comparing
    evaluations then shows the lr, steps and focus each evaluated QFF was trained with."""
    from omegaconf import OmegaConf

    run_dir = training_run_of(checkpoint, eval_run_dir)
    if run_dir is None:
        return {}
    try:
        trained = flatten(OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml")))
    except Exception:  # an unreadable record: the evaluation row stays as it is
        return {}
    return {
        f"trained.{k}": v
        for k, v in trained.items()
        if k.startswith(TRAINED_PREFIXES) and k != "qff.checkpoint" and not isinstance(v, (list, dict))
    }


def _is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() or (path / "status.json").is_file()


def local_run_dirs(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Run directories named by run dirs, sweep dirs (their manifest) or checkpoint roots (their children)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if (path / MANIFEST_NAME).is_file():
            manifest = Manifest.load(path)
            found += [Path(t["run_dir"]) for t in manifest.trials.values() if _is_run_dir(Path(t["run_dir"]))]
        elif _is_run_dir(path):
            found.append(path)
        elif path.is_dir():
            found += sorted(p for p in path.iterdir() if p.is_dir() and _is_run_dir(p))
        else:
            raise ConfigError(f"{path}: not a run directory, sweep directory or checkpoints root")
    unique = {p.resolve(): None for p in found}
    return list(unique)


def collect_local(paths: Iterable[str | os.PathLike], skipped: Optional[list] = None) -> list[RunRow]:
    """Rows of every run under `paths` (run dirs, sweep dirs, checkpoint roots); fully offline. A run directory whose
    record cannot be read (a malformed config.yaml or status.json) is skipped, logged and appended to `skipped` as
    (path, reason): one such folder in a runs root once failed the whole `qkvqa compare`."""
    rows = []
    for path in local_run_dirs(paths):
        try:
            rows.append(row_from_run_dir(path))
        except Exception as e:  # noqa: BLE001 (any unreadable record: counted and named, never the whole table)
            reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            log.warning("%s: skipped, its run record cannot be read (%s)", path, reason)
            if skipped is not None:
                skipped.append((str(path), reason))
    return rows


def _wandb_series(run: Any) -> Callable[[str], Series]:
    """Unsampled history via scan_history (never the sampled `history()`), keyed by Lightning's step."""

    def series(name: str) -> Series:
        rows = list(run.scan_history(keys=[name, WANDB_STEP_KEY]))
        if rows:
            return dedupe_steps((r[WANDB_STEP_KEY], r[name]) for r in rows)
        return dedupe_steps((r["_step"], r[name]) for r in run.scan_history(keys=[name, "_step"]))

    return series


def collect_wandb(path: str, api: Any = None, filters: Optional[dict] = None) -> list[RunRow]:
    """Rows of the runs of a W&B project `entity/project` (needs the server, or a test double for `api`)."""
    if api is None:
        import wandb

        from qkvqa.errors import ConfigError

        try:
            api = wandb.Api()
            runs = list(api.runs(path, filters=filters))
        except (wandb.errors.UsageError, wandb.errors.CommError, ValueError) as e:
            reason = " ".join(str(e).split())[:200]
            raise ConfigError(
                f"compare --wandb {path}: W&B refused ({reason}); run `wandb login` (or set WANDB_API_KEY) "
                f"and check ENTITY/PROJECT, or compare the local run records: qkvqa compare "
                f"checkpoints"
            ) from None
    else:
        runs = api.runs(path, filters=filters)
    from qkvqa.loggers.wandb import compact_config

    rows = []
    for run in runs:
        summary = dict(run.summary.items())
        config = compact_config(dict(run.config))
        rows.append(
            RunRow(
                run_id=run.id,
                state=run.state,
                experiment=config.get("experiment"),
                config=flatten(config),
                summary=numeric_metrics(summary),
                runtime_s=summary.get("_runtime"),
                source=f"{path}/{run.id}",
                series=_wandb_series(run),
                task=getattr(run, "job_type", None),
            )
        )
    return rows
