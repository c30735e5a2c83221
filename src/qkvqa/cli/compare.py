"""`qkvqa compare`: one table of runs (local run records or a W&B project), as Markdown/CSV, plus plots."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DESCRIPTION = """\
Compare runs in one table: run_id, task (the command that ran it: train, evaluate, embed, index
build, ...), state, the swept keys (config keys that differ between the compared runs; not paths,
logging or notes), the final value of each --metric (default: the headline metrics of the runs'
tasks) and the best value of the first --metric over each run's history, with its step. --all adds
every differing key, every summary metric, the experiment and the runtime. Printed, the table fits the
terminal (floats to 4 significant figures; the columns that do not fit are named below it);
--format markdown|csv|json writes every column. Paths compare resolved (a relative and an absolute path
of one world are one value); a key that does not apply to a run (qff.* on a retrieval-only evaluation)
is an empty cell; an evaluation shows the training settings of the QFF it read as trained.KEY;
auto-named embed/index/cache-vit/mine runs are left out unless --task or --all. Sources: run directories,
sweep directories (their manifest) or a checkpoints root (default: checkpoints), all read offline;
or --wandb ENTITY/PROJECT through the W&B public API. From Python: qkvqa.compare.runs(root) gives
the same table as a pandas DataFrame.

  qkvqa compare checkpoints --task evaluate --where qff.alpha=0.9 --metric eval/accuracy
  qkvqa compare checkpoints/sweeps/alpha_sweep --plot qff.alpha
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `compare` command."""
    parser = subparsers.add_parser(
        "compare",
        help="compare runs in one table (local run records or W&B)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="run dir, sweep dir or checkpoints root (default: checkpoints)"
    )
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs of this W&B project instead")
    parser.add_argument(
        "--task", metavar="COMMAND", help="keep runs of this command: train, evaluate, embed, index, mine, rerank, ..."
    )
    parser.add_argument(
        "--where",
        "--filter",
        dest="where",
        action="append",
        default=[],
        metavar="key=value",
        help="keep runs whose config key (or run_id/task/state/experiment) equals value; repeatable",
    )
    parser.add_argument(
        "--metric",
        metavar="NAME",
        action="append",
        help="a metric column, e.g. val/article_r1; the first ranks the runs (default: a sweep "
        "dir's metric); repeatable; an unknown name is an error naming the nearest",
    )
    parser.add_argument(
        "--all",
        dest="all_columns",
        action="store_true",
        help="every differing config key and summary metric, the experiment and the runtime",
    )
    parser.add_argument(
        "--goal",
        choices=["min", "max"],
        help="is a smaller or larger --metric better (default: a sweep dir's goal, else max)",
    )
    parser.add_argument(
        "--format",
        choices=["table", "markdown", "md", "csv", "json"],
        help="table: aligned columns that fit the terminal, floats to 4 significant figures (the "
        "default when printing); markdown (md), csv or json (every digit; the default for "
        "--out by its suffix, else markdown)",
    )
    parser.add_argument("--out", metavar="FILE", help="write the table here instead of printing it")
    parser.add_argument("--plot", metavar="PARAM", help="also plot --metric against this config key (PNG)")
    parser.add_argument(
        "--plot-out", metavar="FILE", help="PNG path (default: <metric>_vs_<param>.png beside --out, else here)"
    )
    parser.add_argument(
        "--plot-value",
        choices=["best", "last"],
        default="best",
        help="which value of each run's history is plotted: its best by --goal (default) or its last",
    )
    parser.set_defaults(func=_run)


def _sweep_metric(paths: list[str]) -> tuple[str | None, str | None]:
    """The metric and goal recorded in the manifest of the (single) sweep dir given, if any."""
    from qkvqa.run.sweep_manifest import Manifest

    manifests = [m for m in (Manifest.load(p) for p in paths if Path(p).is_dir()) if m is not None]
    if len(manifests) != 1:
        return None, None
    metric = manifests[0].data.get("metric") or {}
    goal = {"minimize": "min", "maximize": "max"}.get(metric.get("goal"))
    return metric.get("name"), goal


def _format_of(out: str | None) -> str:
    """The format of `--out FILE` by its suffix (markdown when none fits); `table` when printing."""
    if not out:
        return "table"
    return {".csv": "csv", ".json": "json"}.get(Path(out).suffix.lower(), "markdown")


def _run(args: argparse.Namespace) -> int:
    from qkvqa.compare.rows import collect_local, collect_wandb
    from qkvqa.compare.table import build_table, check_metrics, default_view, filter_rows, write_table
    from qkvqa.errors import ConfigError

    paths = args.paths or ([] if args.wandb else ["checkpoints"])
    sweep_metric, sweep_goal = _sweep_metric(paths)
    metric = args.metric[0] if args.metric else sweep_metric
    goal = args.goal or sweep_goal or "max"
    if args.plot and not metric:
        raise ConfigError("--plot needs --metric (the value plotted against the parameter)")
    skipped: list = []
    rows = collect_wandb(args.wandb) if args.wandb else collect_local(paths, skipped)
    if skipped:  # counted and named, the rest compared (issue 44)
        print(
            f"({len(skipped)} run director{'y' if len(skipped) == 1 else 'ies'} skipped, record unreadable: "
            + "; ".join(f"{path}: {reason}" for path, reason in skipped)
            + ")",
            file=sys.stderr,
        )
    rows = filter_rows(rows, args.where, task=args.task)
    hidden = []
    if args.task is None and not args.all_columns:
        rows, hidden = default_view(rows)
    check_metrics(rows, args.metric or [])
    table = build_table(rows, metric, goal, metrics=args.metric, all_columns=args.all_columns)
    fmt = args.format or _format_of(args.out)
    text = write_table(table, fmt, args.out)
    if hidden:
        tasks = sorted({(r.task or "").split(" ")[0] for r in hidden})
        print(
            f"({len(hidden)} auto-named {'/'.join(tasks)} run(s) not shown: --task {tasks[0]} or --all shows them)",
            file=sys.stderr,
        )
    if args.out:
        print(f"{len(table.records)} run(s) -> {args.out}")
    else:
        print(text, end="")
    if args.plot:
        from qkvqa.compare.plot import plot_metric_vs_param

        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{metric}_vs_{args.plot}")
        default = (Path(args.out).parent if args.out else Path.cwd()) / f"{slug}.png"
        png = plot_metric_vs_param(rows, args.plot, metric, args.plot_out or default, goal, args.plot_value)
        print(f"plot -> {png}")
    return 0
