"""`qkvqa compare`: one table of runs (local run records or a W&B project), as Markdown/CSV, plus plots."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

DESCRIPTION = """\
Compare runs in one table: run_id, task (the command that ran it: train, evaluate, embed, index
build, ...), state, the swept keys (config keys that differ between the compared runs; not paths,
logging or notes), the final value of each --metric (default: the headline metrics of the runs'
tasks) and the best value of the first --metric over each run's history, with its step. --all adds
every differing key, every summary metric, the experiment and the runtime. Sources: run directories,
sweep directories (their manifest) or a checkpoints root (default: checkpoints), all read offline;
or --wandb ENTITY/PROJECT through the W&B public API. From Python: qkvqa.compare.runs(root) gives
the same table as a pandas DataFrame.

  qkvqa compare checkpoints --task evaluate --where qff.alpha=0.9 --metric eval/accuracy
  qkvqa compare checkpoints/sweeps/alpha_sweep --plot qff.alpha
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `compare` command."""
    parser = subparsers.add_parser("compare", help="compare runs in one table (local run records or W&B)",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="run dir, sweep dir or checkpoints root (default: checkpoints)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs of this W&B project instead")
    parser.add_argument("--task", metavar="COMMAND",
                        help="keep runs of this command: train, evaluate, embed, index, mine, rerank, ...")
    parser.add_argument("--where", "--filter", dest="where", action="append", default=[], metavar="key=value",
                        help="keep runs whose config key (or run_id/task/state/experiment) equals value; repeatable")
    parser.add_argument("--metric", metavar="NAME", action="append",
                        help="a metric column, e.g. val/article_r1; the first ranks the runs (default: a sweep "
                             "dir's metric); repeatable; an unknown name is an error naming the nearest")
    parser.add_argument("--all", dest="all_columns", action="store_true",
                        help="every differing config key and summary metric, the experiment and the runtime")
    parser.add_argument("--goal", choices=["min", "max"], help="is a smaller or larger --metric better (default: "
                        "a sweep dir's goal, else max)")
    parser.add_argument("--format", choices=["md", "csv"], help="output format (default: from --out, else md)")
    parser.add_argument("--out", metavar="FILE", help="write the table here instead of printing it")
    parser.add_argument("--plot", metavar="PARAM", help="also plot --metric against this config key (PNG)")
    parser.add_argument("--plot-out", metavar="FILE",
                        help="PNG path (default: <metric>_vs_<param>.png beside --out, else here)")
    parser.add_argument("--plot-value", choices=["best", "last"], default="best",
                        help="which value of each run's history is plotted: its best by --goal (default) or "
                             "its last")
    parser.set_defaults(func=_run)


def _sweep_metric(paths: list[str]) -> tuple[str | None, str | None]:
    """The metric and goal recorded in the manifest of the (single) sweep dir given, if any."""
    from qkvqa.sweep.manifest import Manifest

    manifests = [m for m in (Manifest.load(p) for p in paths if Path(p).is_dir()) if m is not None]
    if len(manifests) != 1:
        return None, None
    metric = manifests[0].data.get("metric") or {}
    goal = {"minimize": "min", "maximize": "max"}.get(metric.get("goal"))
    return metric.get("name"), goal


def _run(args: argparse.Namespace) -> int:
    from qkvqa.compare.rows import collect_local, collect_wandb
    from qkvqa.compare.table import build_table, check_metrics, filter_rows, write_table
    from qkvqa.errors import ConfigError

    paths = args.paths or ([] if args.wandb else ["checkpoints"])
    sweep_metric, sweep_goal = _sweep_metric(paths)
    metric = args.metric[0] if args.metric else sweep_metric
    goal = args.goal or sweep_goal or "max"
    if args.plot and not metric:
        raise ConfigError("--plot needs --metric (the value plotted against the parameter)")
    rows = collect_wandb(args.wandb) if args.wandb else collect_local(paths)
    rows = filter_rows(rows, args.where, task=args.task)
    check_metrics(rows, args.metric or [])
    table = build_table(rows, metric, goal, metrics=args.metric, all_columns=args.all_columns)
    fmt = args.format or ("csv" if args.out and args.out.endswith(".csv") else "md")
    text = write_table(table, fmt, args.out)
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
