"""`qkvqa compare`: one table of runs (local run records or a W&B project), as Markdown/CSV, plus plots."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

DESCRIPTION = """\
Compare runs in one table: run_id, state, experiment, the config keys that differ between the runs,
the final metrics of summary.json, the best value of --metric (and its step) from metrics.csv, and
the runtime. Sources: run directories, sweep directories (their manifest) or a checkpoints root
(default: checkpoints), all read offline; or --wandb ENTITY/PROJECT through the W&B public API.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `compare` command."""
    parser = subparsers.add_parser("compare", help="compare runs in one table (local run records or W&B)",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="run dir, sweep dir or checkpoints root (default: checkpoints)")
    parser.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read the runs of this W&B project instead")
    parser.add_argument("--filter", action="append", default=[], metavar="key=value",
                        help="keep runs whose config key (or run_id/state/experiment) equals value; repeatable")
    parser.add_argument("--metric", metavar="NAME",
                        help="metric to rank by, e.g. val/article_r1 (default: a sweep dir's metric)")
    parser.add_argument("--goal", choices=["min", "max"], help="is a smaller or larger --metric better (default: "
                        "a sweep dir's goal, else max)")
    parser.add_argument("--format", choices=["md", "csv"], help="output format (default: from --out, else md)")
    parser.add_argument("--out", metavar="FILE", help="write the table here instead of printing it")
    parser.add_argument("--plot", metavar="PARAM", help="also plot --metric against this config key (PNG)")
    parser.add_argument("--plot-out", metavar="FILE",
                        help="PNG path (default: <metric>_vs_<param>.png beside --out, else here)")
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
    from qkvqa.compare.table import build_table, filter_rows, write_table
    from qkvqa.errors import ConfigError

    paths = args.paths or ([] if args.wandb else ["checkpoints"])
    sweep_metric, sweep_goal = _sweep_metric(paths)
    metric = args.metric or sweep_metric
    goal = args.goal or sweep_goal or "max"
    if args.plot and not metric:
        raise ConfigError("--plot needs --metric (the value plotted against the parameter)")
    rows = collect_wandb(args.wandb) if args.wandb else collect_local(paths)
    rows = filter_rows(rows, args.filter)
    table = build_table(rows, metric, goal)
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
        print(f"plot -> {plot_metric_vs_param(rows, args.plot, metric, args.plot_out or default, goal)}")
    return 0
