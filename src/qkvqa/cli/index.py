"""`qkvqa index build|check`: build the faiss index of retrieval.mode from its KB shards, or check one."""
from __future__ import annotations

import argparse
import json

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add `index build` and `index check`."""
    parser = subparsers.add_parser(
        "index", help="build or check the faiss index of retrieval.mode",
        description="faiss indexes over the KB embeddings of `qkvqa embed` (inner product on unit vectors).")
    commands = parser.add_subparsers(dest="index_command", metavar="<build|check>", required=True)
    build = commands.add_parser(
        "build", help="build the index from the KB embedding shards",
        description="Build, as a run, the index of retrieval.mode (image_to_summary: one vector per article; "
                    "image_to_image: one per KB image) with retrieval.index_factory (Flat, IVF4096,Flat, "
                    "IVF4096,PQ64, HNSW32, ...) into retrieval.index_dir (default {paths.cache_dir}/indexes/...). "
                    "IVF/PQ train on retrieval.index_train_size sampled vectors; vectors are added "
                    "retrieval.index_add_batch at a time; faiss-gpu is used when present (retrieval.index_gpu). "
                    "A manifest records mode, encoders, dim, count, KB checksum, factory and text source.")
    add_override_args(build)
    build.set_defaults(func=_build)
    check = commands.add_parser(
        "check", help="check that the index of a config matches its KB and encoders",
        description="Load the config's index and print its manifest; a stale or mismatched index (KB checksum, "
                    "count, dim, encoder, mode) fails with what differs and how to rebuild it.")
    add_override_args(check)
    check.set_defaults(func=_check)


def _build(args: argparse.Namespace) -> int:
    from qkvqa.retrieval.retrieve import build_index_from_config
    from qkvqa.run.job import run_job

    cfg = config_from_args(args)
    with run_job(cfg, "index build") as job:
        index_dir, manifest = build_index_from_config(cfg)
        job.record.update_summary({"index/dir": str(index_dir), **{f"index/{k}": manifest[k] for k in (
            "mode", "factory", "dim", "count", "build_seconds", "gpu", "trained_on")},
            **{f"index/kb_skipped/{k}": v for k, v in manifest["kb_skipped"].items()}})
    print(json.dumps({"run_dir": str(job.run.run_dir), "index_dir": str(index_dir), "mode": manifest["mode"],
                      "factory": manifest["factory"], "count": manifest["count"], "dim": manifest["dim"]}))
    return 0


def _check(args: argparse.Namespace) -> int:
    from qkvqa.retrieval.retrieve import load_index_from_config

    loaded = load_index_from_config(config_from_args(args))
    print(json.dumps({"index_dir": str(loaded.path), **loaded.manifest}, indent=2))
    return 0
