"""Component kinds of a user's own code, named in tests by import path (`tests.helpers.plugin_kinds:Name`)."""

from __future__ import annotations

from dataclasses import replace

from qkvqa.cda.reranker import ChunkScorerKind, Reranker
from qkvqa.components.plugins import Option
from qkvqa.generation.backends import GeneratorKind
from qkvqa.metrics.judge import JudgeKind
from qkvqa.pipeline.filters import FilterKind, Ranking, RetrievalOrderFilter


class NoChatGenerator(GeneratorKind):
    """A generator kind that does not say how to read its checkpoint: never loaded as another kind."""


class WordOverlapScorer(Reranker):
    """Scores a (query, passage) pair by the share of the query's words found in the passage."""

    def __init__(self, weight: float, **defaults):
        super().__init__(**defaults)
        self.weight = weight

    def _score(self, pairs, batch_size, max_length, query_max_length, normalize):
        out = []
        for query, passage in pairs:
            words = set(query.lower().split())
            out.append(self.weight * len(words & set(passage.lower().split())) / max(1, len(words)))
        return out


class WordOverlapKind(ChunkScorerKind):
    """A chunk scorer with no weights: `tiny: true` is all its spec needs."""

    options = {"weight": Option(float, 1.0, low=0.0, high=10.0, doc="the score of a full overlap")}

    def build(self, spec):
        return WordOverlapScorer(float(spec.options.get("weight", 1.0)))


class SharedWordJudge:
    """P(equivalent) = the share of the reference's words the candidate holds (a judge without weights)."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.label = f"shared words >= {threshold}"

    def score_batch(self, triples):
        out = []
        for _question, reference, candidate in triples:
            words = set(reference.lower().split())
            share = len(words & set(candidate.lower().split())) / max(1, len(words))
            out.append(1.0 if share >= self.threshold else 0.0)
        return out

    def equivalent(self, question, reference, candidate):
        return self.score_batch([(question, reference, candidate)])[0]


class SharedWordJudgeKind(JudgeKind):
    """The judge extension point's smallest user: `tiny: true`, one bounded option."""

    options = {"threshold": Option(float, 0.5, low=0.0, high=1.0, doc="share of the reference's words")}

    def build(self, spec):
        return SharedWordJudge(float(spec.options.get("threshold", 0.5)))


class NotAKind:
    """A class that extends nothing."""


class ReversedOrder(RetrievalOrderFilter):
    """Stage 1's articles, worst first (the negated similarity as their score): a deliberately bad filter."""

    def rank(self, data_id, question, image, retrieved):
        ranking = super().rank(data_id, question, image, retrieved)
        return Ranking([replace(a, score=-a.score) for a in reversed(ranking.articles)], ranking.missing_urls)


class ReversedKind(FilterKind):
    """A filter kind by import path (`eval.filter: tests.helpers.plugin_kinds:ReversedKind`)."""

    def build(self, cfg, benchmark):
        return ReversedOrder(benchmark.kb_store())

    def card(self, cfg, produced_by=None):
        return {"kind": self.name, "order": "stage 1 reversed"}
