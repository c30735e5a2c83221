"""CDA selection: articles by U and theta, K1/K2 quotas, the ablation modes, and the tiny reranker end to end."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qkvqa.cda.select import ContextSelector, RankedArticle, apply_quotas, select_articles, select_context
from qkvqa.cda.splitter import SentenceSplitter
from qkvqa.components import build_component
from qkvqa.config.schema import CDAConfig
from qkvqa.errors import ConfigError


def words(text: str) -> int:
    return len(text.split())


class KeywordScorer:
    """A transparent reranker: the share of the query's words that are words of the passage body (below the header)."""

    def __init__(self):
        self.calls = []

    def score(self, pairs, batch_size=None, max_length=None, normalize=None):
        self.calls.append(
            {"pairs": list(pairs), "batch_size": batch_size, "max_length": max_length, "normalize": normalize}
        )
        out = []
        for query, passage in pairs:
            q = query.lower().rstrip("?").split()
            body = {w.strip(".,") for w in passage.split("\n", 2)[-1].lower().split()}
            out.append(sum(w in body for w in q) / len(q))
        return out


@pytest.fixture(scope="module")
def splitter():
    return SentenceSplitter()


def make_article(name, sections):
    return SimpleNamespace(
        url=f"https://en.wikipedia.org/wiki/{name}",
        title=name,
        section_titles=[t for t, _ in sections],
        section_texts=[x for _, x in sections],
    )


# With L = 5 words every sentence below is its own chunk.
HERON = make_article(
    "Grey heron",
    [
        ("Description", "The heron is tall. Its wingspan is wide. Its legs are long."),
        ("References", "The heron wingspan paper by Smith."),
        ("Diet", "It eats fish and frogs. The heron hunts at dawn."),
    ],
)
EGRET = make_article(
    "Great egret",
    [
        ("Description", "The egret is white. Its wingspan is large. It nests in trees."),
    ],
)
QUESTION = "how wide is its wingspan?"


def cfg(**kw):
    return CDAConfig(**{"chunk_tokens": 5, "K1": 3, "K2": 2, **kw})


@pytest.mark.parametrize(
    "scores,U,theta,kept",
    [
        ([0.90, 0.895, 0.70], 2, 0.01, [0, 1]),
        ([0.90, 0.88, 0.70], 2, 0.01, [0]),
        ([0.50, 0.49, 0.20], 2, 0.01, [0, 1]),  # exactly theta apart (float slack)
        ([0.90, 0.895, 0.894], 2, 0.01, [0, 1]),  # U caps the count
        ([0.90, 0.895, 0.894], None, 0.01, [0, 1, 2]),  # U lifted
        ([0.90, 0.50, 0.10], 2, None, [0, 1]),  # theta lifted
        ([0.90, 0.50, 0.10], None, None, [0, 1, 2]),  # both lifted
        ([0.90, 0.90], 1, 0.01, [0]),
        ([0.30], 2, 0.01, [0]),
        ([], 2, 0.01, []),
    ],
)
def test_article_selection_by_U_and_theta(scores, U, theta, kept):
    assert select_articles(scores, U, theta) == kept


def test_article_selection_rejects_bad_input():
    with pytest.raises(ValueError, match="non-increasing"):
        select_articles([0.5, 0.6], 2, 0.01)
    with pytest.raises(ConfigError, match="cda.U"):
        select_articles([0.5], 0, 0.01)
    with pytest.raises(ConfigError, match="cda.theta"):
        select_articles([0.5], 2, -0.1)


def test_quotas_take_each_articles_best_chunks_in_score_order():
    from qkvqa.cda.chunker import Chunk

    def c(name, score):
        return Chunk("u", "t", 0, "s", 0, name, 1, score=score)

    first = [c("a1", 0.2), c("a2", 0.9), c("a3", 0.5), c("a4", 0.9), c("a5", 0.1)]
    second = [c("b1", 0.3), c("b2", 0.8), c("b3", 0.99)]
    third = [c("c1", 1.0)]
    picked = apply_quotas([first, second, third], 3, 1)
    assert [x.text for x in picked] == ["a2", "a4", "a3", "b3", "c1"]  # ties keep document order
    assert [x.text for x in apply_quotas([first], 0, 2)] == []


