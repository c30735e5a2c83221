"""The comparison table: run_id, task, state, the swept keys, the chosen metrics and the best value (--all: everything)."""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from qkvqa.compare.rows import RunRow, goal_sign
from qkvqa.errors import ConfigError
from qkvqa.pipeline.filters import reads_filter_key
from qkvqa.utils.io import atomic_write_text
from qkvqa.utils.markdown import md_text

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
    "evaluate": [
        "eval/accuracy",
        "eval/recall@1_after_filter",
        "eval/recall@5_after_filter",
        "eval/section_r1",
        "eval/answer_in_context",
    ],
}


@dataclass
class Table:
    """Columns in order and one dict per run, sorted (best first when a metric is given)."""

    columns: list[str]
    records: list[dict[str, Any]]
    metric: Optional[str] = None
    goal: Optional[str] = None


def _key(value: Any, cwd: Optional[str] = None, key: str = "") -> str:
    return json.dumps(_comparable(value, cwd, key), sort_keys=True, default=str)


# Config keys whose value is a file or folder (a bare `world` included); other values are paths when they look so.
PATH_KEY = re.compile(r"(root|dir|path|file|store|source|questions|checkpoint|results|cache|negatives)$")


def _looks_like_path(text: str, key: str = "") -> bool:
    if not text or "://" in text or "${" in text or "\n" in text:
        return False
    return "/" in text or text.startswith(("~", ".")) or bool(PATH_KEY.search(key.rsplit(".", 1)[-1]))


def _comparable(value: Any, cwd: Optional[str] = None, key: str = "") -> Any:
    """A value as it is compared: a path resolved (`~` expanded, a relative one against the directory the run was
    launched from, else here), so that the relative and the absolute path of one world are one value."""
    if isinstance(value, str) and _looks_like_path(value, key):
        return os.path.realpath(os.path.join(cwd or os.getcwd(), os.path.expanduser(value)))
    return value


# Config sections that do not apply to a run, by its task and settings: an empty cell, never a difference.
def applies(row: RunRow, key: str) -> bool:
    """Whether config `key` has a say in what `row` computed (qff.focus does not on a retrieval-only evaluation)."""
    task = (row.task or "").split(" ")[0]
    cfg = row.config
    if task == "train":
        return not key.startswith(
            (
                "eval.",
                "cda.",
                "generation.",
                "components.generator.",
                "components.reranker.",
                "components.judge.",
                "components.splitter.",
            )
        )
    if task != "evaluate":
        return True
    if key == "qff.temperature" and cfg.get("cda.theta_on") == "softmax" and cfg.get("eval.stop_after") != "filter":
        return True  # theta compares a softmax of S / qff.temperature (qkvqa.cda.select.theta_scores)
    kind = cfg.get("eval.filter", "qff")
    read = reads_filter_key(kind, key)  # a key only some filter kinds read (qkvqa.pipeline.filters)
    if read is False:
        return False
    if cfg.get("eval.stop_after") == "filter" and key.startswith(
        (
            "cda.",
            "generation.",
            "components.generator.",
            "components.reranker.",
            "components.judge.",
            "components.splitter.",
            "eval.judge",
            "eval.context",
        )
    ):
        return False
    if key.startswith("qff.") and read and key.split(".", 1)[1] in TRAINING_ONLY_QFF:
        return False
    return True


# qff.* keys that only training reads (an evaluation reads the trained QFF, whose record has them: `trained.*`)
TRAINING_ONLY_QFF = (
    "lr",
    "weight_decay",
    "betas",
    "eps",
    "pct_start",
    "div_factor",
    "num_negatives",
    "temperature",
    "learnable_temperature",
    "in_batch_negatives",
    "negatives",
    "val_negatives",
    "max_train_samples",
    "max_val_samples",
    "mining_top_k",
    "mining_gold_sections",
    "keep_gold_negatives",
    "val_top_k",
    "schedule_steps",
    "dropout",
    "new_block_lr_scale",
    "gradient_checkpointing",
    "vit_cache",
    "vit_cache_shard_size",
    "vit_cache_batch_size",
)


