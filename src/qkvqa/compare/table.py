"""The comparison table: run_id, task, state, the swept keys, the chosen metrics and the best value (--all: everything)."""
from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from qkvqa.compare.rows import RunRow, goal_sign
from qkvqa.errors import ConfigError
from qkvqa.utils.io import atomic_write_text

IDENTITY_COLUMNS = ["run_id", "task", "state"]
ALL_IDENTITY_COLUMNS = IDENTITY_COLUMNS + ["experiment"]
BEST_COLUMNS = ["best_value", "best_step"]
# Config keys that differ between runs by construction; they are not what is being compared.
NOT_COMPARED = ("run_id",)
# ... nor, in the default table, what only says where files went, how a run was launched or logged, or is free text
NOT_SWEPT_PREFIXES = ("paths.", "logger.")
NOT_SWEPT = ("resume", "task", "notes", "tags", "paper")
# The headline metrics of each task, shown when no --metric is given (those some compared run has)
DEFAULT_METRICS = {
    "train": ["val/article_r1", "val/section_r1", "val/loss", "train/loss"],
    "evaluate": ["eval/accuracy", "eval/recall@1_after_filter", "eval/recall@5_after_filter", "eval/section_r1",
                 "eval/answer_in_context"],
}


@dataclass
class Table:
    """Columns in order and one dict per run, sorted (best first when a metric is given)."""

    columns: list[str]
    records: list[dict[str, Any]]
    metric: Optional[str] = None
    goal: Optional[str] = None


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def swept_keys(rows: list[RunRow]) -> list[str]:
    """The differing config keys that are settings of the runs (not paths, logging, launch, notes or bulk data).

    Runs of several experiments differ in every key the experiments set; those keys are implied by the `experiment`
    column, so only `experiment` and the keys that vary between runs of one experiment are shown (--all: every key)."""
    from qkvqa.loggers.wandb import BULK_KEYS

    keys = [k for k in differing_keys(rows) if not k.startswith(NOT_SWEPT_PREFIXES) and k not in NOT_SWEPT
            and k.rsplit(".", 1)[-1] not in BULK_KEYS]
    groups: dict[Any, list[RunRow]] = {}
    for row in rows:
        groups.setdefault(row.experiment, []).append(row)
    if len(groups) < 2:
        return keys
    within = {k for group in groups.values() if len(group) > 1 for k in differing_keys(group)}
    return [k for k in keys if k == "experiment" or k in within]


def differing_keys(rows: list[RunRow]) -> list[str]:
    """Config keys whose value is not the same in every row (a key missing from a row counts as differing)."""
    out = []
    for key in sorted({k for r in rows for k in r.config} - set(NOT_COMPARED)):
        values = {_key(r.config[key]) if key in r.config else "<missing>" for r in rows}
        if len(values) > 1:
            out.append(key)
    return out


def _parse_filter_value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def task_matches(row: RunRow, task: Optional[str]) -> bool:
    """The run's command is `task`, or starts with it (`index` matches `index build`); no task matches all."""
    return task is None or row.task == task or (row.task or "").split(" ")[0] == task


def filter_rows(rows: Iterable[RunRow], filters: Iterable[str], task: Optional[str] = None) -> list[RunRow]:
    """Keep rows of `task` matching every `key=value` (run_id, task, state, experiment or a dotted config key)."""
    rows = [r for r in rows if task_matches(r, task)]
    parsed = []
    for token in filters:
        if "=" not in token:
            raise ConfigError(f"bad filter {token!r}: use key=value, e.g. qff.alpha=0.9 or state=finished")
        key, value = token.split("=", 1)
        parsed.append((key.strip(), value, _parse_filter_value(value)))

    from qkvqa.config.load import did_you_mean

    known = {k for r in rows for k in r.config}
    for key, _, _ in parsed:
        if rows and key not in ALL_IDENTITY_COLUMNS and key not in known:     # a typo would give an empty table
            raise ConfigError(f"--where {key}: no compared run has this key{did_you_mean(key, sorted(known))}")

    def value_of(row: RunRow, key: str) -> Any:
        return getattr(row, key) if key in ALL_IDENTITY_COLUMNS else row.config.get(key)

    return [r for r in rows if all(value_of(r, k) == v or str(value_of(r, k)) == text for k, text, v in parsed)]


