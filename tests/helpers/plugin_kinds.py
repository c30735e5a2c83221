"""Component kinds of a user's own code, named in tests by import path (`tests.helpers.plugin_kinds:Name`)."""

from __future__ import annotations

from qkvqa.cda.reranker import ChunkScorerKind, Reranker
from qkvqa.components.plugins import Option
from qkvqa.generation.backends import GeneratorKind


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


class NotAKind:
    """A class that extends nothing."""
