"""The per-question trace of an evaluation (`traces.jsonl`, data-formats.md): stage records, completed after scoring."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from qkvqa.metrics.analysis import error_category
from qkvqa.metrics.retrieval import gold_rank
from qkvqa.retrieval.results import Retrieved
from qkvqa.utils.io import atomic_write

TRACE_VERSION = 1
TRACES = "traces.jsonl"
# The stage record a prediction row carries in its rank's part file, in the same line (so a kill never leaves a
# trace without its prediction or the reverse); `PredictionStore.merge` leaves it out of predictions.jsonl.
TRACE_KEY = "trace"
ARTICLES_KEEP = 20  # filtered articles kept, as the prediction row's ranking
SECTIONS_KEEP = 3  # best-scored sections kept per filtered article (`n_sections` counts them all) ...
SECTION_ARTICLES = 5  # ... for the first SECTION_ARTICLES filtered articles (CDA reads at most U of them)
CHUNKS_KEEP = 12  # chunks kept per question: every selected one, then the best-scored others (`n_chunks`)
CHUNK_TEXT_CHARS = 600  # text kept of each of them, selected or dropped (the trace's cap; `qkvqa inspect` shows it)
FLOAT_DIGITS = 6  # significant digits of the scores in a trace (predictions.jsonl keeps them whole)
STAGES = ("retrieve", "filter", "select", "generate")


def _f(value: Any) -> Optional[float]:
    """A score rounded to FLOAT_DIGITS significant digits (monotone: an order stays an order); None stays None."""
    return None if value is None else float(f"{float(value):.{FLOAT_DIGITS}g}")


def stage_record(
    ranking: Any, filter_name: str, article_filter: Any, context: Any = None, selector: Any = None
) -> dict:
    """What the filter and CDA did for one question, as the trace's `filter` and `cda` (before scoring); `filter_name`
    is the run's `eval.filter` (a registered name or a plugin's import path), as the card and the report name it."""
    articles = []
    for position, ranked in enumerate(ranking.articles[:ARTICLES_KEEP]):
        titles = list(getattr(ranked.article, "section_titles", []) or [])
        scored = sorted(ranked.section_scores.items(), key=lambda item: (-float(item[1]), item[0]))
        articles.append(
            {
                "url": ranked.article.url,
                "title": ranked.article.title,
                "sim_ret": _f(ranked.sim_ret),
                "qff": _f(ranked.qff),
                "fused": _f(ranked.score),
                "sections": [
                    {"index": int(i), "title": titles[i] if 0 <= i < len(titles) else None, "score": _f(score)}
                    for i, score in scored[: SECTIONS_KEEP if position < SECTION_ARTICLES else 0]
                ],
                "n_sections": len(scored),
            }
        )
    alpha = getattr(article_filter, "alpha", None)
    record = {
        "filter": {"name": filter_name, "alpha": None if alpha is None else float(alpha), "articles": articles},
        "cda": None,
    }
    if context is not None:
        record["cda"] = cda_record(context, [r.article.url for r in ranking.articles], getattr(selector, "cfg", None))
    return record


def cda_record(context: Any, ranked_urls: Sequence[str], cfg: Any = None) -> dict:
    """The trace's `cda`: mode, U and theta, the kept articles, and the chunks CDA scored in article then document
    order: every selected one, then the best-scored others up to CHUNKS_KEEP (`n_chunks`: all), each with its text up
    to CHUNK_TEXT_CHARS (a dropped chunk's text says what CDA left out)."""
    key = lambda c: (c.url, c.section_index, c.chunk_index)  # noqa: E731
    selected = {key(c) for c in context.chunks}
    candidates = list(context.candidates) or list(context.chunks)
    others = sorted(
        (j for j, c in enumerate(candidates) if key(c) not in selected),
        key=lambda j: (-(candidates[j].score if candidates[j].score is not None else float("-inf")), j),
    )
    keep = {j for j, c in enumerate(candidates) if key(c) in selected}
    keep |= set(others[: max(CHUNKS_KEEP - len(keep), 0)])
    return {
        "mode": context.mode,
        "U": getattr(cfg, "U", None),
        "theta": getattr(cfg, "theta", None),
        "kept": [ranked_urls[i] for i in context.kept_articles if 0 <= i < len(ranked_urls)],
        "chunks": [
            {
                "url": c.url,
                "section_index": c.section_index,
                "chunk_index": c.chunk_index,
                "tokens": c.token_count,
                "score": _f(c.score),
                "selected": key(c) in selected,
                "text": _capped(c.text),
            }
            for j, c in enumerate(candidates)
            if j in keep
        ],
        "n_chunks": len(candidates),
    }


def _capped(text: Optional[str]) -> Optional[str]:
    if text is None or len(text) <= CHUNK_TEXT_CHARS:
        return text
    return text[:CHUNK_TEXT_CHARS] + "…"


def _record_from_row(row: dict, filter_name: str, alpha: Optional[float]) -> dict:
    """The stage record of a row that carries none (a skipped question, a part written before traces existed):
    what its prediction row holds."""
    articles = [
        {
            "url": a["url"],
            "title": None,
            "sim_ret": None,
            "qff": None,
            "fused": _f(a["score"]),
            "sections": [],
            "n_sections": 0,
        }
        for a in (row.get("ranking") or [])
    ]
    context = row.get("context")
    cda = None
    if context is not None:
        urls = [a["url"] for a in row.get("ranking") or []]
        cda = {
            "mode": context.get("mode"),
            "U": None,
            "theta": None,
            "kept": [urls[i] for i in context.get("kept_articles", []) if 0 <= i < len(urls)],
            "chunks": [
                {
                    "url": c["url"],
                    "section_index": c["section_index"],
                    "chunk_index": c["chunk_index"],
                    "tokens": c["token_count"],
                    "score": _f(c["score"]),
                    "selected": True,
                    "text": None,
                }
                for c in context.get("chunks", [])
            ],
            "n_chunks": len(context.get("chunks", [])),
        }
    return {"filter": {"name": filter_name, "alpha": alpha, "articles": articles}, "cda": cda}


def gold_answers(question: Any) -> list[str]:
    """The reference answers as the scorer reads them: E-VQA's `answer` alternatives, InfoSeek's accepted answers."""
    if question.reference is None:
        return list(question.answers)
    from qkvqa.metrics.infoseek import accepted_answers

    return accepted_answers(question.reference.answer_eval, question.reference.question_type)


def build_traces(
    rows: Sequence[dict],
    questions: Sequence[Any],
    retrieved: Mapping[str, Retrieved],
    details: Mapping[str, dict],
    *,
    dataset: str,
    split: str,
    top_k: int,
    filter_name: str,
    alpha: Optional[float],
    image_path: Callable[[Any], Optional[str]],
) -> list[dict]:
    """One complete trace per merged prediction row, in its order: the stage records joined with the question, its
    stage-1 results, and the per-question figures of `score_run` (`details`, its PER_QUESTION_DETAILS)."""
    by_id = {q.data_id: q for q in questions}
    return [
        _trace(
            row,
            by_id[row["data_id"]],
            retrieved.get(row["data_id"], Retrieved()),
            details.get(row["data_id"], {}),
            dataset,
            split,
            top_k,
            filter_name,
            alpha,
            image_path,
        )
        for row in rows
    ]


def _trace(
    row: dict,
    q: Any,
    before: Retrieved,
    detail: dict,
    dataset: str,
    split: str,
    top_k: int,
    filter_name: str,
    alpha: Optional[float],
    image_path: Callable[[Any], Optional[str]],
) -> dict:
    record = row.get(TRACE_KEY) or _record_from_row(row, filter_name, alpha)
    titles = {a["url"]: a["title"] for a in record["filter"]["articles"] if a["title"] is not None}
    stage1 = []
    for k, url in enumerate(before.urls[:top_k]):
        title = before.titles[k] if k < len(before.titles) and before.titles[k] is not None else titles.get(url)
        stage1.append(
            {"url": url, "title": title, "sim": _f(before.similarities[k]) if k < len(before.similarities) else None}
        )
    stage1_rank = {}
    for rank, entry in enumerate(stage1, 1):
        stage1_rank.setdefault(entry["url"], rank)
    sims = {entry["url"]: entry["sim"] for entry in stage1}
    articles = [
        {
            "url": a["url"],
            "title": a["title"],
            "stage1_rank": stage1_rank.get(a["url"]),
            "sim_ret": a["sim_ret"] if a["sim_ret"] is not None else sims.get(a["url"]),
            "qff": a["qff"],
            "fused": a["fused"],
            "sections": a["sections"],
            "n_sections": a["n_sections"],
        }
        for a in record["filter"]["articles"]
    ]
    before_rank = gold_rank(stage1, q.gold_urls) or None
    after_rank = gold_rank(row.get("ranking") or [], q.gold_urls) or None
    score, references = detail.get("score"), detail.get("references")
    verdict = (
        None
        if score is None
        else {
            "correct": bool(score),
            "score": float(score),
            "references": [{**r, "bem": _f(r["bem"])} for r in references or []],
        }
    )
    top1 = detail.get("gold_at_top1")
    reference = q.reference
    return {
        "trace_version": TRACE_VERSION,
        "data_id": q.data_id,
        "question": q.question,
        "dataset": dataset,
        "split": q.split or split,
        "question_type": reference.question_type if reference is not None else q.question_type,
        "image": image_path(q),
        "gold": {
            "answers": gold_answers(q),
            "urls": list(q.gold_urls),
            "section_index": q.evidence_section_id,
            "hops": q.hops,
            "url_used_in_train": q.url_used_in_train,
        },
        "stage1": stage1,
        "filter": {**record["filter"], "articles": articles},
        "cda": record["cda"],
        "context": row.get("context_text"),
        "prediction": row.get("prediction"),
        "skipped": row.get("skipped"),
        "verdict": verdict,
        "gold_rank": {"before": before_rank, "after": after_rank},
        "answer_in_context": detail.get("answer_in_context"),
        "category": error_category(top1, score, before_rank is not None)
        if top1 is not None and score is not None
        else None,
        "seconds": {stage: float((row.get("seconds") or {}).get(stage, 0.0)) for stage in STAGES},
    }


def write_traces(run_dir: str | Path, traces: Sequence[dict]) -> Path:
    """`<run_dir>/traces.jsonl`, one compact JSON line per trace, written atomically."""
    path = Path(run_dir) / TRACES

    def write(f) -> None:
        for trace in traces:
            f.write((json.dumps(trace, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))

    atomic_write(path, write)
    return path
