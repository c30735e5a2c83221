"""`qkvqa mine`: hard-negative pools of a split from its stage-1 results and the KB (OMGM's rule), with a drop report."""

from __future__ import annotations

import argparse
import json

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add the `mine` command."""
    parser = subparsers.add_parser(
        "mine",
        help="mine the QFF's hard-negative pools of a split (OMGM step1_HardNeg layout)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="As a run, build the hard-negative pools of split=train|val (retrieval.split) with OMGM's rule:\n"
        "positive = (evidence section of the gold article, its main image); negatives = the first\n"
        "qff.mining_gold_sections (3) other sections of the gold article (with the gold image) + every\n"
        "section of every stage-1 top-qff.mining_top_k (20) article other than the gold one (with that\n"
        "article's main image; articles without an image are skipped). 'References' / 'External links'\n"
        "sections are never candidates. A sample without a gold image or with fewer than\n"
        "qff.num_negatives (15) candidates is dropped and counted.\n\n"
        "Stage-1 results come from retrieval.results=FILE (OMGM or EchoSight layout) or are retrieved\n"
        "now from the config's index. Writes, in the run directory:\n"
        "  hardneg_{split}.json            pools keyed by query-image basename (OMGM layout)\n"
        "  hardneg_{split}.articles.json   title, main image and candidate sections of every article named\n"
        "  mining_report_{split}.json      kept / dropped counts, reasons and the dropped data_ids\n"
        "Train with qff.negatives=RUN/hardneg_train.json qff.val_negatives=RUN/hardneg_val.json.",
    )
    add_override_args(parser)
    parser.set_defaults(func=_run, opens_run=True)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.cli.embed import expand_shorthands
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.qff.mining import articles_path, mine_to_dir
    from qkvqa.run.job import run_job
    from qkvqa.utils.io import read_json

    args.overrides = expand_shorthands(args.overrides)
    cfg = config_from_args(args)
    split = cfg.retrieval.split
    with run_job(cfg, "mine") as job:
        pools = mine_to_dir(cfg, split, job.run.run_dir, build_benchmark(cfg.data))
        articles = articles_path(pools)
        report_path = job.run.run_dir / f"mining_report_{split}.json"
        report = {k: v for k, v in read_json(report_path).items() if k != "dropped_samples"}
        job.record.update_summary(
            {
                f"mine/{split}/pools": str(pools),
                f"mine/{split}/articles": str(articles),
                f"mine/{split}/report": str(report_path),
                **{
                    f"mine/{split}/{k}": v
                    for k, v in report.items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                },
                **{f"mine/{split}/dropped/{k}": v for k, v in report["dropped_by_reason"].items()},
            }
        )
    print(
        json.dumps(
            {
                "run_dir": str(job.run.run_dir),
                "pools": str(pools),
                "kept": report["kept"],
                "dropped": report["dropped_by_reason"],
            }
        )
    )
    return 0