def swept_keys(rows: list[RunRow]) -> list[str]:
    """The differing config keys that are settings of the runs (not paths, logging, launch, notes or bulk data).

    Runs of several experiments differ in every key the experiments set; those keys are implied by the `experiment`
    column, so only `experiment` and the keys that vary between runs of one experiment are shown (--all: every key)."""
    from qkvqa.loggers.wandb import BULK_KEYS

    keys = [
        k
        for k in differing_keys(rows)
        if not k.startswith(NOT_SWEPT_PREFIXES) and k not in NOT_SWEPT and k.rsplit(".", 1)[-1] not in BULK_KEYS
    ]
    groups: dict[Any, list[RunRow]] = {}
    for row in rows:
        groups.setdefault(row.experiment, []).append(row)
    if len(groups) < 2:
        return keys
    within = {k for group in groups.values() if len(group) > 1 for k in differing_keys(group)}
    return [k for k in keys if k == "experiment" or k in within]


def differing_keys(rows: list[RunRow]) -> list[str]:
    """Config keys whose value is not the same in every row it applies to (a key missing from such a row counts as
    differing; paths compare resolved)."""
    out = []
    for key in sorted({k for r in rows for k in r.config} - set(NOT_COMPARED)):
        values = {_key(r.config[key], r.cwd, key) if key in r.config else "<missing>" for r in rows if applies(r, key)}
        if len(values) > 1:
            out.append(key)
    return out


