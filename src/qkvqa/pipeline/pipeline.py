"""The per-question pipeline: retrieved articles -> filter -> CDA context -> generated answer, timed per stage."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from qkvqa.cda.select import ContextSelector
from qkvqa.generation.prompts import GenerationRequest
from qkvqa.pipeline.filters import ArticleFilter, rank_many, top1_section
from qkvqa.pipeline.traces import ARTICLES_KEEP, TRACE_KEY, stage_record
from qkvqa.retrieval.results import Retrieved

RANKING_KEEP = ARTICLES_KEEP  # articles of the filtered ranking kept in each prediction row (and its trace)


@dataclass
class QuestionInput:
    """One question as the pipeline sees it."""

    data_id: str
    question: str
    image: Any  # PIL image (or None for text-only generators)
    dataset: str  # evqa | infoseek
    retrieved: Retrieved


class KBVQAPipeline:
    """Chains the stages through their interfaces; holds no model math of its own.

    `selector.select(question, ranked_articles, image=...)` builds the context: CDA's
    `ContextSelector`, or the MLLM-filtering baseline's `MLLMFilterSelector`.
    """

    def __init__(
        self,
        filter_name: str,
        article_filter: ArticleFilter,
        selector: Optional[ContextSelector],
        generator: Any,
        retrieval_seconds: float = 0.0,
    ):
        self.filter_name = filter_name  # eval.filter: what the traces name the filter, as the card does
        self.filter = article_filter
        self.selector = selector  # None with the generator: stop after the filter
        self.generator = generator
        self.retrieval_seconds = retrieval_seconds  # stage-1 time per question (run once per split)

    def answer(self, questions: Sequence[QuestionInput]) -> list[dict]:
        """Prediction rows for a batch, each stage over the whole batch: the filter (a QFF filter scores every
        question's sections in shared forwards), CDA (one reranker call over every question's chunks), then one
        batched generation call. Filter-only rows (no selector and generator) keep the ranking and no prediction.
        A stage's seconds per question are its batch time divided by the batch size. Each row carries its trace's
        stage record under TRACE_KEY (`PredictionStore.merge` keeps it out of predictions.jsonl)."""
        n = max(len(questions), 1)
        t0 = time.perf_counter()
        rankings = rank_many(self.filter, [(q.data_id, q.question, q.image, q.retrieved) for q in questions])
        filter_seconds = (time.perf_counter() - t0) / n
        rows = []
        for q, ranking in zip(questions, rankings):
            top1 = top1_section(ranking)
            rows.append(
                {
                    "data_id": q.data_id,
                    "prediction": None,
                    "ranking": [
                        {"url": r.article.url, "score": float(r.score)} for r in ranking.articles[:RANKING_KEEP]
                    ],
                    "top1_section": list(top1) if top1 else None,
                    "missing_urls": ranking.missing_urls,
                    "seconds": {"retrieve": self.retrieval_seconds, "filter": filter_seconds},
                }
            )
        if self.selector is None:
            for row, ranking in zip(rows, rankings):
                row["stopped_after"] = "filter"
                row[TRACE_KEY] = stage_record(ranking, self.filter_name, self.filter)
            return rows
        t1 = time.perf_counter()
        contexts = select_many(self.selector, [(q.question, r.articles, q.image) for q, r in zip(questions, rankings)])
        select_seconds = (time.perf_counter() - t1) / n
        requests = []
        for q, row, context, ranking in zip(questions, rows, contexts, rankings):
            row.update(context=context.metadata(), context_tokens=context.token_count, context_text=context.text)
            row[TRACE_KEY] = stage_record(ranking, self.filter_name, self.filter, context, self.selector)
            row["seconds"]["select"] = select_seconds
            requests.append(
                GenerationRequest(question=q.question, context=context.text, image=q.image, dataset=q.dataset)
            )
        t3 = time.perf_counter()
        answers = self.generator.generate(requests) if requests else []
        per_question = (time.perf_counter() - t3) / max(len(requests), 1)
        for row, answer in zip(rows, answers):
            row["prediction"] = answer
            row["seconds"]["generate"] = per_question
        return rows


def select_many(selector: Any, items: Sequence[tuple[str, Any, Any]]) -> list:
    """The contexts of several (question, ranked articles, image): in one call when the selector batches across
    questions (CDA's `select_many`), else question by question (the MLLM-filtering baseline)."""
    batched = getattr(selector, "select_many", None)
    if batched is not None:
        return batched([(question, articles) for question, articles, _ in items])
    return [selector.select(question, articles, image=image) for question, articles, image in items]
