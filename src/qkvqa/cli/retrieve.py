"""`qkvqa retrieve`: top-K KB articles for every question of a split, results in the OMGM layout, Recall@K."""

from __future__ import annotations

import argparse
import json
import numbers

from qkvqa.cli.embed import expand_shorthands
from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add the `retrieve` command."""
    parser = subparsers.add_parser(
        "retrieve",
        help="retrieve the top-K articles of a split and report Recall@K",
        description="As a run: embed the split's query images (cached, resumable), search the config's index "
        "(checked against the KB and encoders), keep the top retrieval.top_k articles per question "
        "(image_to_image: one per article, its best image) and write run_dir/retrieval_{split}.json "
        "in the OMGM layout {data_id: {retrieved_entities: [{url, title}], "
        "retrieval_similarities}}. Recall@{1,5,10,20} go into summary.json. split=X is short for "
        "retrieval.split=X. With retrieval.results=FILE (OMGM or EchoSight layout) that file is "
        "scored and rewritten instead.",
    )
    add_override_args(parser)
    parser.set_defaults(func=_run, opens_run=True)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.retrieval.embed import write_skipped_images
    from qkvqa.retrieval.results import write_results
    from qkvqa.retrieval.retrieve import retrieve_split, summary_values
    from qkvqa.run.job import run_job

    args.overrides = expand_shorthands(args.overrides)
    cfg = config_from_args(args)
    with run_job(cfg, "retrieve") as job:
        result = retrieve_split(cfg, benchmark=build_benchmark(cfg.data))
        path = write_results(job.run.run_dir / f"retrieval_{result.split}.json", result.results, result.stage1_text)
        job.record.update_summary(
            {**summary_values(result.split, result.metrics), f"retrieval/{result.split}/results": str(path)}
        )
        job.record.append_metrics(
            {
                f"retrieval/{result.split}/{k}": v
                for k, v in result.metrics.items()
                if isinstance(v, numbers.Real) and not isinstance(v, bool)
            },
            step=0,
        )
        if result.query_set is not None:
            write_skipped_images(job.run.run_dir, result.skipped_images)
    print(json.dumps({"run_dir": str(job.run.run_dir), "results": str(path), **result.metrics}))
    return 0
