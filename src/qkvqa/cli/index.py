"""`qkvqa index build|import|check`: build the faiss index of retrieval.mode from its KB shards, adopt a foreign one,
or check one."""

from __future__ import annotations

import argparse
import json

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add `index build`, `index import` and `index check`."""
    parser = subparsers.add_parser(
        "index",
        help="build or check the faiss index of retrieval.mode",
        description="faiss indexes over the KB embeddings of `qkvqa embed` (inner product on unit vectors).",
    )
    commands = parser.add_subparsers(dest="index_command", metavar="<build|import|check>", required=True)
    build = commands.add_parser(
        "build",
        help="build the index from the KB embedding shards",
        description="Build, as a run, the index of retrieval.mode (image_to_summary: one vector per article; "
        "image_to_image: one per KB image) with retrieval.index_factory (Flat, IVF4096,Flat, "
        "IVF4096,PQ64, HNSW32, ...) into retrieval.index_dir (default {paths.cache_dir}/indexes/...). "
        "IVF/PQ train on retrieval.index_train_size sampled vectors; vectors are added "
        "retrieval.index_add_batch at a time; faiss-gpu is used when present (retrieval.index_gpu). "
        "A manifest records mode, encoders, dim, count, KB checksum, factory and text source.",
    )
    add_override_args(build)
    build.set_defaults(func=_build, opens_run=True)
    imported = commands.add_parser(
        "import",
        help="adopt a released faiss index (ReflectiVA's knn.index, EchoSight's kb_index.faiss, OMGM's summary index)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Adopt a faiss index built elsewhere as retrieval.index_dir of the config, each vector mapped to its\n"
        "row in the config's KB store (data.kb_store) by exactly one of:\n"
        "  --urls knn.json           a JSON list, values[row][0] = URL (ReflectiVA); more than 1% of URLs\n"
        "                            missing from the KB refuses the import\n"
        "  --ids kb_index_ids.pkl    EchoSight's pickle: a list with the KB entry index of each vector (one\n"
        "                            per KB image; use retrieval.mode=image_to_image), read with an\n"
        "                            unpickler that accepts only lists, ints and strings\n"
        "  --kb-order                OMGM's summary index (summary_llama3.index): vector i is KB entry i;\n"
        "                            its count must equal the KB's\n"
        "The config's encoders (components.image_encoder for the queries; components.text_encoder for\n"
        "image_to_summary) are recorded as the ones the index was built with, and checked at load time,\n"
        "as is retrieval.index_factory against the index's faiss type (a Flat index is Flat).\n"
        "Example: qkvqa index import --faiss knn.index --urls knn.json preset=infoseek_reflectiva_data",
    )
    imported.add_argument(
        "--faiss", required=True, help="the foreign faiss index file (knn.index, kb_index.faiss, summary_llama3.index)"
    )
    ids = imported.add_mutually_exclusive_group(required=True)
    ids.add_argument("--urls", help="its URL list (knn.json: values[row][0] = URL)")
    ids.add_argument("--ids", help="its KB entry index per vector (EchoSight's kb_index_ids.pkl)")
    ids.add_argument(
        "--kb-order", action="store_true", help="its vectors are in KB order, one per article (OMGM's summary index)"
    )
    add_override_args(imported)
    imported.set_defaults(func=_import)
    check = commands.add_parser(
        "check",
        help="check that the index of a config matches its KB and encoders",
        description="Load the config's index, re-hash its files against the sha256 in its manifest and print the "
        "manifest; a stale, mismatched (KB checksum, count, dim, encoder, mode) or corrupt index fails "
        "with what differs and how to rebuild it.",
    )
    add_override_args(check)
    check.set_defaults(func=_check)


def _build(args: argparse.Namespace) -> int:
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.retrieval.retrieve import build_index_from_config
    from qkvqa.run.job import run_job

    cfg = config_from_args(args)
    with run_job(cfg, "index build") as job:
        index_dir, manifest = build_index_from_config(cfg, build_benchmark(cfg.data))
        job.record.update_summary(
            {
                "index/dir": str(index_dir),
                **{
                    f"index/{k}": manifest[k]
                    for k in ("mode", "factory", "dim", "count", "build_seconds", "gpu", "trained_on")
                },
                **{f"index/kb_skipped/{k}": v for k, v in manifest["kb_skipped"].items()},
                **{f"index/kb_fallbacks/{k}": v for k, v in manifest.get("kb_fallbacks", {}).items()},
            }
        )
    print(
        json.dumps(
            {
                "run_dir": str(job.run.run_dir),
                "index_dir": str(index_dir),
                "mode": manifest["mode"],
                "factory": manifest["factory"],
                "count": manifest["count"],
                "dim": manifest["dim"],
            }
        )
    )
    return 0


def _import(args: argparse.Namespace) -> int:
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.errors import ConfigError
    from qkvqa.retrieval.embed import check_mode
    from qkvqa.retrieval.index import import_index
    from qkvqa.retrieval.retrieve import expected_encoders

    cfg = config_from_args(args)
    if not cfg.retrieval.index_dir:
        raise ConfigError(
            "retrieval.index_dir is not set: name the directory the imported index goes to "
            "(retrieval.index_dir=DIR), the one evaluations then read"
        )
    manifest = import_index(
        args.faiss,
        args.urls,
        cfg.retrieval.index_dir,
        kb_store=build_benchmark(cfg.data).kb_store(),
        mode=check_mode(cfg.retrieval.mode),
        encoders=expected_encoders(cfg),
        ids_file=args.ids,
        kb_order=args.kb_order,
    )
    print(
        json.dumps(
            {
                "index_dir": cfg.retrieval.index_dir,
                "count": manifest["count"],
                "dim": manifest["dim"],
                "metric": manifest["metric"],
                "format": manifest["imported"]["format"],
                "factory": manifest["factory_equivalent"],
                "unmapped_vectors": manifest["imported"]["unmapped_vectors"],
            }
        )
    )
    return 0


def _check(args: argparse.Namespace) -> int:
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.retrieval.index import verify_index_files
    from qkvqa.retrieval.retrieve import load_index_from_config, rebuild_hint

    cfg = config_from_args(args)
    loaded = load_index_from_config(cfg, build_benchmark(cfg.data))
    hashed = verify_index_files(loaded.path, loaded.manifest, rebuild_hint(cfg), force=True)
    print(json.dumps({"index_dir": str(loaded.path), "sha256_checked": hashed, **loaded.manifest}, indent=2))
    return 0
