"""Plot a metric against a swept parameter (Figure 5: accuracy against qff.alpha) as a PNG: every run, mean ± sd, n."""

from __future__ import annotations

import math
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable

from qkvqa.compare.rows import RunRow
from qkvqa.errors import ConfigError

# Metrics that are rates in percent (docs/training.md): their y-axis starts at 0
RATE = re.compile(r"(acc|accuracy|recall|(^|[/_])r1|r1_c|nr_c|answer_in_context)", re.IGNORECASE)


def is_rate(metric: str) -> bool:
    """A percentage metric (accuracy, recall, R@1, ...): plotted from 0."""
    return bool(RATE.search(metric))


def metric_points(
    rows: Iterable[RunRow], param: str, metric: str, goal: str, which: str = "best"
) -> list[tuple[Any, float]]:
    """(parameter value, the run's `which` (best | last) value of `metric`) of every finished row that has both: a
    failed, interrupted or running run's value is a partial one, not a result (`unfinished_runs` counts them)."""
    points = []
    for row in rows:
        if param not in row.config or row.state != "finished":
            continue
        value, _ = row.value(metric, which, goal)
        if value is not None:
            points.append((row.config[param], value))
    return points


def unfinished_runs(rows: Iterable[RunRow], param: str) -> int:
    """The rows with `param` that `metric_points` leaves out because they did not finish."""
    return sum(1 for row in rows if param in row.config and row.state != "finished")


def group_stats(points: list[tuple[Any, float]]) -> dict[Any, tuple[int, float, float]]:
    """{x: (n, mean, sample sd)}; sd is 0 for a single run."""
    by_x: dict[Any, list[float]] = defaultdict(list)
    for x, y in points:
        by_x[x].append(y)
    out = {}
    for x, ys in by_x.items():
        mean = sum(ys) / len(ys)
        sd = math.sqrt(sum((y - mean) ** 2 for y in ys) / (len(ys) - 1)) if len(ys) > 1 else 0.0
        out[x] = (len(ys), mean, sd)
    return out


def plot_metric_vs_param(
    rows: Iterable[RunRow], param: str, metric: str, out: str | os.PathLike, goal: str = "max", which: str = "best"
) -> Path:
    """Write a PNG of `metric_figure` to `out`."""
    fig = metric_figure(rows, param, metric, goal, which)  # selects the Agg backend before pyplot is imported
    import matplotlib.pyplot as plt

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def metric_figure(rows: Iterable[RunRow], param: str, metric: str, goal: str = "max", which: str = "best"):
    """`metric` against config key `param`: every run as a point (its best value over its history by `goal`, or its
    last), and per value of `param` the mean with ± one sample sd and n; a rate's y-axis starts at 0."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(rows)
    points, left_out = metric_points(rows, param, metric, goal, which), unfinished_runs(rows, param)
    if not points:
        raise ConfigError(
            f"no finished run has both config key {param!r} and metric {metric!r}; nothing to plot"
            + (f" ({left_out} unfinished runs left out)" if left_out else "")
        )
    numeric = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x, _ in points)
    points = [(x if numeric else str(x), y) for x, y in points]
    stats = group_stats(points)
    line_x = sorted(stats) if numeric else list(stats)
    fig, ax = plt.subplots(figsize=(5.5, 3.8), dpi=120)
    ax.scatter([x for x, _ in points], [y for _, y in points], s=14, alpha=0.5, label="each run")
    ax.errorbar(
        line_x,
        [stats[x][1] for x in line_x],
        yerr=[stats[x][2] for x in line_x],
        marker="o",
        capsize=3,
        label="mean ± sd",
    )
    for x in line_x:
        ax.annotate(f"n={stats[x][0]}", (x, stats[x][1]), textcoords="offset points", xytext=(4, 4), fontsize=7)
    value = f"best ({goal}) over each run's history" if which == "best" else "last value of each run"
    ax.set_xlabel(param)
    if is_rate(metric):
        highest = max([y for _, y in points] + [mean + sd for _, mean, sd in stats.values()])
        ax.set_ylim(bottom=0, top=max(highest * 1.05, 1e-9))  # the error bars fit too
        ax.set_ylabel(f"{metric} (%)")
    else:
        ax.set_ylabel(f"{metric} (axis not from 0)" if min(y for _, y in points) > 0 else metric)
    unfinished = f" ({left_out} unfinished left out)" if left_out else ""
    ax.set_title(f"{metric} vs {param}\n{value}; {len(points)} runs{unfinished}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
