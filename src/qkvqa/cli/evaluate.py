"""`qkvqa evaluate experiment=...`: run the whole pipeline over a split and score it (resumable, DDP exactly-once)."""

from __future__ import annotations

import argparse

from qkvqa.config.cli import add_override_args, config_from_args

SHORTHANDS = {"split": "eval.split"}  # split=X is short for eval.split=X


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `evaluate` command."""
    parser = subparsers.add_parser(
        "evaluate",
        help="retrieve, filter, select context, generate and score a split",
        description="Run the KB-VQA pipeline (stage-1 results -> QFF rerank or another eval.filter -> CDA -> "
        "generator) over eval.split, write predictions.jsonl, scores.json and report.md into "
        "checkpoints/<run_id>/, and score strictly with the official metrics. A killed run "
        "restarted with the same run_id and resume=auto skips the questions already answered. "
        "Under DDP (preset=ddp / ddp_cpu_sim) every question is answered exactly once. "
        "split=X is short for eval.split=X, as for retrieve, mine and rerank.",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse what is otherwise counted and warned: question rows that repeat another row "
        "exactly (eval.strict=true)",
    )
    add_override_args(parser)
    parser.set_defaults(func=_evaluate, opens_run=True)


def _evaluate(args: argparse.Namespace) -> int:
    import json

    from qkvqa.cli.embed import expand_shorthands
    from qkvqa.pipeline.evaluate import run_evaluation
    from qkvqa.utils.command_line import remember

    remember("evaluate" + (" --strict" if args.strict else ""), args.overrides)  # for the commands it suggests
    args.overrides = expand_shorthands(args.overrides, SHORTHANDS) + (["eval.strict=true"] if args.strict else [])
    scores = run_evaluation(config_from_args(args))
    if scores:
        from qkvqa.pipeline.scoring import flat_metrics

        print(json.dumps(flat_metrics(scores), indent=2))
    return 0
