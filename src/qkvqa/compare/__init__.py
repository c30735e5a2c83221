"""Compare runs: one table schema from local run records or the W&B API, as Markdown/CSV and plots."""

from __future__ import annotations

import os
from typing import Any, Iterable, Optional


def runs(
    *paths: str | os.PathLike,
    task: Optional[str] = None,
    where: Iterable[str] = (),
    metrics: Optional[list[str]] = None,
    metric: Optional[str] = None,
    goal: str = "max",
    all_columns: bool = False,
    wandb: Optional[str] = None,
) -> Any:
    """The runs under `paths` (run dirs, sweep dirs, a checkpoints root; default `checkpoints`), or of the W&B project
    `wandb`, as a pandas DataFrame indexed by run_id with the columns of `qkvqa compare` (`all_columns`: every
    config key that differs and every summary metric). `task` and `where` ("key=value") filter as `--task` and
    `--where`; an unknown metric is a ConfigError with the nearest names. For notebooks:

        from qkvqa.compare import runs
        df = runs("checkpoints", task="evaluate")
    """
    try:
        import pandas as pd
    except ImportError:  # installed with `datasets`, not pinned by qkvqa itself
        from qkvqa.errors import ConfigError

        raise ConfigError("qkvqa.compare.runs needs pandas: pip install pandas") from None
    from qkvqa.compare.rows import collect_local, collect_wandb
    from qkvqa.compare.table import build_table, check_metrics, filter_rows

    rows = collect_wandb(wandb) if wandb else collect_local(paths or ["checkpoints"])
    rows = filter_rows(rows, where, task=task)
    check_metrics(rows, [*(metrics or []), *([metric] if metric else [])])
    table = build_table(rows, metric, goal, metrics=metrics, all_columns=all_columns)
    return pd.DataFrame.from_records(table.records, columns=table.columns).set_index("run_id")
