"""CDA context selection (method.md section 4): articles by U and theta, chunk ranking, K1/K2 quotas, ablation modes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Protocol, Sequence

from qkvqa.cda.chunker import ArticleLike, Chunk, Chunker, Splitter
from qkvqa.config.schema import CDA_MODES as MODES  # declared with the config
from qkvqa.config.schema import THETA_ON, TOP1_SECTION_BY
from qkvqa.data.sections import is_candidate_section
from qkvqa.errors import ConfigError

if TYPE_CHECKING:
    from qkvqa.config.schema import CDAConfig

CONTEXT_JOINER = "\n"
# Float slack when comparing S_1 - S_i with theta (0.5 - 0.49 is 0.010000000000000009).
THETA_TOLERANCE = 1e-9


class PairScorer(Protocol):
    """The chunk reranker interface (qkvqa.cda.reranker.Reranker)."""

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        batch_size: Optional[int] = None,
        max_length: Optional[int] = None,
        normalize: Optional[bool] = None,
    ) -> list[float]: ...


@dataclass(frozen=True)
class RankedArticle:
    """One article of a question's QFF ranking: the article, its fused score S_i and its sections' QFF scores.

    `section_scores` maps ORIGINAL section indexes (positions in `article.section_titles`) to QFF
    scores; only the `top1_section` mode reads it. `sim_ret` (the stage-1 similarity) and `qff` (the article's
    QFF score) are what the filter fused, None where it did not compute them; CDA never reads them (the trace does).
    """

    article: ArticleLike
    score: float
    section_scores: Mapping[int, float] = field(default_factory=dict)
    sim_ret: Optional[float] = None
    qff: Optional[float] = None


@dataclass(frozen=True)
class Context:
    """The selected context of one question.

    `chunks` are in context order (article 1's by score, then article 2's, ...), each with `score`
    and `article_rank` set (no score in `top1_section` mode); `text` is their rendered forms joined by
    newlines and `token_count` its length in generator tokens. `kept_articles` are the 0-based ranks of
    the articles that survived selection by U and theta. `candidates` are every chunk CDA scored (the kept
    articles' chunks, or in `top1_section` mode the top-1 article's scored sections, their `token_count` 0 where
    not counted), selected or not, in article then document order.
    """

    mode: str
    chunks: list[Chunk]
    text: str
    token_count: int
    kept_articles: list[int]
    candidates: list[Chunk] = field(default_factory=list)

    def metadata(self) -> dict:
        """A JSON-ready record of the selection (for prediction files and analysis)."""
        return {
            "mode": self.mode,
            "token_count": self.token_count,
            "kept_articles": list(self.kept_articles),
            "chunks": [
                {
                    "url": c.url,
                    "title": c.title,
                    "section_index": c.section_index,
                    "section_title": c.section_title,
                    "chunk_index": c.chunk_index,
                    "token_count": c.token_count,
                    "score": c.score,
                    "article_rank": c.article_rank,
                }
                for c in self.chunks
            ],
        }


def select_articles(
    scores: Sequence[float], U: Optional[int], theta: Optional[float], compared: Optional[Sequence[float]] = None
) -> list[int]:
    """Ranks of the articles kept by Eq. 11: among the top U, those with S_1 - S_i <= theta; article 1 always.

    `scores` are the fused scores in ranking order (non-increasing); `U: None` / `theta: None` lift
    the corresponding limit. `compared` (default `scores`) are the values theta compares, in the same order
    (`theta_scores`: the QFF scores, or a softmax of the fused scores): article i is kept when
    `compared[0] - compared[i] <= theta`.
    """
    if not scores:
        return []
    if U is not None and U < 1:
        raise ConfigError(f"cda.U must be at least 1 or null, got {U}")
    if theta is not None and theta < 0:
        raise ConfigError(f"cda.theta must be non-negative or null, got {theta}")
    for i in range(1, len(scores)):
        if scores[i] > scores[i - 1]:
            raise ValueError(
                f"ranked articles must come in non-increasing fused-score order; rank {i} has "
                f"{scores[i]} after {scores[i - 1]}"
            )
    compared = scores if compared is None else compared
    if len(compared) != len(scores):
        raise ValueError(f"{len(compared)} compared values for {len(scores)} ranked articles")
    limit = len(scores) if U is None else min(U, len(scores))
    best = compared[0]
    return [0] + [i for i in range(1, limit) if theta is None or best - compared[i] <= theta + THETA_TOLERANCE]


def theta_scores(
    ranked: Sequence[RankedArticle], theta_on: str = "fused", temperature: Optional[float] = None
) -> list[float]:
    """The value theta compares for each ranked article (`cda.theta_on`, docs/protocol.md "Readings"), in ranking order:
    `fused` its fused score S; `qff` its QFF score (the filter must have computed one); `softmax` the softmax of
    S / `temperature` (`qff.temperature`, the paper's tau) over every ranked article, which keeps the order."""
    if theta_on not in THETA_ON:
        raise ConfigError(f"cda.theta_on={theta_on!r} is not one of {', '.join(THETA_ON)}")
    if theta_on == "fused":
        return [a.score for a in ranked]
    if theta_on == "qff":
        if any(a.qff is None for a in ranked):
            raise ConfigError(
                "cda.theta_on=qff compares the articles' QFF scores, which this ranking does not carry (eval.filter="
                "retrieval, or reranked results without qff_scores); set cda.theta_on=fused or eval.filter=qff"
            )
        return [float(a.qff) for a in ranked]
    if temperature is None or temperature <= 0:
        raise ConfigError(f"cda.theta_on=softmax needs a positive temperature (qff.temperature), got {temperature}")
    if not ranked:
        return []
    logits = [a.score / temperature for a in ranked]
    top = max(logits)
    weights = [math.exp(x - top) for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def apply_quotas(ranked: Sequence[Sequence[Chunk]], k_first: int, k_other: int) -> list[Chunk]:
    """Eq. 13: the `k_first` best chunks of the first kept article, then the `k_other` best of each other kept article.

    `ranked` holds each kept article's scored chunks; within a group chunks are ordered by score
    (descending; ties keep document order).
    """
    selected: list[Chunk] = []
    for position, chunks in enumerate(ranked):
        quota = k_first if position == 0 else k_other
        order = sorted(range(len(chunks)), key=lambda j: -chunks[j].score)
        selected.extend(chunks[j] for j in order[:quota])
    return selected


def needs_reranker(cfg: "CDAConfig") -> bool:
    """Whether a CDA config scores text with the chunk reranker (every mode but a QFF-only top-1 section)."""
    return cfg.mode != "top1_section" or cfg.top1_section_by != "qff"


def needs_section_scores(cfg: "CDAConfig") -> bool:
    """Whether a CDA config reads the filter's per-section QFF scores (a top-1 section chosen with QFF)."""
    return cfg.mode == "top1_section" and cfg.top1_section_by != "bge"


def check_pair_length(cfg: "CDAConfig", positions: Optional[int]) -> None:
    """Refuse, before any question is answered, a pair length longer than the reranker reads (`positions`: its
    longest pair, None when unbounded): `cda.top1_section_max_length` in top-1-section mode, else
    `cda.reranker_max_length`."""
    key = "top1_section_max_length" if cfg.mode == "top1_section" else "reranker_max_length"
    asked = getattr(cfg, key)
    if positions is not None and asked > positions:
        raise ConfigError(
            f"cda.{key}={asked}: components.reranker reads pairs of at most {positions} tokens (cda.mode="
            f"{cfg.mode}); set cda.{key}={positions} or lower, or use a reranker that reads longer pairs"
        )


class ContextSelector:
    """Builds the CDA context of a question from its QFF-ranked articles (the pipeline's entry point).

    - `splitter`: sentence splitter (component `spacy_sentencizer`);
    - `count_tokens(text) -> int`: the generator tokenizer's count without special tokens
      (`Generator.count_tokens`), used for chunk lengths (L = `cfg.chunk_tokens`) and context length;
    - `reranker`: `score(pairs, batch_size=, max_length=, normalize=)` (component `bge_reranker`);
      not needed in `top1_section` mode with `top1_section_by=qff`.

    Chunks are scored as (question, rendered chunk), the rendered chunk carrying its section-string
    header. With U or theta lifted, every kept article after the first gets the K2 quota. Theta compares
    what `cfg.theta_on` names (`theta_scores`); `temperature` (`qff.temperature`) is the softmax's.
    """

    def __init__(
        self,
        cfg: "CDAConfig",
        splitter: Splitter,
        count_tokens: Callable[[str], int],
        reranker: Optional[PairScorer] = None,
        temperature: Optional[float] = None,
    ):
        if cfg.mode not in MODES:
            raise ConfigError(f"cda.mode: {cfg.mode!r} is not one of {', '.join(MODES)}")
        if cfg.top1_section_by not in TOP1_SECTION_BY:
            raise ConfigError(
                f"cda.top1_section_by: {cfg.top1_section_by!r} is not one of {', '.join(TOP1_SECTION_BY)}"
            )
        if needs_reranker(cfg) and reranker is None:
            raise ConfigError(
                f"cda.mode={cfg.mode} (top1_section_by={cfg.top1_section_by}) ranks text with the "
                "reranker and needs one (components.reranker)"
            )
        if needs_reranker(cfg) and reranker is not None:
            check_pair_length(cfg, getattr(reranker, "positions", None))
        for key in ("K1", "K2"):
            if getattr(cfg, key) < 0:
                raise ConfigError(f"cda.{key} must be non-negative, got {getattr(cfg, key)}")
        if cfg.theta_on not in THETA_ON:
            raise ConfigError(f"cda.theta_on={cfg.theta_on!r} is not one of {', '.join(THETA_ON)}")
        if cfg.mode == "full" and cfg.theta_on == "softmax" and (temperature is None or temperature <= 0):
            raise ConfigError(f"cda.theta_on=softmax needs a positive qff.temperature, got {temperature}")
        self.cfg = cfg
        self.count_tokens = count_tokens
        self.reranker = reranker
        self.temperature = temperature
        self.chunker = Chunker(splitter, count_tokens, cfg.chunk_tokens, cfg.chunk_length_counts)

    def select(
        self, question: str, ranked_articles: Sequence[RankedArticle], image: Optional[object] = None
    ) -> Context:
        """The context for `question` given its articles in fused-score order (`image` is unused: CDA reads text)."""
        return self.select_many([(question, ranked_articles)])[0]

    def select_many(self, items: Sequence[tuple[str, Sequence[RankedArticle]]]) -> list[Context]:
        """`select` of several (question, ranked articles): the chunks of every question are scored in one reranker
        call (its batches of `reranker_batch_size` span questions); each context is the one-question context."""
        mode = self.cfg.mode
        if mode == "top1_section":
            return [
                self._context(*self._top1_section(q, arts[0]), [0]) if arts else self._context([], [], [])
                for q, arts in items
            ]
        plans, pairs = [], []
        for question, ranked_articles in items:
            if not ranked_articles:
                plans.append(None)
                continue
            if mode == "full":
                compared = (
                    None
                    if self.cfg.theta is None or self.cfg.theta_on == "fused"
                    else theta_scores(ranked_articles, self.cfg.theta_on, self.temperature)
                )
                kept = select_articles([a.score for a in ranked_articles], self.cfg.U, self.cfg.theta, compared)
            else:
                kept = [0]
            per_article = [(rank, self.chunker.chunk_article(ranked_articles[rank].article)) for rank in kept]
            plans.append((kept, per_article, len(pairs)))
            pairs += [(question, chunk.render()) for _, chunks in per_article for chunk in chunks]
        scores = (
            self.reranker.score(
                pairs,
                batch_size=self.cfg.reranker_batch_size,
                max_length=self.cfg.reranker_max_length,
                normalize=self.cfg.reranker_normalize,
            )
            if pairs
            else []
        )
        k_first = 1 if mode == "first_chunk" else self.cfg.K1
        contexts = []
        for plan in plans:
            if plan is None:
                contexts.append(self._context([], [], []))
                continue
            kept, per_article, position = plan
            ranked = []
            for rank, chunks in per_article:
                ranked.append(
                    [
                        replace(chunk, score=float(scores[position + j]), article_rank=rank)
                        for j, chunk in enumerate(chunks)
                    ]
                )
                position += len(chunks)
            contexts.append(
                self._context(apply_quotas(ranked, k_first, self.cfg.K2), [c for g in ranked for c in g], kept)
            )
        return contexts

    def _top1_section(self, question: str, ranked: RankedArticle) -> tuple[list[Chunk], list[Chunk]]:
        """The best candidate section of the top-1 article by `cda.top1_section_by` (first on ties), and every
        section scored for it (with its score)."""
        article, by = ranked.article, self.cfg.top1_section_by
        count = min(len(article.section_titles), len(article.section_texts))
        indices = [i for i in range(count) if is_candidate_section(article.section_titles[i], article.section_texts[i])]
        if by != "bge":  # QFF takes part: only the sections it scored
            indices = [i for i in indices if i in ranked.section_scores]
        if not indices:
            return [], []
        sections = {
            i: Chunk(
                url=article.url,
                title=article.title,
                section_index=i,
                section_title=article.section_titles[i],
                chunk_index=0,
                text=article.section_texts[i].strip(),
                token_count=0,
                article_rank=0,
            )
            for i in indices
        }
        scores = {i: float(ranked.section_scores[i]) for i in indices} if by != "bge" else {}
        if by != "qff":
            # OMGM's step 3 reads each (question, section) pair whole (6000 tokens) and mixes
            # beta * section similarity + (1 - beta) * sigmoid(BGE) (test/step3_secaugmented_gen.py).
            bge = self.reranker.score(
                [(question, sections[i].render()) for i in indices],
                batch_size=self.cfg.reranker_batch_size,
                max_length=self.cfg.top1_section_max_length,
                normalize=self.cfg.reranker_normalize,
            )
            beta = float(self.cfg.top1_section_beta)
            scores = {
                i: beta * scores[i] + (1 - beta) * b if by == "fused" else b for i, b in zip(indices, map(float, bge))
            }
        index = max(indices, key=lambda i: (scores[i], -i))
        best = sections[index]
        chosen = replace(best, token_count=self.count_tokens(best.text), score=scores[index])
        return [chosen], [chosen if i == index else replace(sections[i], score=scores[i]) for i in indices]

    def _context(self, chunks: list[Chunk], candidates: list[Chunk], kept: list[int]) -> Context:
        text = CONTEXT_JOINER.join(chunk.render() for chunk in chunks)
        return Context(
            mode=self.cfg.mode,
            chunks=chunks,
            text=text,
            token_count=self.count_tokens(text) if text else 0,
            kept_articles=kept,
            candidates=candidates,
        )


def select_context(
    question: str,
    ranked_articles: Sequence[RankedArticle],
    cfg: "CDAConfig",
    reranker: Optional[PairScorer],
    count_tokens: Callable[[str], int],
    splitter: Splitter,
    temperature: Optional[float] = None,
) -> Context:
    """One-shot form of `ContextSelector(cfg, splitter, count_tokens, reranker, temperature).select(question,
    ranked_articles)`."""
    return ContextSelector(cfg, splitter, count_tokens, reranker, temperature).select(question, ranked_articles)
