"""`qkvqa embed`: embed KB article texts, KB images or a split's query images into resumable shards."""

from __future__ import annotations

import argparse
import json

from qkvqa.config.cli import add_override_args, config_from_args

SHORTHANDS = {"what": "retrieval.embed_what", "split": "retrieval.split"}


def expand_shorthands(overrides: list[str], shorthands: dict[str, str] = SHORTHANDS) -> list[str]:
    """`what=X` -> `retrieval.embed_what=X` and `split=X` -> `retrieval.split=X` (or another `shorthands` map);
    other tokens unchanged."""
    out = []
    for token in overrides:
        key, sep, value = token.partition("=")
        out.append(f"{shorthands[key]}={value}" if sep and key in shorthands else token)
    return out


def register(subparsers) -> None:
    """Add the `embed` command."""
    parser = subparsers.add_parser(
        "embed",
        help="embed KB texts / KB images / query images into resumable shards",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Embed, as a run, one set of vectors into {paths.cache_dir}/embeddings (or retrieval.embed_dir):\n"
        "  what=kb            the KB side of retrieval.mode (default: retrieval.embed_what)\n"
        "  what=kb_text       one text per article (image_to_summary): the lead section, or the\n"
        "                     retrieval.summaries JSONL with retrieval.summary_source=summaries\n"
        "  what=kb_images     every KB image_urls entry (image_to_image), files from the title ->\n"
        "                     image CSVs or data.images.kb_image_url_store\n"
        "  what=query_images  the unique query images of split=train|val|test (retrieval.split)\n"
        "Shards of retrieval.shard_size source rows are written atomically with a done record; a\n"
        "rerun skips finished shards and recomputes missing or corrupt ones. Missing and corrupt\n"
        "images are counted in the run summary and listed in skipped_images.json.\n\n"
        "Several GPUs: one process per GPU, each taking every num-shards-th shard, e.g.\n"
        "  for i in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$i qkvqa embed experiment=X \\\n"
        "      --shard-index $i --num-shards 4 & done; wait\n"
        "then `qkvqa index build experiment=X` once every shard is done.",
    )
    add_override_args(parser)
    parser.add_argument("--shard-index", type=int, default=0, help="this process's share (0-based, default 0)")
    parser.add_argument("--num-shards", type=int, default=1, help="number of processes sharing the work (default 1)")
    parser.add_argument(
        "--max-shards",
        type=int,
        default=None,
        help="stop after computing this many shards (for time-limited jobs; rerun to continue)",
    )
    parser.set_defaults(func=_run, opens_run=True)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.retrieval.embed import Embedder, resolve_target, write_skipped_images
    from qkvqa.run.job import run_job

    args.overrides = expand_shorthands(args.overrides)
    cfg = config_from_args(args)
    kind = resolve_target(cfg)
    with run_job(cfg, "embed") as job:
        report = Embedder(cfg, kind, benchmark=build_benchmark(cfg.data)).run(
            shard_index=args.shard_index, num_shards=args.num_shards, max_shards=args.max_shards
        )
        summary = report.summary()
        job.record.update_summary({f"embed/{kind}/{name}": value for name, value in summary.items()})
        if kind != "kb_text":
            write_skipped_images(job.run.run_dir, report.set.skipped())
    print(json.dumps({"run_dir": str(job.run.run_dir), **summary}))
    return 0