def known_metrics(rows: Iterable[RunRow]) -> list[str]:
    """Every metric some run has (its summary: the last value of everything it logged)."""
    return sorted({k for r in rows for k in r.summary})


def check_metrics(rows: Iterable[RunRow], metrics: Iterable[str]) -> None:
    """Refuse a metric no compared run has, naming the nearest ones (a typo would give an empty column)."""
    from qkvqa.config.load import did_you_mean

    rows = list(rows)
    known = known_metrics(rows)
    for name in metrics:
        if rows and name not in known:
            hint = did_you_mean(name, known, "./") or \
                f" (they have: {', '.join(known[:12])}{', ...' if len(known) > 12 else ''})"
            raise ConfigError(f"--metric {name!r}: no compared run has it{hint}")


def default_metrics(rows: Iterable[RunRow]) -> list[str]:
    """DEFAULT_METRICS of the compared runs' tasks that some run has."""
    rows = list(rows)
    known = set(known_metrics(rows))
    tasks = list(dict.fromkeys((r.task or "").split(" ")[0] for r in rows))
    return [m for t in tasks for m in DEFAULT_METRICS.get(t, []) if m in known]


def build_table(rows: Iterable[RunRow], metric: Optional[str] = None, goal: str = "min",
                metrics: Optional[list[str]] = None, all_columns: bool = False) -> Table:
    """One table for any source. Default: run_id, task, state, the swept keys, `metrics` (final values; default:
    `metric`, else DEFAULT_METRICS of the runs' tasks) and the best `metric` with its step. `all_columns`: every
    differing config key, every summary metric, experiment and runtime as well."""
    rows = list(rows)
    sign = goal_sign(goal)
    if all_columns:
        identity = ALL_IDENTITY_COLUMNS
        config_cols = differing_keys(rows)
        metric_cols = sorted({k for r in rows for k in r.summary} - set(config_cols) - set(identity))
    else:
        identity = IDENTITY_COLUMNS
        config_cols = swept_keys(rows)
        chosen = metrics if metrics is not None else ([metric] if metric else default_metrics(rows))
        metric_cols = [m for m in dict.fromkeys(chosen) if m not in config_cols and m not in identity]
    columns = identity + config_cols + metric_cols + (BEST_COLUMNS if metric else []) + \
        (["runtime_s"] if all_columns else [])
    records = []
    for row in rows:
        record: dict[str, Any] = {"run_id": row.run_id, "task": row.task, "state": row.state}
        if all_columns:
            record["experiment"] = row.experiment
        record.update({k: row.config.get(k) for k in config_cols})
        record.update({k: row.summary.get(k) for k in metric_cols})       # the final value (summary.json)
        if metric:
            record["best_value"], record["best_step"] = row.best(metric, goal)
        if all_columns:
            record["runtime_s"] = row.runtime_s
        records.append(record)
    if metric:
        records.sort(key=lambda r: (r["best_value"] is None, -sign * (r["best_value"] or 0.0), r["run_id"]))
    else:
        records.sort(key=lambda r: r["run_id"])
    return Table(columns=columns, records=records, metric=metric, goal=goal if metric else None)


def _cell(value: Any, markdown: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}" if markdown else repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    text = str(value)
    return text.replace("|", "\\|") if markdown else text


def render_table(table: Table, fmt: str) -> str:
    """The table as Markdown (`md`) or CSV (`csv`) text."""
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(table.columns)
        for record in table.records:
            writer.writerow([_cell(record.get(c), markdown=False) for c in table.columns])
        return buf.getvalue()
    if fmt == "md":
        header = list(table.columns)
        if table.metric:
            header[header.index("best_value")] = f"best {table.metric} ({table.goal})"
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(_cell(r.get(c), markdown=True) for c in table.columns) + " |" for r in table.records]
        return "\n".join(lines) + "\n"
    raise ConfigError(f"unknown table format {fmt!r}: use md or csv")


def write_table(table: Table, fmt: str, out: Optional[str | os.PathLike] = None) -> str:
    """Render the table; write it atomically to `out` when given. Returns the text."""
    text = render_table(table, fmt)
    if out is not None:
        atomic_write_text(Path(out), text)
    return text
