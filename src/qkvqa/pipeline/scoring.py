"""Score a merged prediction set with the metrics package: accuracy, Recall@K before/after the filter,
Table 3 error analysis, evidence-section recall, answer-in-context rate, second-article rate, context length and stage
times."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from qkvqa.data.questions import TWO_HOP_TYPE, Question
from qkvqa.metrics import analysis
from qkvqa.retrieval.results import Retrieved
from qkvqa.retrieval.retrieve import retrieval_metrics

STAGES = ("retrieve", "filter", "select", "generate")  # select: CDA or MLLM filtering
PER_QUESTION_KEY = "_per_question_correct"
PER_QUESTION_DETAILS = "_per_question_details"


def answer_in_context(question: Question, context_text: str) -> Optional[bool]:
    """Whether a reference answer appears in the context (after each benchmark's normalisation).

    None for InfoSeek numerical questions, whose answers are ranges rather than strings.
    """
    if question.reference is not None:
        from qkvqa.metrics.infoseek import normalize_answer

        aliases = question.reference.answer_eval
        if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
            return None
        norm = f" {normalize_answer(context_text)} "
        return any(f" {normalize_answer(a)} " in norm for a in aliases if normalize_answer(a))
    from qkvqa.metrics.evqa import preprocess_answer

    norm = f" {preprocess_answer(context_text)} "
    alternatives = [item for a in question.answers for item in a.split("&&")]
    return any(f" {preprocess_answer(a)} " in norm for a in alternatives if preprocess_answer(a))


def accuracy(dataset: str, rows: Sequence[dict], questions: dict[str, Question], judge: Any) -> tuple[dict, dict, dict]:
    """(benchmark result, {data_id: 0/1}, {data_id: the scorer's per-reference verdicts}) with the official scorer,
    strict coverage; skipped rows are wrong."""
    predictions = [{"data_id": r["data_id"], "prediction": r["prediction"], "skipped": r.get("skipped")} for r in rows]
    if dataset == "infoseek":
        from qkvqa.metrics import infoseek

        refs = [
            {
                "data_id": q,
                "answer_eval": questions[q].reference.answer_eval,
                "data_split": questions[q].reference.data_split,
            }
            for q in (r["data_id"] for r in rows)
        ]
        qtypes = [
            {"data_id": q, "question_type": questions[q].reference.question_type} for q in (r["data_id"] for r in rows)
        ]
        result, details = infoseek.evaluate_with_details(predictions, refs, qtypes, strict=True)
        return (
            result,
            {d["data_id"]: float(d["correct"]) for d in details},
            {d["data_id"]: d["references"] for d in details},
        )
    from qkvqa.metrics import evqa

    refs = [
        {
            "data_id": q.data_id,
            "question": q.question,
            "answer": q.raw_answer,
            "question_type": q.question_type,
            "wikipedia_url_used_in_train": q.url_used_in_train,
        }
        for q in (questions[r["data_id"]] for r in rows)
    ]
    result, details = evqa.evaluate_with_details(predictions, refs, bem=judge, strict=True)
    return result, {d["data_id"]: float(d["score"]) for d in details}, {d["data_id"]: d["references"] for d in details}


def is_analysed(question: Question) -> bool:
    """Whether Table 3 counts a question: it needs a gold article (single-hop E-VQA rows, InfoSeek questions with a
    gold URL; the official infoseek_val.jsonl has none, so R1 / R1-C / NR-C are n/a there, never 0)."""
    return question.question_type != TWO_HOP_TYPE and bool(question.gold_urls)


def gold_at_top1(row: dict, question: Question) -> bool:
    """Whether the filter ranked a gold article of `question` first in its prediction row."""
    return bool(row.get("ranking")) and row["ranking"][0]["url"] in question.gold_urls


def headline(dataset: str, result: dict) -> Optional[float]:
    """The paper's headline number: InfoSeek overall, E-VQA accuracy over all questions."""
    if dataset == "infoseek":
        return result.get("final_score")
    return (result.get("all") or {}).get("accuracy")


def score_run(
    dataset: str,
    rows: Sequence[dict],
    questions: Sequence[Question],
    retrieved: dict[str, Retrieved],
    judge: Any,
    top_k: int,
    two_hop_policy: str,
    exclude_skipped: bool = False,
    stop_after: str = "generation",
) -> dict:
    """Every metric of an evaluation run, as one JSON-ready dict.

    One denominator: every question of the split counts, and one that could not be answered (a row with
    `skipped`) is a wrong answer and a retrieval miss after the filter, listed under `skipped` with its
    reason, exactly as `qkvqa score` counts the same predictions.jsonl. `exclude_skipped` (diagnosis only)
    leaves those questions out instead. E-VQA Table 3 (R1 / R1-C / NR-C) and the recalls use single-hop rows
    (paper section 4.1); accuracy is reported for single-hop, two-hop and all, and the headline is all.
    With `stop_after="filter"` only the filter's figures exist (recall and section recall after it).
    """
    generated = stop_after != "filter"
    by_id = {q.data_id: q for q in questions}
    skipped = [{"data_id": r["data_id"], "reason": r["skipped"]} for r in rows if r.get("skipped")]
    counted = [r for r in rows if not (exclude_skipped and r.get("skipped"))]
    answered = [r for r in counted if not r.get("skipped")]
    scored_questions = [by_id[r["data_id"]] for r in counted]
    result, per_question, references = (
        accuracy(dataset, counted, by_id, judge) if counted and generated else ({}, {}, {})
    )
    after = {r["data_id"]: Retrieved(urls=[a["url"] for a in r.get("ranking") or []]) for r in counted}
    before = {q.data_id: retrieved.get(q.data_id, Retrieved()) for q in scored_questions}
    analysed = [r for r in counted if is_analysed(by_id[r["data_id"]])]
    gold_top1 = {r["data_id"]: gold_at_top1(r, by_id[r["data_id"]]) for r in analysed}
    in_context_of = {
        r["data_id"]: answer_in_context(by_id[r["data_id"]], r.get("context_text", "")) for r in counted if generated
    }
    in_context = [v for v in in_context_of.values() if v is not None]
    out: dict[str, Any] = {
        "dataset": dataset,
        "n_questions": len(rows),
        "n_scored": len(counted),
        "n_skipped": len(skipped),
        "exclude_skipped": exclude_skipped,
        "skipped": skipped,
        "stop_after": stop_after,
        "accuracy": headline(dataset, result) if result else None,
        "benchmark": result,
        "recall_before_filter": retrieval_metrics(
            before, scored_questions, dataset=dataset, top_k=top_k, two_hop_policy=two_hop_policy
        ),
        "recall_after_filter": retrieval_metrics(
            after, scored_questions, dataset=dataset, top_k=top_k, two_hop_policy=two_hop_policy
        ),
        "error_analysis": analysis.error_analysis(gold_top1, {q: per_question[q] for q in gold_top1})
        if analysed and generated
        else None,
        "answer_in_context": 100.0 * sum(in_context) / len(in_context) if in_context else None,
        "second_article_kept": second_article_kept(answered),
        "context_length": analysis.context_length_stats([r["context_tokens"] for r in answered if generated]),
        "seconds_per_question": {s: _mean([r["seconds"].get(s, 0.0) for r in answered]) for s in STAGES},
    }
    # {data_id: the official scorer's 0/1 (BEM's score)} for the per-question W&B table; not part of scores.json
    out[PER_QUESTION_KEY] = per_question
    # each question's pieces of the figures above, for its trace (qkvqa.pipeline.traces); not part of scores.json
    out[PER_QUESTION_DETAILS] = {
        r["data_id"]: {
            "score": per_question.get(r["data_id"]),
            "references": references.get(r["data_id"]),
            "gold_at_top1": gold_top1.get(r["data_id"]),
            "answer_in_context": in_context_of.get(r["data_id"]),
        }
        for r in rows
    }
    if dataset == "evqa":
        from qkvqa.metrics.retrieval import evidence_section_recall

        top1 = {r["data_id"]: tuple(r["top1_section"]) for r in counted if r.get("top1_section")}
        rows_for_recall = [
            {
                "data_id": q.data_id,
                "wikipedia_url": "|".join(q.gold_urls),
                "question_type": q.question_type,
                "evidence_section_id": q.evidence_section_id,
                "evidence_section_ids": q.evidence_section_ids or None,
            }
            for q in scored_questions
            if q.evidence_section_id is not None
        ]
        out["section_recall"] = evidence_section_recall(top1, rows_for_recall, two_hop_policy)
    return out


def second_article_kept(rows: Sequence[dict]) -> Optional[float]:
    """The share (percent) of the answered questions whose full-CDA context kept a second article (theta passed it:
    what `cda.theta_on` moves); None when no row has a full-CDA context."""
    full = [r["context"] for r in rows if (r.get("context") or {}).get("mode") == "full"]
    return 100.0 * sum(len(c.get("kept_articles", [])) > 1 for c in full) / len(full) if full else None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def flat_metrics(scores: dict) -> dict[str, float]:
    """The headline figures as flat `eval/...` keys for the run summary, W&B and `qkvqa compare`."""
    flat: dict[str, float] = {}

    def put(key: str, value: Any) -> None:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[key] = float(value)

    put("eval/accuracy", scores.get("accuracy"))
    seen_unseen = (scores.get("benchmark") or {}).get("seen_unseen") or {}
    for name in ("seen", "unseen"):
        put(f"eval/accuracy_{name}", (seen_unseen.get(name) or {}).get("accuracy"))
    put("eval/answer_in_context", scores.get("answer_in_context"))
    put("eval/second_article_kept", scores.get("second_article_kept"))
    put("eval/n_skipped", scores.get("n_skipped"))
    for when in ("before_filter", "after_filter"):
        for key, value in (scores.get(f"recall_{when}") or {}).items():
            if key.startswith("recall@"):
                put(f"eval/{key}_{when}", value)
    for key in ("r1", "r1_c", "nr_c", "nr_c_conditional"):
        put(f"eval/{key}", (scores.get("error_analysis") or {}).get(key))
    put("eval/section_r1", (scores.get("section_recall") or {}).get("evidence_section_recall@1"))
    put("eval/context_tokens_mean", scores["context_length"]["mean"])
    for stage, seconds in scores["seconds_per_question"].items():
        put(f"eval/seconds_{stage}", seconds)
    return flat
