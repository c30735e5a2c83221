"""`qkvqa score infoseek|evqa|run`: official InfoSeek / E-VQA scores of a prediction file or a finished evaluation run."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

INFOSEEK_DESCRIPTION = """\
Score InfoSeek predictions with the official rules (edchengg/infoseek_eval): exact match over
answer_eval for String and Time, relaxed range accuracy for Numerical, overall = harmonic mean of the
rounded unseen-question and unseen-entity scores. As in the official scorer, unknown ids are dropped,
questions without a prediction are not counted and duplicates count twice; the `coverage` entry
reports all three, and --strict makes them an error. A row with a "skipped" reason (a question qkvqa
could not answer) counts as wrong, so the figures equal `qkvqa evaluate`'s on the same predictions.jsonl. JSON goes to stdout, a table to stderr."""

EVQA_DESCRIPTION = """\
Score E-VQA predictions with the official rules (google-research encyclopedic_vqa): exact match
first, then the BEM judge for answers EM rejects. Predictions are JSONL {"data_id", "prediction"}
joined with the question CSV by data_id (E-VQA_{i} among single-hop rows, E-VQA_2hop_{j} among 2_hop
rows; --single-hop-only leaves the 2_hop rows out). A row with a "skipped" reason (a question qkvqa could
not answer) counts as wrong, so the figures equal `qkvqa evaluate`'s on the same predictions.jsonl. Choose the judge: --bem DIR (a local BERT sequence classifier such as
kortukov/answer-equivalence-bem), --bem-tiny (a random tiny model, for smoke tests) or --em-only.
Results are labelled "EM only" or "BEM (PyTorch reproduction)". JSON goes to stdout, a table to stderr."""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `score` command with its `infoseek` and `evqa` sub-commands."""
    parser = subparsers.add_parser(
        "score",
        help="score predictions with the official InfoSeek / E-VQA rules",
        description="Score a prediction file with the official rules of a benchmark.",
    )
    sub = parser.add_subparsers(dest="score_command", metavar="<infoseek|evqa|run>", required=True)

    run = sub.add_parser(
        "run",
        help="re-score a finished `qkvqa evaluate` run (another judge) without regenerating",
        description="Re-score the predictions of a finished evaluation run in place: its saved config, with the "
        "scoring keys changed by key=value overrides (eval.judge, components.judge, "
        "eval.exclude_skipped); the answers stay, the filter and the generator are not loaded. "
        "scores.json, report.md and summary.json are rewritten. Example:\n"
        "  qkvqa score run checkpoints/RUN eval.judge=bem components.judge.pretrained=weights/bem",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("run_dir", help="the run directory of `qkvqa evaluate` (holds config.yaml, predictions.jsonl)")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="scoring keys to change")
    run.set_defaults(func=_score_run, opens_run=True)

    infoseek = sub.add_parser(
        "infoseek",
        help="official InfoSeek score",
        description=INFOSEEK_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    infoseek.add_argument("--predictions", required=True, help='JSONL of {"data_id", "prediction"}')
    infoseek.add_argument("--references", required=True, help="official reference JSONL (infoseek_val.jsonl)")
    infoseek.add_argument("--qtypes", required=True, help="question-type JSONL (infoseek_val_qtype.jsonl)")
    infoseek.add_argument(
        "--strict",
        action="store_true",
        help="fail unless every reference id has exactly one prediction and none is unknown",
    )
    infoseek.set_defaults(func=_score_infoseek)

    evqa = sub.add_parser(
        "evqa",
        help="official E-VQA accuracy (EM, then BEM)",
        description=EVQA_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    evqa.add_argument("--predictions", required=True, help='JSONL of {"data_id", "prediction"}')
    evqa.add_argument("--questions", required=True, help="E-VQA question CSV (test.csv / val.csv)")
    judge = evqa.add_mutually_exclusive_group(required=True)
    judge.add_argument("--bem", metavar="PATH", help="BEM model directory (or a hub id already in the local cache)")
    judge.add_argument("--bem-tiny", action="store_true", help="a random tiny BEM model (smoke tests only)")
    judge.add_argument("--em-only", action="store_true", help="exact match only, no BEM")
    evqa.add_argument(
        "--single-hop-only",
        action="store_true",
        help="score only the single-hop rows (by default every row counts, 2_hop ones as "
        "E-VQA_2hop_{j}, like `qkvqa evaluate` and the paper's headline 'all')",
    )
    evqa.add_argument(
        "--strict",
        action="store_true",
        help="fail unless every question has exactly one prediction and none is unknown",
    )
    evqa.add_argument("--batch-size", type=int, default=32, help="BEM batch size (default 32)")
    evqa.add_argument("--device", default="auto", help="BEM device: auto | cpu | cuda[:N] (default auto)")
    evqa.add_argument(
        "--bem-overflow",
        choices=("raise", "truncate"),
        default="raise",
        help="inputs over 512 tokens: raise (default, like the official BEM) or truncate and count",
    )
    for command in (infoseek, evqa):
        command.add_argument(
            "--per-question", metavar="PATH", help="also write one JSON line per scored question to PATH"
        )
    evqa.set_defaults(func=_score_evqa)


def _score_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from omegaconf import OmegaConf

    from qkvqa.config.load import from_saved
    from qkvqa.config.schema import check_values
    from qkvqa.errors import ConfigError, DataError
    from qkvqa.pipeline.evaluate import QUESTION_IDS, run_evaluation
    from qkvqa.pipeline.predictions import PredictionStore
    from qkvqa.pipeline.scoring import flat_metrics
    from qkvqa.utils.io import read_json

    run_dir = Path(args.run_dir).expanduser().resolve()
    for name in ("config.yaml", QUESTION_IDS):
        if not (run_dir / name).is_file():
            raise DataError(
                f"{run_dir / name}: not found; `qkvqa score run` re-scores a `qkvqa evaluate` run directory"
            )
    allowed = ("eval.judge", "components.judge", "eval.exclude_skipped")
    for token in args.overrides:
        if not token.split("=", 1)[0].lstrip("~+").startswith(allowed):
            raise ConfigError(
                f"score run: {token!r} is not a scoring key; only {', '.join(allowed)} may change "
                "(anything else changes the answers: run `qkvqa evaluate` with another run_id)"
            )
    cfg = from_saved(run_dir / "config.yaml", args.overrides)
    if cfg.task != "evaluate":
        raise ConfigError(f"{run_dir}: a {cfg.task!r} run; `qkvqa score run` re-scores evaluation runs")
    wanted = read_json(run_dir / QUESTION_IDS)["ids"]
    done = PredictionStore(run_dir).done_ids()  # read once: per id it read every prediction row again
    left = [i for i in wanted if i not in done]
    if left:
        raise DataError(
            f"{run_dir}: {len(left)} of {len(wanted)} questions are not answered yet (first: {left[:3]}); "
            f"finish the run first: qkvqa evaluate experiment={cfg.experiment} run_id={run_dir.name} "
            "resume=auto"
        )
    # one process scores (a DDP run's predictions are already merged); the trainer keys may change on resume
    cfg = OmegaConf.merge(
        cfg,
        {
            "resume": "auto",
            "run_id": run_dir.name,
            "paths": {"checkpoints_root": str(run_dir.parent)},
            "trainer": {"devices": 1, "num_nodes": 1, "strategy": "auto"},
        },
    )
    check_values(cfg)
    scores = run_evaluation(cfg)
    if scores:
        print(json.dumps(flat_metrics(scores), indent=2))
    return 0


def _write_per_question(path: Optional[str], rows: list[dict]) -> None:
    if path:
        from qkvqa.utils.io import atomic_write_text

        atomic_write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


def _emit(result: dict, table: str) -> None:
    print(json.dumps(result, indent=2, ensure_ascii=False))
    print(table, file=sys.stderr)


def _format(value) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def _coverage_line(coverage: dict) -> str:
    from qkvqa.metrics.coverage import describe

    return (
        f"coverage: {coverage['n_predictions']} predictions for {coverage['n_references']} questions; "
        f"{describe(coverage)}"
    )


def infoseek_table(result: dict) -> str:
    """A markdown table of an InfoSeek result."""
    lines = ["| split | score | time | numerical | string |", "|---|---|---|---|---|"]
    for name, key in (("unseen question", "unseen_question_score"), ("unseen entity", "unseen_entity_score")):
        split = result[key]
        lines.append(
            f"| {name} | {_format(split['score'])} | {_format(split['score_time'])} | "
            f"{_format(split['score_num'])} | {_format(split['score_string'])} |"
        )
    lines.append(f"| **overall (HM)** | {_format(result['final_score'])} | | | |")
    return "\n".join(lines + ["", _coverage_line(result["coverage"])])


def evqa_table(result: dict) -> str:
    """A markdown table of an E-VQA result."""
    lines = [f"E-VQA accuracy, {result['label']}", "", "| subset | n | correct | accuracy (%) |", "|---|---|---|---|"]
    rows = [(name, result[name]) for name in ("single_hop", "two_hop", "all")]
    rows += [(f"type {name}", summary) for name, summary in result["per_question_type"].items()]
    for name, summary in rows:
        lines.append(f"| {name} | {summary['n']} | {summary['correct']:.0f} | {_format(summary['accuracy'])} |")
    return "\n".join(lines + ["", _coverage_line(result["coverage"])])


def _score_infoseek(args: argparse.Namespace) -> int:
    from qkvqa.metrics.infoseek import evaluate_with_details

    result, details = evaluate_with_details(args.predictions, args.references, args.qtypes, strict=args.strict)
    _write_per_question(args.per_question, details)
    _emit(result, infoseek_table(result))
    return 0


def _build_judge(args: argparse.Namespace, vocab_texts: list[str]):
    from qkvqa.components.registry import ComponentSpec, build_component

    if args.em_only:
        return None
    options = {"batch_size": args.batch_size, "overflow": args.bem_overflow}
    if args.bem_tiny:
        return build_component(
            ComponentSpec(kind="bem", tiny=True, device=args.device, options={**options, "vocab_texts": vocab_texts})
        )
    return build_component(ComponentSpec(kind="bem", pretrained=args.bem, device=args.device, options=options))


def _score_evqa(args: argparse.Namespace) -> int:
    from qkvqa.data.questions import read_evqa_csv
    from qkvqa.metrics.evqa import evaluate_with_details

    questions = [
        {
            "data_id": q.data_id,
            "question": q.question,
            "answer": q.raw_answer,
            "question_type": q.question_type,
            "wikipedia_url_used_in_train": q.url_used_in_train,
        }
        for q in read_evqa_csv(args.questions, include_two_hop=not args.single_hop_only)
    ]
    judge = _build_judge(args, [q["question"] + " " + q["answer"] for q in questions])
    result, details = evaluate_with_details(args.predictions, questions, bem=judge, strict=args.strict)
    _write_per_question(args.per_question, details)
    _emit(result, evqa_table(result))
    return 0
