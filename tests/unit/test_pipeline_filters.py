"""The precomputed filter refuses reranked files whose section scores cannot be matched to sections."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkvqa.data.kb import KBStore
from qkvqa.errors import DataError
from qkvqa.pipeline.filters import PrecomputedFilter
from qkvqa.retrieval.results import Retrieved


def test_section_scores_must_match_the_sections_they_score(world, tmp_path):
    store = KBStore.open(Path(world["dir"]) / "kb/store")
    article = next(iter(store))
    candidates = [c.index for c in article.candidate_sections()]
    entry = {
        "retrieved_entities": [{"url": article.url}],
        "retrieval_similarities": [0.9],
        "sec_sim": [[0.1] * len(candidates)],
    }
    path = tmp_path / "reranked.json"
    path.write_text(json.dumps({"q": entry}))
    ranking = PrecomputedFilter(path, store).rank("q", "?", None, Retrieved())
    assert sorted(ranking.articles[0].section_scores) == candidates
    entry["sec_sim"] = [[0.1] * (len(candidates) + 1)]  # e.g. scored with an empty section included
    path.write_text(json.dumps({"q": entry}))
    with pytest.raises(DataError, match="sec_sim scores"):
        PrecomputedFilter(path, store).rank("q", "?", None, Retrieved())
    with pytest.raises(DataError, match="no such reranked-results file"):
        PrecomputedFilter(tmp_path / "missing.json", store)
