"""`qkvqa doctor [experiment=... overrides]`: checks a whole setup in seconds and exits 1 on anything blocking."""

from __future__ import annotations

import argparse

from qkvqa.config.cli import add_override_args, config_from_args

DESCRIPTION = """\
Check, for the composed config, everything a run needs before it starts: every configured path; per split and
question type the questions read and the query images found, missing or unreadable per image source; the KB store
against its KB file; the KB images per title -> image CSV (with the first missing path, so that a root one folder
off is obvious) and the KB's main images found; the index manifest against the KB and the config; each model
directory (architecture, dtype, revision, files); the torch build's CUDA against the driver and faiss; the free disk
against the caches the run writes. One table (or --json); exit status 1 when a row is FAIL.
--load also instantiates each model on the meta device (no weights read); --load --device cuda builds each on the
GPU and runs one forward on a fixed example (the BEM, BGE-Reranker and EVA-CLIP model cards' examples are checked;
EVA-CLIP's on a drawn diagram, its card's picture not being shipped)."""


def register(subparsers) -> None:
    """Add `qkvqa doctor`."""
    parser = subparsers.add_parser(
        "doctor",
        help="check paths, data, KB, index, models, GPU and disk before a run",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON instead of a table")
    parser.add_argument("--load", action="store_true", help="also instantiate each model on the meta device")
    parser.add_argument(
        "--device",
        default=None,
        metavar="cuda",
        help="with --load: build each model on this device and run one forward",
    )
    parser.add_argument(
        "--splits",
        default=None,
        metavar="test[,train]",
        help="question splits to check (default: the ones the config's task reads)",
    )
    parser.add_argument(
        "--open-images",
        type=int,
        default=None,
        metavar="N",
        help="query images opened per split (header read; a seeded sample beyond N, default 5000)",
    )
    add_override_args(parser)
    parser.set_defaults(func=handler)


def handler(args: argparse.Namespace) -> int:
    from qkvqa.doctor.report import blocking, render_json, render_table
    from qkvqa.doctor.run import run_doctor

    cfg = config_from_args(args)
    if args.device and not args.load:
        args.load = True
    splits = [s for s in args.splits.split(",") if s] if args.splits else None
    checks = run_doctor(cfg, load=args.load, device=args.device, splits=splits, open_images=args.open_images)
    print(
        render_json(checks, {"experiment": cfg.experiment, "presets": list(cfg.presets)})
        if args.json
        else render_table(checks)
    )
    return 1 if blocking(checks) else 0