def _parse_filter_value(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


# Data-preparation jobs that got an automatic run id (`<date>-<time>-<experiment>-<hex>`): left out of the default
# view, where they crowded the runs being compared (--task embed / --all shows them).
AUTO_RUN_ID = re.compile(r"^\d{8}-\d{6}-.+-[0-9a-f]{4}$")
PREP_TASKS = ("embed", "index", "cache-vit", "mine")


def default_view(rows: Iterable[RunRow]) -> tuple[list[RunRow], list[RunRow]]:
    """(rows shown by default, auto-named embed / index / cache-vit / mine runs left out)."""
    shown, hidden = [], []
    for row in rows:
        prep = (row.task or "").split(" ")[0] in PREP_TASKS and AUTO_RUN_ID.match(row.run_id or "")
        (hidden if prep else shown).append(row)
    return shown, hidden


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
        if rows and key not in ALL_IDENTITY_COLUMNS and key not in known:  # a typo would give an empty table
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
            hint = (
                did_you_mean(name, known, "./")
                or f" (they have: {', '.join(known[:12])}{', ...' if len(known) > 12 else ''})"
            )
            raise ConfigError(f"--metric {name!r}: no compared run has it{hint}")


def default_metrics(rows: Iterable[RunRow]) -> list[str]:
    """DEFAULT_METRICS of the compared runs' tasks that some run has."""
    rows = list(rows)
    known = set(known_metrics(rows))
    tasks = list(dict.fromkeys((r.task or "").split(" ")[0] for r in rows))
    return [m for t in tasks for m in DEFAULT_METRICS.get(t, []) if m in known]


def build_table(
    rows: Iterable[RunRow],
    metric: Optional[str] = None,
    goal: str = "min",
    metrics: Optional[list[str]] = None,
    all_columns: bool = False,
) -> Table:
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
    columns = (
        identity + config_cols + metric_cols + (BEST_COLUMNS if metric else []) + (["runtime_s"] if all_columns else [])
    )
    records = []
    for row in rows:
        record: dict[str, Any] = {"run_id": row.run_id, "task": row.task, "state": row.state}
        if all_columns:
            record["experiment"] = row.experiment
        record.update({k: row.config.get(k) if applies(row, k) else None for k in config_cols})
        record.update({k: row.summary.get(k) for k in metric_cols})  # the final value (summary.json)
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


SIGNIFICANT = 4  # figures a float shows in the table and Markdown (csv and json keep every digit)
FORMATS = ("table", "markdown", "md", "csv", "json")


def _cell(value: Any, markdown: bool) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _round(value) if markdown else repr(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    text = str(value)
    return text.replace("|", "\\|") if markdown else text


def _markdown_cell(value: Any) -> str:
    """A cell of `--format markdown`: HTML in a question or value is shown as text, never rendered (issue 44)."""
    if value is None or isinstance(value, (bool, float)):
        return _cell(value, markdown=True)
    return md_text(json.dumps(value) if isinstance(value, (list, dict)) else value)


def _round(value: float) -> str:
    """A float to SIGNIFICANT figures, without an exponent for the values a metric table holds (0.0001 to 10^6)."""
    if value != value or value in (float("inf"), float("-inf")):
        return str(value)
    if value == 0 or 1e-4 <= abs(value) < 1e6:
        from decimal import Decimal

        text = format(Decimal(f"{value:.{SIGNIFICANT}g}"), "f")
        return text.rstrip("0").rstrip(".") if "." in text else text
    return f"{value:.{SIGNIFICANT}g}"


def _shorten(text: str, width: int) -> str:
    """`text` cut to `width` characters in its middle (run ids and paths differ at both ends)."""
    if len(text) <= width:
        return text
    keep = width - 1
    return text[: (keep + 1) // 2] + "…" + text[len(text) - keep // 2 :]


def terminal_width() -> int:
    """The width the default table fits: the terminal's, $COLUMNS when set, else 100."""
    import shutil

    return shutil.get_terminal_size((100, 24)).columns


def render_text(table: Table, width: Optional[int] = None, cell_width: int = 24) -> str:
    """The table in aligned columns that fit `width` characters (default: the terminal's): long cells are cut in
    the middle; columns that do not fit are named below it (--format markdown|csv|json shows every one)."""
    width = width or terminal_width()
    header = list(table.columns)
    if table.metric:
        header[header.index("best_value")] = f"best {table.metric}"
    limit = [40 if c == "run_id" else cell_width for c in table.columns]  # run ids are what a user types
    cells = [
        [_shorten(_cell(r.get(c), markdown=True), limit[i]) for i, c in enumerate(table.columns)] for r in table.records
    ]
    widths = [max([len(_shorten(h, cell_width))] + [len(row[i]) for row in cells]) for i, h in enumerate(header)]
    shown, used = [], 0
    for i, w in enumerate(widths):
        if i < 1 or used + w + 2 <= width:  # the run id always; then what fits, in order
            shown.append(i)
            used += w + 2
    lines = ["  ".join(_shorten(header[i], cell_width).ljust(widths[i]) for i in shown).rstrip()]
    lines.append("  ".join("-" * widths[i] for i in shown))
    lines += ["  ".join(row[i].ljust(widths[i]) for i in shown).rstrip() for row in cells]
    hidden = [header[i] for i in range(len(header)) if i not in shown]
    if hidden:
        note = f"({len(hidden)} more columns: {', '.join(hidden)}; --format markdown|csv|json shows them)"
        lines.append(_wrap(note, width))
    return "\n".join(lines) + "\n"


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width=max(width, 20)))


def render_table(table: Table, fmt: str, width: Optional[int] = None) -> str:
    """The table as aligned text fitted to `width` (`table`), Markdown (`markdown`/`md`), CSV (`csv`) or a JSON
    list of records (`json`; every digit kept, as in CSV)."""
    if fmt == "table":
        return render_text(table, width)
    if fmt == "json":
        return json.dumps([{c: r.get(c) for c in table.columns} for r in table.records], indent=1, default=str) + "\n"
    if fmt == "markdown":
        fmt = "md"
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
        lines = ["| " + " | ".join(md_text(h) for h in header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(_markdown_cell(r.get(c)) for c in table.columns) + " |" for r in table.records]
        return "\n".join(lines) + "\n"
    raise ConfigError(f"unknown table format {fmt!r}: use one of {', '.join(FORMATS)}")


def write_table(table: Table, fmt: str, out: Optional[str | os.PathLike] = None) -> str:
    """Render the table; write it atomically to `out` when given. Returns the text."""
    text = render_table(table, fmt)
    if out is not None:
        atomic_write_text(Path(out), text)
    return text
