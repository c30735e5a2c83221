"""A trace's stage record: the filter's articles with their best sections, CDA's scored chunks (text for selected)."""

from __future__ import annotations

from types import SimpleNamespace

from qkvqa.cda.select import ContextSelector, RankedArticle
from qkvqa.pipeline import traces
from qkvqa.pipeline.filters import Ranking
from tests.unit.test_cda_select import (  # noqa: F401
    EGRET,
    HERON,
    QUESTION,
    KeywordScorer,
    cfg,
    make_article,
    splitter,
    words,
)


def test_the_stage_record_keeps_every_selected_chunk_with_its_text_and_the_best_others_by_id(splitter, monkeypatch):
    ranked = [
        RankedArticle(HERON, 0.90, {0: 0.2, 2: 0.99}, sim_ret=0.5, qff=0.99),
        RankedArticle(EGRET, 0.895, {0: 0.9}, sim_ret=0.7, qff=0.12345678),
    ]
    selector = ContextSelector(cfg(), splitter, words, KeywordScorer())
    context = selector.select(QUESTION, ranked)
    filter_ = SimpleNamespace(alpha=0.9)
    record = traces.stage_record(Ranking(ranked), "qff", filter_, context, selector)
    heron, egret = record["filter"]["articles"]
    assert record["filter"]["name"] == "qff" and record["filter"]["alpha"] == 0.9
    assert (heron["sim_ret"], heron["qff"], heron["fused"], egret["qff"]) == (0.5, 0.99, 0.9, 0.123457)  # 6 digits
    assert (
        heron["sections"]
        == [{"index": 2, "title": "Diet", "score": 0.99}, {"index": 0, "title": "Description", "score": 0.2}]
        and heron["n_sections"] == 2
    )
    cda = record["cda"]
    assert cda["kept"] == [HERON.url, EGRET.url] and (cda["U"], cda["theta"]) == (2, 0.01)
    assert cda["n_chunks"] == len(context.candidates) == len(cda["chunks"]) == 8  # 5 + 3 chunks of L=5 words
    selected = [c for c in cda["chunks"] if c["selected"]]
    assert sorted(c["text"] for c in selected) == sorted(c.text for c in context.chunks) and len(selected) == 5
    assert all(c["text"] for c in cda["chunks"] if not c["selected"])  # dropped chunks keep their text too
    # with fewer places than chunks: every selected chunk, then the best-scored others, in document order
    monkeypatch.setattr(traces, "CHUNKS_KEEP", 6)
    capped = traces.stage_record(Ranking(ranked), "qff", filter_, context, selector)["cda"]
    others = sorted((c for c in cda["chunks"] if not c["selected"]), key=lambda c: -c["score"])
    assert capped["n_chunks"] == 8 and capped["chunks"] == [c for c in cda["chunks"] if c["selected"] or c is others[0]]


def test_sections_are_kept_for_the_first_articles_only(splitter):
    articles = [RankedArticle(make_article(f"A{i}", [("S", "Text.")]), 1.0 - i / 10, {0: 0.5}) for i in range(7)]
    record = traces.stage_record(Ranking(articles), "qff", SimpleNamespace(alpha=0.5))
    assert [len(a["sections"]) for a in record["filter"]["articles"]] == [1] * traces.SECTION_ARTICLES + [0, 0]
    assert all(a["n_sections"] == 1 for a in record["filter"]["articles"]) and record["cda"] is None