def test_full_cda_context(splitter):
    scorer = KeywordScorer()
    ranked = [RankedArticle(HERON, 0.90), RankedArticle(EGRET, 0.895), RankedArticle(HERON, 0.5)]
    ctx = select_context(QUESTION, ranked, cfg(), scorer, words, splitter)
    assert ctx.kept_articles == [0, 1]
    assert [(c.title, c.text) for c in ctx.chunks] == [
        ("Grey heron", "Its wingspan is wide."),  # 4/5 of the question's words
        ("Grey heron", "The heron is tall."),  # 1/5, tied with the next: document order
        ("Grey heron", "Its legs are long."),
        ("Great egret", "Its wingspan is large."),  # 3/5
        ("Great egret", "The egret is white."),
    ]
    assert [c.article_rank for c in ctx.chunks] == [0, 0, 0, 1, 1]
    assert all("References" not in p for _, p in scorer.calls[0]["pairs"])
    assert len(scorer.calls[0]["pairs"]) == 8  # 5 heron chunks + 3 egret chunks, one call
    assert scorer.calls[0]["pairs"][0] == (
        QUESTION,
        "# Wiki Article: Grey heron\n## Section Title: Description\nThe heron is tall.",
    )
    assert scorer.calls[0]["batch_size"] == 64 and scorer.calls[0]["normalize"] is True
    assert ctx.text == "\n".join(c.render() for c in ctx.chunks)
    assert ctx.token_count == words(ctx.text)
    assert ctx.metadata()["chunks"][3] == {
        "url": EGRET.url,
        "title": "Great egret",
        "section_index": 0,
        "section_title": "Description",
        "chunk_index": 1,
        "token_count": 4,
        "score": pytest.approx(3 / 5),
        "article_rank": 1,
    }


def test_theta_drops_the_second_article(splitter):
    ranked = [RankedArticle(HERON, 0.90), RankedArticle(EGRET, 0.85)]
    ctx = select_context(QUESTION, ranked, cfg(), KeywordScorer(), words, splitter)
    assert ctx.kept_articles == [0] and {c.title for c in ctx.chunks} == {"Grey heron"} and len(ctx.chunks) == 3


def test_ablation_modes(splitter):
    ranked = [RankedArticle(HERON, 0.90, {0: 0.2, 1: 0.99, 2: 0.7}), RankedArticle(EGRET, 0.899, {0: 0.9})]
    first = select_context(QUESTION, ranked, cfg(mode="first_chunk"), KeywordScorer(), words, splitter)
    assert [c.text for c in first.chunks] == ["Its wingspan is wide."] and first.kept_articles == [0]
    top1 = select_context(QUESTION, ranked, cfg(mode="top1_article_chunks"), KeywordScorer(), words, splitter)
    assert [c.text for c in top1.chunks] == ["Its wingspan is wide.", "The heron is tall.", "Its legs are long."]
    section = select_context(QUESTION, ranked, cfg(mode="top1_section", top1_section_by="qff"), None, words, splitter)
    # The References section scores highest but is never a candidate; the whole Diet section, unchunked.
    assert [(c.section_index, c.text, c.score) for c in section.chunks] == [
        (2, "It eats fish and frogs. The heron hunts at dawn.", 0.7)
    ]
    assert (
        section.text
        == "# Wiki Article: Grey heron\n## Section Title: Diet\nIt eats fish and frogs. The heron hunts at dawn."
    )
    assert section.token_count == words(section.text)


def test_empty_and_sectionless_inputs(splitter):
    selector = ContextSelector(cfg(), splitter, words, KeywordScorer())
    empty = selector.select(QUESTION, [])
    assert (empty.chunks, empty.text, empty.token_count, empty.kept_articles) == ([], "", 0, [])
    bare = make_article("Bare", [])
    assert selector.select(QUESTION, [RankedArticle(bare, 0.9)]).chunks == []
    sections = ContextSelector(cfg(mode="top1_section", top1_section_by="qff"), splitter, words).select(
        QUESTION, [RankedArticle(bare, 0.9)]
    )
    assert sections.chunks == [] and sections.text == ""


