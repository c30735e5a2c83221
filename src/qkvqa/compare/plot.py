"""Plot a metric against a swept parameter (e.g. Figure 5: accuracy against qff.alpha) as a PNG."""
from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from qkvqa.compare.rows import RunRow
from qkvqa.errors import ConfigError


def metric_points(rows: Iterable[RunRow], param: str, metric: str, goal: str) -> list[tuple[Any, float]]:
    """(parameter value, best metric value) of every row that has both."""
    points = []
    for row in rows:
        if param not in row.config:
            continue
        value, _ = row.best(metric, goal)
        if value is not None:
            points.append((row.config[param], value))
    return points


def plot_metric_vs_param(rows: Iterable[RunRow], param: str, metric: str, out: str | os.PathLike,
                         goal: str = "max") -> Path:
    """Write a PNG of `metric` (best per run) against config key `param`; runs sharing a value are averaged."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = metric_points(rows, param, metric, goal)
    if not points:
        raise ConfigError(f"no run has both config key {param!r} and metric {metric!r}; nothing to plot")
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x, _ in points)
    xs = [x if numeric else str(x) for x, _ in points]
    by_x: dict[Any, list[float]] = defaultdict(list)
    for x, (_, y) in zip(xs, points):
        by_x[x].append(y)
    line_x = sorted(by_x) if numeric else list(by_x)
    fig, ax = plt.subplots(figsize=(5, 3.5), dpi=120)
    ax.scatter(xs, [y for _, y in points], s=14, alpha=0.6, label="runs")
    ax.plot(line_x, [sum(by_x[x]) / len(by_x[x]) for x in line_x], marker="o", label="mean")
    ax.set_xlabel(param)
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} vs {param}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
