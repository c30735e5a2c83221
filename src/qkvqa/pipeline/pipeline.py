"""The per-question pipeline: retrieved articles -> filter -> CDA context -> generated answer, timed per stage."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from qkvqa.cda.select import ContextSelector
from qkvqa.generation.prompts import GenerationRequest
from qkvqa.pipeline.filters import ArticleFilter, top1_section
from qkvqa.retrieval.results import Retrieved

RANKING_KEEP = 20          # articles of the filtered ranking kept in each prediction row


@dataclass
class QuestionInput:
    """One question as the pipeline sees it."""

    data_id: str
    question: str
    image: Any                      # PIL image (or None for text-only generators)
    dataset: str                    # evqa | infoseek
    retrieved: Retrieved


class KBVQAPipeline:
    """Chains the stages through their interfaces; holds no model math of its own.

    `selector.select(question, ranked_articles, image=...)` builds the context: CDA's
    `ContextSelector`, or the MLLM-filtering baseline's `MLLMFilterSelector`.
    """

    def __init__(self, article_filter: ArticleFilter, selector: Optional[ContextSelector], generator: Any,
                 retrieval_seconds: float = 0.0):
        self.filter = article_filter
        self.selector = selector                         # None with the generator: stop after the filter
        self.generator = generator
        self.retrieval_seconds = retrieval_seconds       # stage-1 time per question (run once per split)

    def answer(self, questions: Sequence[QuestionInput]) -> list[dict]:
        """Prediction rows for a batch: filter and CDA per question, then one batched generation call
        (filter-only rows, without selector and generator, keep the ranking and no prediction)."""
        rows, requests = [], []
        for q in questions:
            t0 = time.perf_counter()
            ranking = self.filter.rank(q.data_id, q.question, q.image, q.retrieved)
            t1 = time.perf_counter()
            top1 = top1_section(ranking)
            row = {
                "data_id": q.data_id,
                "prediction": None,
                "ranking": [{"url": r.article.url, "score": float(r.score)} for r in ranking.articles[:RANKING_KEEP]],
                "top1_section": list(top1) if top1 else None,
                "missing_urls": ranking.missing_urls,
                "seconds": {"retrieve": self.retrieval_seconds, "filter": t1 - t0},
            }
            rows.append(row)
            if self.selector is None:
                row["stopped_after"] = "filter"
                continue
            context = self.selector.select(q.question, ranking.articles, image=q.image)
            row.update(context=context.metadata(), context_tokens=context.token_count, context_text=context.text)
            row["seconds"]["select"] = time.perf_counter() - t1
            requests.append(GenerationRequest(question=q.question, context=context.text, image=q.image,
                                              dataset=q.dataset))
        t3 = time.perf_counter()
        answers = self.generator.generate(requests) if requests else []
        per_question = (time.perf_counter() - t3) / max(len(requests), 1)
        for row, answer in zip([r for r in rows if "context" in r], answers):
            row["prediction"] = answer
            row["seconds"]["generate"] = per_question
        return rows