@pytest.mark.parametrize(
    "by, beta, qff, section, score",
    [
        ("qff", 0.2, {0: 0.2, 2: 0.7}, 2, 0.7),  # QFF alone prefers Diet
        ("bge", 0.2, {}, 0, 0.8),  # the reranker reads "wide ... wingspan" in Description
        ("fused", 0.5, {0: 0.2, 2: 0.7}, 0, (0.2 + 0.8) / 2),  # beta 0.5, the mean: Description 0.5 against Diet 0.35
        ("fused", 0.5, {0: 0.0, 2: 1.0}, 2, (1.0 + 0.0) / 2),  # a strong QFF preference outweighs the reranker
        # OMGM's step-3 mix, beta 0.2 (the default): the reranker weighs 0.8, so the same QFF preference loses
        ("fused", 0.2, {0: 0.0, 2: 1.0}, 0, 0.2 * 0.0 + 0.8 * 0.8),
    ],
)
def test_top1_section_by_qff_bge_or_both(splitter, by, beta, qff, section, score):
    scorer = KeywordScorer()
    ctx = select_context(
        QUESTION,
        [RankedArticle(HERON, 0.9, qff)],
        cfg(mode="top1_section", top1_section_by=by, top1_section_beta=beta),
        scorer if by != "qff" else None,
        words,
        splitter,
    )
    assert [(c.section_index, c.score) for c in ctx.chunks] == [(section, pytest.approx(score))]
    if by != "qff":  # the reranker reads each pair up to OMGM's 6000 tokens, not the chunk length
        assert {call["max_length"] for call in scorer.calls} == {6000}
    # the References section is never a candidate, whichever model picks
    assert all("References" not in passage for call in scorer.calls for _, passage in call["pairs"])


def test_selector_config_errors(splitter):
    with pytest.raises(ConfigError, match="cda.mode"):
        ContextSelector(cfg(mode="everything"), splitter, words, KeywordScorer())
    for config in (cfg(), cfg(mode="top1_section", top1_section_by="bge"), cfg(mode="top1_section")):
        with pytest.raises(ConfigError, match="needs one"):
            ContextSelector(config, splitter, words, None)
    with pytest.raises(ConfigError, match="top1_section_by"):
        ContextSelector(cfg(mode="top1_section", top1_section_by="both"), splitter, words, KeywordScorer())
    with pytest.raises(ConfigError, match="cda.K2"):
        ContextSelector(cfg(K2=-1), splitter, words, KeywordScorer())


@pytest.mark.parametrize("backend", ["native", "flagembedding"])
@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_full_cda_with_the_tiny_reranker(splitter, backend):
    reranker = build_component({"kind": "bge_reranker", "tiny": True, "device": "cpu", "options": {"backend": backend}})
    ranked = [RankedArticle(HERON, 0.90), RankedArticle(EGRET, 0.895)]
    ctx = select_context(QUESTION, ranked, cfg(), reranker, words, splitter)
    heron, egret = ctx.chunks[:3], ctx.chunks[3:]
    assert [c.article_rank for c in ctx.chunks] == [0, 0, 0, 1, 1]
    assert [c.score for c in heron] == sorted((c.score for c in heron), reverse=True)
    assert [c.score for c in egret] == sorted((c.score for c in egret), reverse=True)
    assert all(0.0 < c.score < 1.0 for c in ctx.chunks)  # sigmoid
    expected = reranker.score([(QUESTION, c.render()) for c in ctx.chunks])
    assert [c.score for c in ctx.chunks] == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("mode", ["full", "first_chunk", "top1_article_chunks", "top1_section"])
def test_several_questions_in_one_reranker_call_give_each_questions_own_context(splitter, mode):
    scorer = KeywordScorer()
    selector = ContextSelector(cfg(mode=mode, top1_section_by="bge"), splitter, words, scorer)
    heron_first = [RankedArticle(HERON, 0.90), RankedArticle(EGRET, 0.895)]
    egret_first = [RankedArticle(EGRET, 0.90), RankedArticle(HERON, 0.70)]
    items = [(QUESTION, heron_first), ("what does the heron eat?", egret_first), ("anything?", [])]
    alone = [selector.select(q, arts) for q, arts in items]
    scorer.calls.clear()
    together = selector.select_many(items)
    assert together == alone
    assert [c.text for c in together[:2]] != ["", ""] and together[2].text == ""
    if mode != "top1_section":  # one call for every question's chunks
        assert len(scorer.calls) == 1
        assert {q for q, _ in scorer.calls[0]["pairs"]} == {QUESTION, "what does the heron eat?"}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["native", "flagembedding"])
def test_a_pair_longer_than_the_reranker_reads_is_refused_by_name(backend):
    """Table 5's top-1 section reads 6000-token pairs (OMGM's step 3): a reranker with fewer positions would cut them
    silently, so a longer pair than it reads is refused, naming the keys (issue 32 item 5)."""
    reranker = build_component({"kind": "bge_reranker", "tiny": True, "device": "cpu", "options": {"backend": backend}})
    longest = reranker.positions
    assert longest is not None and longest >= 6000  # BGE-Reranker-v2-m3's 8192, which the tiny one copies
    assert len(reranker.score([("q", "p")], max_length=6000)) == 1
    with pytest.raises(ConfigError, match=rf"at most {longest} tokens, but {longest + 1} were asked for.*top1_section"):
        reranker.score([("q", "p")], max_length=longest + 1)
