"""`report.md` of an evaluation run: the paper's tables that one run can fill (Tables 2-5)."""

from __future__ import annotations

from typing import Any, Optional

from qkvqa.pipeline.scoring import STAGES
from qkvqa.utils.markdown import md_text


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return md_text(value)  # data text (a question, a subset name) is shown, never rendered as HTML (issue 44)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _filter_value(cfg: Any, scores: dict, key: str) -> Any:
    """The QFF focus or alpha that produced the ranking: the filter of the protocol card (for precomputed results,
    what their file records; "unknown" when it records nothing), "-" when no QFF ranked the articles."""
    from qkvqa.pipeline.protocol import filter_card

    card = (scores.get("protocol") or {}).get("filter") or filter_card(cfg)
    if key not in card:  # a kind with no QFF in its ranking (its card has no focus or alpha)
        return "-"
    value = card.get(key)
    return "unknown" if value is None else value


def render_report(run_id: str, cfg: Any, scores: dict, judge_label: Optional[str], notes: list[str]) -> str:
    """Markdown for one run; `notes` are caveats to print first (tiny or random components, skips)."""
    dataset = scores["dataset"]
    parts = [
        f"# Evaluation report: {md_text(run_id)}",
        "",
        f"experiment `{md_text(cfg.experiment)}`, dataset **{dataset}**, split `{md_text(cfg.eval.split)}`, "
        f"{scores['n_scored']} questions scored, {scores['n_skipped']} of them could not be answered"
        f"{' (left out)' if scores.get('exclude_skipped') else ' (counted wrong)'}.",
        "",
    ]
    if scores.get("protocol"):
        from qkvqa.pipeline.protocol import render_card

        parts += [render_card(scores["protocol"])]
    parts += [f"> {md_text(note, in_table=False)}" for note in notes] + ([""] if notes else [])
    seconds = scores["seconds_per_question"]
    ctx = scores["context_length"]
    parts += [
        "## Table 2: accuracy, context length and time per stage",
        "",
        _table(
            ["filter", "context", "accuracy", "context tokens (mean / median / p95)"] + [f"s/q {s}" for s in STAGES],
            [
                [
                    cfg.eval.filter,
                    cfg.cda.mode if cfg.eval.context == "cda" else cfg.eval.context,
                    scores["accuracy"],
                    f"{_fmt(ctx['mean'], 1)} / {_fmt(ctx['median'], 1)} / {_fmt(ctx['p95'], 1)}",
                ]
                + [_fmt(seconds[s], 4) for s in STAGES]
            ],
        ),
        "",
    ]
    if judge_label:
        parts += [f"Answers judged by: {judge_label}.", ""]
    ea = scores.get("error_analysis") or {}
    parts += [
        "## Table 3: error analysis",
        "",
        _table(
            ["R1", "R1-C", "NR-C", "NR-C (conditional)"],
            [[ea.get("r1"), ea.get("r1_c"), ea.get("nr_c"), ea.get("nr_c_conditional")]],
        ),
        "",
        f"Over {ea.get('n', 'n/a')} questions{' (single-hop rows, as the paper)' if dataset == 'evqa' else ''}. "
        "R1: gold article ranked first after the filter; R1-C: accuracy among those; NR-C: share of all "
        "questions answered correctly without the gold article first (the paper's wording).",
        "",
    ]
    before, after = scores["recall_before_filter"], scores["recall_after_filter"]
    ks = [k for k in before if k.startswith("recall@")]
    parts += [
        "## Table 4: Recall@K before and after the filter",
        "",
        f"Over {before.get('n_queries', 'n/a')} questions"
        + (
            f" ({before.get('n_excluded_two_hop', 0)} two-hop rows left out, two_hop_policy "
            f"{before.get('two_hop_policy')})"
            if dataset == "evqa"
            else ""
        )
        + ".",
        "",
        _table(
            ["ranking"] + ks,
            [["retrieval"] + [before[k] for k in ks], [f"after {cfg.eval.filter}"] + [after.get(k) for k in ks]],
        ),
        "",
    ]
    section = (scores.get("section_recall") or {}).get("evidence_section_recall@1")
    parts += [
        "## Table 5: this run's ablation row",
        "",
        _table(
            [
                "QFF focus",
                "alpha",
                "CDA mode",
                "U",
                "theta",
                "L",
                "K1",
                "K2",
                "accuracy",
                "section R@1",
                "answer in context %",
            ],
            [
                [
                    _filter_value(cfg, scores, "focus"),
                    _filter_value(cfg, scores, "alpha"),
                    cfg.cda.mode,
                    cfg.cda.U,
                    cfg.cda.theta,
                    cfg.cda.chunk_tokens,
                    cfg.cda.K1,
                    cfg.cda.K2,
                    scores["accuracy"],
                    section,
                    scores.get("answer_in_context"),
                ]
            ],
        ),
        "",
        "Compare several runs' rows with `qkvqa compare <run dirs>`.",
        "",
    ]
    if dataset == "infoseek" and scores.get("benchmark"):
        b = scores["benchmark"]
        parts += [
            "## InfoSeek splits",
            "",
            _table(
                ["split", "score", "time", "numerical", "string"],
                [
                    [name, b[key]["score"], b[key]["score_time"], b[key]["score_num"], b[key]["score_string"]]
                    for name, key in (
                        ("unseen question", "unseen_question_score"),
                        ("unseen entity", "unseen_entity_score"),
                    )
                ],
            ),
            "",
        ]
    if dataset == "evqa" and scores.get("benchmark"):
        b = scores["benchmark"]
        seen_unseen = b.get("seen_unseen") or {}
        rows = [
            [k, (b.get(k) or {}).get("n"), (b.get(k) or {}).get("accuracy")] for k in ("single_hop", "two_hop", "all")
        ]
        rows += [
            [
                f"all, gold article {name} in training",
                (seen_unseen.get(key) or {}).get("n"),
                (seen_unseen.get(key) or {}).get("accuracy"),
            ]
            for key, name in (("seen", "seen"), ("unseen", "unseen"))
        ]
        unknown = seen_unseen.get("n_unknown")
        parts += [
            "## E-VQA single-hop / two-hop / all, seen / unseen",
            "",
            "The headline accuracy is `all` (paper section 4.1: complete results including two-hop). Seen / "
            "unseen split `all` by the question file's `wikipedia_url_used_in_train` (whether the gold article "
            "is also a training question's)"
            + (f"; {unknown} questions have no value there and are in neither row" if unknown else "")
            + ".",
            "",
            _table(["subset", "n", "accuracy"], rows),
            "",
        ]
    return "\n".join(parts)
