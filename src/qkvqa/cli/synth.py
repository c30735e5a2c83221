"""`qkvqa synth`: write the deterministic synthetic KB-VQA world used by tests and `make demo`."""

from __future__ import annotations

import argparse
import json


def register(subparsers) -> None:
    """Add the `synth` command."""
    parser = subparsers.add_parser(
        "synth",
        help="generate the synthetic KB-VQA world (real E-VQA / InfoSeek formats)",
        description="Write a small deterministic KB-VQA world in exactly the released formats: a KB (JSON dict "
        "and JSONL, plus its KB store), E-VQA CSVs with all four question types, InfoSeek JSONL and "
        "CSVs, procedural query and article images (many showing 2-3 entities), the OMGM title -> "
        "image CSVs, DIR/data_evqa.yaml and DIR/data_infoseek.yaml (DataConfig sections) and "
        "DIR/world.json (what every question and image holds).",
    )
    parser.add_argument("--out", required=True, help="output directory (an old world there is replaced)")
    parser.add_argument("--entities", type=int, default=240, help="number of entities / KB articles (default 240)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0); same seed, same bytes")
    parser.add_argument(
        "--world",
        choices=["default", "focus", "bound"],
        default="default",
        help="default: the demo's world; focus: 3 facts per generic section and same-category "
        "groups (preset=focus_world); bound: 3 facts per generic section, each stated by early "
        "and by recent surveys with different values, so that only the pairing of words in a "
        "sentence tells which section answers (preset=bound_world; docs/training.md). The "
        "switches below override its choices",
    )
    parser.add_argument(
        "--facts-per-section",
        type=int,
        help="1 (default world): each fact in its own titled section; k > 1: an article's facts shuffled "
        "into generic sections of k facts each, so only the text says where a fact is",
    )
    parser.add_argument(
        "--same-category-groups",
        action="store_true",
        default=None,
        help="multi-entity images show 2-3 entities of one category and questions name the kind "
        "('this heron'), so only the article text tells which entity is asked about",
    )
    parser.add_argument(
        "--bound-facts",
        action="store_true",
        default=None,
        help="state every non-lead fact twice (early and recent surveys, other values, other "
        "sections) and ask for one of them; needs --facts-per-section 2-4",
    )
    parser.add_argument("--no-store", action="store_true", help="do not build the KB store under kb/store")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.synth.world import WORLDS, generate_world

    options = dict(WORLDS[args.world])
    if args.facts_per_section is not None:
        options["facts_per_section"] = args.facts_per_section
    if args.same_category_groups is not None:
        options["same_category_groups"] = args.same_category_groups
    if args.bound_facts is not None:
        options["bound_facts"] = args.bound_facts
    manifest = generate_world(
        args.out, entities=args.entities, seed=args.seed, build_store=not args.no_store, **options
    )
    print(
        json.dumps(
            {
                "out": args.out,
                "counts": manifest["counts"],
                "data_configs": [f"{args.out}/data_evqa.yaml", f"{args.out}/data_infoseek.yaml"],
            }
        )
    )
    return 0
