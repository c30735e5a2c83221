"""`qkvqa summarize`: write per-article summaries (JSONL: row_id, url, summary) through the generator, resumably."""

from __future__ import annotations

import argparse
import json

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `summarize` command."""
    parser = subparsers.add_parser(
        "summarize",
        help="write per-article summaries for the image_to_summary index",
        description="Summarise every article of the KB store (data.kb_store) with the configured generator "
        "(components.generator, generation.summary_*) into a JSONL of {row_id, url, summary}. "
        "Rows already in the file are skipped, so an interrupted run resumes.",
    )
    parser.add_argument("--out", help="summaries JSONL (default: retrieval.summaries)")
    parser.add_argument("--limit", type=int, help="only the first N articles of the KB (for a quick look)")
    add_override_args(parser)
    parser.set_defaults(func=_summarize)


def _summarize(args: argparse.Namespace) -> int:
    from itertools import islice

    from omegaconf import OmegaConf

    from qkvqa.data.config import data_config_from_dict, resolve_data_path
    from qkvqa.data.kb import KBStore
    from qkvqa.errors import ConfigError
    from qkvqa.generation.backends import build_generator
    from qkvqa.generation.summarize import summarize_articles

    cfg = config_from_args(args)
    data = data_config_from_dict(cfg.data)
    if data.kb_store is None:
        raise ConfigError("qkvqa summarize needs data.kb_store (a store written by `qkvqa kb build`)")
    out = args.out or cfg.retrieval.summaries
    if out is None:
        raise ConfigError("qkvqa summarize needs --out or retrieval.summaries")
    store = KBStore.open(resolve_data_path(data, data.kb_store))
    settings = OmegaConf.to_object(cfg.generation)
    generator = build_generator(cfg.components.generator, settings)
    total = len(store) if args.limit is None else min(args.limit, len(store))
    counts = summarize_articles(islice(iter(store), total), generator, out, settings, total=total)
    print(json.dumps({"out": str(out), **counts}))
    return 0
