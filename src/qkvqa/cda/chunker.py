"""Sentence-preserving chunker (method.md section 4.2): greedy packing of whole sentences up to L generator tokens."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from qkvqa.config.schema import CHUNK_LENGTH_COUNTS  # declared with the config
from qkvqa.data.sections import is_candidate_section, section_string
from qkvqa.errors import ConfigError

# Sentences inside one chunk are joined by this; token counts add up across it (see SentenceLengths).
SENTENCE_JOINER = " "


class ArticleLike(Protocol):
    """What the chunker reads from an article (qkvqa.data.kb.Article satisfies it)."""

    url: str
    title: str
    section_titles: Sequence[str]
    section_texts: Sequence[str]


class Splitter(Protocol):
    """Splits texts into sentences (qkvqa.cda.splitter.SentenceSplitter)."""

    def split_many(self, texts: Sequence[str]) -> list[list[str]]: ...


@dataclass(frozen=True)
class Chunk:
    """A run of whole sentences of one section, with where it came from.

    `text` is the body (sentences joined by one space) and `token_count` its length in generator
    tokens without special tokens. `score` (reranker, sigmoid) and `article_rank` (0-based position
    of the article in the QFF ranking) are set once the chunk has been ranked for a question.
    """

    url: str
    title: str
    section_index: int  # original index in the article's section lists
    section_title: str
    chunk_index: int  # 0-based position of the chunk within its section
    text: str
    token_count: int
    score: Optional[float] = None
    article_rank: Optional[int] = None

    def render(self) -> str:
        """The chunk with its section-string header: `# Wiki Article: ...\\n## Section Title: ...\\n{text}`."""
        return section_string(self.title, self.section_title, self.text)


class SentenceLengths:
    """Generator-token counts of a sentence as the first of its chunk and after the joining space.

    `lengths(s) == (count_tokens(s), count_tokens(" " + s))`, computed with one count of the
    sentence's tail: `count_tokens(head) + count_tokens(" " + tail)` and `count_tokens(" " + head) +
    count_tokens(" " + tail)`, where `head` is the text before the first space (its two counts are
    cached, as sentence-initial words repeat). Like the packing itself, this relies on the tokenizer
    pre-splitting at spaces (byte-level BPE, SentencePiece, WordPiece), where counts add up across a
    space boundary.
    """

    def __init__(self, count_tokens: Callable[[str], int], cache_size: int = 65536):
        self.count_tokens = count_tokens
        self._head_counts = functools.lru_cache(maxsize=cache_size)(self._count_head)

    def _count_head(self, head: str) -> tuple[int, int]:
        return self.count_tokens(head), self.count_tokens(SENTENCE_JOINER + head)

    def __call__(self, sentence: str) -> tuple[int, int]:
        head, space, tail = sentence.partition(" ")
        first, joined = self._head_counts(head)
        if not space:
            return first, joined
        rest = self.count_tokens(" " + tail)
        return first + rest, joined + rest


def pack_sentences(
    sentences: Sequence[str], max_tokens: int, lengths: Callable[[str], tuple[int, int]]
) -> list[tuple[str, int]]:
    """Greedily pack whole sentences into (text, token count) chunks of at most `max_tokens` tokens.

    A sentence is added to the current chunk while the chunk stays within `max_tokens`; otherwise it
    starts the next chunk. A sentence longer than `max_tokens` is therefore a chunk of its own, and a
    section that fits is one chunk. `lengths(s)` gives the sentence's count as a chunk's first
    sentence and after the joining space (SentenceLengths); their sums are the chunk's count.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens (L) must be at least 1, got {max_tokens}")
    chunks: list[tuple[str, int]] = []
    current: list[str] = []
    length = 0
    for sentence in sentences:
        first, joined = lengths(sentence)
        if current:
            if length + joined <= max_tokens:
                current.append(sentence)
                length += joined
                continue
            chunks.append((SENTENCE_JOINER.join(current), length))
        current = [sentence]
        length = first
    if current:
        chunks.append((SENTENCE_JOINER.join(current), length))
    return chunks


class Chunker:
    """Splits the candidate sections of articles into chunks of at most `max_tokens` generator tokens.

    `count_tokens(text) -> int` must count the generator tokenizer's tokens without special tokens
    (`Generator.count_tokens`). "References" / "External links" sections are skipped, as are
    sections without text. `counts` is what `max_tokens` (L) counts: `body` (the sentences; the header is
    added on top when the chunk is rendered) or `with_header` (a section's bodies get L minus the tokens of its
    header `# Wiki Article: ...\n## Section Title: ...\n`, at least 1, so that header and body stay within L
    where the sentences allow).
    """

    def __init__(self, splitter: Splitter, count_tokens: Callable[[str], int], max_tokens: int, counts: str = "body"):
        if max_tokens < 1:
            raise ValueError(f"cda.chunk_tokens (L) must be at least 1, got {max_tokens}")
        if counts not in CHUNK_LENGTH_COUNTS:
            raise ConfigError(f"cda.chunk_length_counts={counts!r} is not one of {', '.join(CHUNK_LENGTH_COUNTS)}")
        self.splitter = splitter
        self.count_tokens = count_tokens
        self.lengths = SentenceLengths(count_tokens)
        self.max_tokens = max_tokens
        self.counts = counts

    def header_tokens(self, title: str, section_title: str) -> int:
        """Generator tokens of a chunk's section-string header (what `Chunk.render` puts before its body)."""
        return self.count_tokens(section_string(title, section_title, ""))

    def body_budget(self, title: str, section_title: str) -> int:
        """The most tokens a chunk body of this section may have: L, or under `with_header` L minus the header's
        tokens (at least 1: a header of L tokens or more leaves one sentence per chunk)."""
        if self.counts == "body":
            return self.max_tokens
        return max(1, self.max_tokens - self.header_tokens(title, section_title))

    def chunk_texts(self, texts: Sequence[str], budgets: Optional[Sequence[int]] = None) -> list[list[tuple[str, int]]]:
        """(text, token count) chunks of each text, within `budgets[i]` tokens (default: L for every text)."""
        budgets = [self.max_tokens] * len(texts) if budgets is None else list(budgets)
        if len(budgets) != len(texts):
            raise ValueError(f"{len(budgets)} budgets for {len(texts)} texts")
        return [
            pack_sentences(sentences, budget, self.lengths)
            for sentences, budget in zip(self.splitter.split_many(texts), budgets)
        ]

    def chunk_article(self, article: ArticleLike) -> list[Chunk]:
        """Every chunk of the article's candidate sections, in section order then chunk order."""
        count = min(len(article.section_titles), len(article.section_texts))
        indexes = [i for i in range(count) if is_candidate_section(article.section_titles[i], article.section_texts[i])]
        budgets = (
            None
            if self.counts == "body"
            else [self.body_budget(article.title, article.section_titles[i]) for i in indexes]
        )
        packed = self.chunk_texts([article.section_texts[i] for i in indexes], budgets)
        return [
            Chunk(
                url=article.url,
                title=article.title,
                section_index=index,
                section_title=article.section_titles[index],
                chunk_index=j,
                text=text,
                token_count=n,
            )
            for index, chunks in zip(indexes, packed)
            for j, (text, n) in enumerate(chunks)
        ]
