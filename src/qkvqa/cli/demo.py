"""`qkvqa demo`: the whole method end to end on the embedded synthetic world (what `make demo` runs)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `demo` command."""
    parser = subparsers.add_parser(
        "demo",
        help="run the whole method on the synthetic world and print a comparison",
        description="Generate the synthetic KB-VQA world, train the stage-1 image encoder on its train split, embed and "
        "index it, train the QFF with and without "
        "question focus, evaluate retrieval only / QFF none / QFF per_layer / top-1 section against "
        "CDA, print the comparison and write report.md with plots into checkpoints/demo/. A second "
        "run reuses every finished stage.",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(".cache/qkvqa/demo"),
        help="where the world and its caches go (default: .cache/qkvqa/demo)",
    )
    parser.add_argument("--runs", type=Path, default=Path("checkpoints"), help="the run root (default: checkpoints)")
    parser.add_argument("--entities", type=int, default=120, help="synthetic world size (default: 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="QFF training epochs (default: the demo experiments', 5); 1 is a quick look",
    )
    parser.add_argument(
        "--retriever-steps",
        type=int,
        default=None,
        help="steps of the stage-1 image encoder's training (default: demo/evaluate's retrieval.pretrain.steps)",
    )
    parser.add_argument(
        "--questions",
        type=int,
        default=48,
        help="with the real models, evaluate a seeded sample of this many test questions (the same in every row; "
        "SmolLM2 answers about one a second on an idle core; 0: all of them; default: 48)",
    )
    parser.add_argument(
        "--tiny-models",
        action="store_true",
        help="tiny random generator and chunk scorer (the extractive reader answers) instead of the wheels' SmolLM2 and "
        "MiniLM: a quick look, and the tests",
    )
    parser.set_defaults(func=_demo, opens_run=True)


def _demo(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("WANDB_MODE", "disabled")
    from qkvqa.cli.main import main
    from qkvqa.demo.run import Demo

    if args.epochs is not None and args.epochs < 1:
        from qkvqa.errors import ConfigError

        raise ConfigError(f"--epochs must be at least 1, got {args.epochs}")
    if args.retriever_steps is not None and args.retriever_steps < 1:
        from qkvqa.errors import ConfigError

        raise ConfigError(f"--retriever-steps must be at least 1, got {args.retriever_steps}")
    if args.questions < 0:
        from qkvqa.errors import ConfigError

        raise ConfigError(f"--questions must be 0 (all) or more, got {args.questions}")
    Demo(
        args.dir.resolve(),
        args.runs.resolve(),
        args.entities,
        args.seed,
        epochs=args.epochs,
        retriever_steps=args.retriever_steps,
        real_models=not args.tiny_models,
        questions=args.questions,
        run_command=main,
    ).run()
    return 0
