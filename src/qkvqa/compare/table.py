"""The comparison table: run_id, state, experiment, differing config keys, final metrics, best value, runtime."""
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

IDENTITY_COLUMNS = ["run_id", "state", "experiment"]
BEST_COLUMNS = ["best_value", "best_step"]
# Config keys that differ between runs by construction; they are not what is being compared.
NOT_COMPARED = ("run_id",)


@dataclass
class Table:
    """Columns in order and one dict per run, sorted (best first when a metric is given)."""

    columns: list[str]
    records: list[dict[str, Any]]
    metric: Optional[str] = None
    goal: Optional[str] = None


def _key(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


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


def filter_rows(rows: Iterable[RunRow], filters: Iterable[str]) -> list[RunRow]:
    """Keep rows matching every `key=value` (run_id, state, experiment or a dotted config key)."""
    parsed = []
    for token in filters:
        if "=" not in token:
            raise ConfigError(f"bad filter {token!r}: use key=value, e.g. qff.alpha=0.9 or state=finished")
        key, value = token.split("=", 1)
        parsed.append((key.strip(), value, _parse_filter_value(value)))

    def value_of(row: RunRow, key: str) -> Any:
        return getattr(row, key) if key in IDENTITY_COLUMNS else row.config.get(key)

    return [r for r in rows if all(value_of(r, k) == v or str(value_of(r, k)) == text for k, text, v in parsed)]


def build_table(rows: Iterable[RunRow], metric: Optional[str] = None, goal: str = "min") -> Table:
    """One table for any source: identity, differing config keys, summary metrics, best `metric`, runtime."""
    rows = list(rows)
    sign = goal_sign(goal)
    config_cols = differing_keys(rows)
    metric_cols = sorted({k for r in rows for k in r.summary} - set(config_cols) - set(IDENTITY_COLUMNS))
    columns = IDENTITY_COLUMNS + config_cols + metric_cols + (BEST_COLUMNS if metric else []) + ["runtime_s"]
    records = []
    for row in rows:
        record: dict[str, Any] = {"run_id": row.run_id, "state": row.state, "experiment": row.experiment}
        record.update({k: row.config.get(k) for k in config_cols})
        record.update({k: row.summary.get(k) for k in metric_cols})
        if metric:
            record["best_value"], record["best_step"] = row.best(metric, goal)
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
