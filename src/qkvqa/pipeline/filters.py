"""Article filters: turn a question's retrieved articles into `RankedArticle`s for CDA.

`RetrievalOrderFilter` keeps stage-1 order (the "retrieval only" baseline); `QFFFilter` scores every
candidate section with the question-focused Q-Former and fuses (method.md section 2);
`PrecomputedFilter` reads reranked results written by `qkvqa rerank` (OMGM step-2b layout).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

from qkvqa.cda.select import RankedArticle
from qkvqa.data.kb import Article, KBStore
from qkvqa.errors import DataError
from qkvqa.retrieval.results import Retrieved


@dataclass
class Ranking:
    """A question's articles after filtering, best first, with the per-section scores CDA may use."""

    articles: list[RankedArticle]
    missing_urls: list[str] = field(default_factory=list)     # retrieved URLs absent from the KB

    @property
    def urls(self) -> list[str]:
        """Article URLs in ranked order."""
        return [r.article.url for r in self.articles]


class ArticleFilter(Protocol):
    """What the pipeline needs of a filter."""

    name: str
    alpha: Optional[float]          # the fusion weight of the QFF (None without QFF, or unknown)

    def rank(self, data_id: str, question: str, image: Any, retrieved: Retrieved) -> Ranking: ...


def rank_many(article_filter: ArticleFilter, items: list[tuple[str, str, Any, Retrieved]]) -> list[Ranking]:
    """The rankings of several (data_id, question, image, Retrieved): in one call when the filter batches across
    questions (`rank_many`), else question by question."""
    batched = getattr(article_filter, "rank_many", None)
    if batched is not None:
        return batched(items)
    return [article_filter.rank(*item) for item in items]


def _articles(store: KBStore, retrieved: Retrieved) -> tuple[list[Article], list[float], list[str]]:
    articles, sims, missing = [], [], []
    for url, sim in zip(retrieved.urls, retrieved.similarities):
        if url in store:
            articles.append(store.get_by_url(url))
            sims.append(float(sim))
        else:
            missing.append(url)
    return articles, sims, missing


class RetrievalOrderFilter:
    """No filtering: articles in retrieval order, the retrieval similarity as their score."""

    name = "retrieval"
    alpha = None

    def __init__(self, store: KBStore):
        self.store = store

    def rank(self, data_id: str, question: str, image: Any, retrieved: Retrieved) -> Ranking:
        articles, sims, missing = _articles(self.store, retrieved)
        return Ranking([RankedArticle(a, s, sim_ret=s) for a, s in zip(articles, sims)], missing)


class QFFFilter:
    """Scores every candidate section of the retrieved articles with the QFF and fuses with alpha
    (`qkvqa.qff.rerank.QFFReranker`, the same code as `qkvqa rerank`)."""

    name = "qff"

    def __init__(self, reranker: Any):
        self.reranker = reranker
        self.store = reranker.store
        self.alpha = float(reranker.alpha)

    def rank(self, data_id: str, question: str, image: Any, retrieved: Retrieved) -> Ranking:
        return self.rank_many([(data_id, question, image, retrieved)])[0]

    def rank_many(self, items: list[tuple[str, str, Any, Retrieved]]) -> list[Ranking]:
        """The rankings of several questions, their sections scored in shared forwards (`rerank_many`)."""
        rankings = []
        for result in self.reranker.rerank_many([(question, image, retrieved) for _, question, image, retrieved in items]):
            ranked, missing = [], []
            for url, fused, scores, indices, sim, qff in zip(result.urls, result.fused_scores, result.section_scores,
                                                             result.section_indices, result.stage1_similarities,
                                                             result.qff_scores):
                if url not in self.store:
                    missing.append(url)
                    continue
                ranked.append(RankedArticle(self.store.get_by_url(url), fused, dict(zip(indices, scores)),
                                            sim_ret=float(sim), qff=float(qff)))
            rankings.append(Ranking(ranked, missing))
        return rankings


class PrecomputedFilter:
    """Reads reranked results (OMGM step-2b layout with `sec_sim` and, when present, `sec_idx`) and, from the
    sidecar `qkvqa rerank` writes beside them, what produced them (`produced_by`; None for a file of unknown origin)."""

    name = "precomputed"

    def __init__(self, path: str | Path, store: KBStore):
        from qkvqa.qff.rerank import read_reranked_provenance

        self.path = Path(path)
        self.store = store
        if not self.path.is_file():
            raise DataError(f"{self.path}: no such reranked-results file (eval.reranked_results; write it with "
                            "`qkvqa rerank`)")
        data = self.path.read_bytes()
        try:
            self.results = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{self.path}: not a reranked-results JSON file ({e})") from None
        self.produced_by: Optional[dict] = read_reranked_provenance(self.path, data)
        alpha = (self.produced_by or {}).get("qff.alpha")
        self.alpha = float(alpha) if alpha is not None else None

    def rank(self, data_id: str, question: str, image: Any, retrieved: Retrieved) -> Ranking:
        entry = self.results.get(data_id)
        if entry is None:
            raise DataError(f"{self.path}: no reranked results for data_id {data_id}")
        entities = entry.get("retrieved_entities", [])
        scores = entry.get("retrieval_similarities", [])
        sec_sim = entry.get("sec_sim", [[] for _ in entities])
        sec_idx = entry.get("sec_idx")
        sims, qffs = entry.get("stage1_similarities"), entry.get("qff_scores")     # `qkvqa rerank`'s extras
        ranked, missing = [], []
        for k, (entity, score) in enumerate(zip(entities, scores)):
            url = entity["url"] if isinstance(entity, dict) else entity
            if url not in self.store:
                missing.append(url)
                continue
            article = self.store.get_by_url(url)
            indices = sec_idx[k] if sec_idx else [i for i, _, _ in article.candidate_sections()]
            if len(indices) != len(sec_sim[k]):      # zip would pair scores with the wrong sections in silence
                raise DataError(f"{self.path}: data_id {data_id}, article {url}: {len(sec_sim[k])} sec_sim scores "
                                f"for {len(indices)} {'sec_idx entries' if sec_idx else 'candidate sections'}; "
                                "write the file with `qkvqa rerank` (it records sec_idx)")
            ranked.append(RankedArticle(article, float(score), dict(zip(indices, sec_sim[k])),
                                        sim_ret=_at(sims, k), qff=_at(qffs, k)))
        return Ranking(ranked, missing)


def top1_section(ranking: Ranking) -> Optional[tuple[str, int]]:
    """(url, original section index) of the best-scored section of the top-1 article, if it has scores."""
    if not ranking.articles or not ranking.articles[0].section_scores:
        return None
    top = ranking.articles[0]
    index = max(top.section_scores.items(), key=lambda kv: (kv[1], -kv[0]))[0]
    return top.article.url, int(index)



def _at(values: Optional[list], k: int) -> Optional[float]:
    """values[k] as a float, None when the file has no such list or entry."""
    return float(values[k]) if isinstance(values, list) and k < len(values) and values[k] is not None else None
