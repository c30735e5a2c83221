"""Sentence-preserving chunker (method.md section 4.2): greedy packing of whole sentences up to L generator tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Protocol, Sequence

from qkvqa.data.sections import is_excluded_section, section_string

# Sentences inside one chunk are joined by this; token counts are additive across it (see Chunker).
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
    section_index: int          # original index in the article's section lists
    section_title: str
    chunk_index: int            # 0-based position of the chunk within its section
    text: str
    token_count: int
    score: Optional[float] = None
    article_rank: Optional[int] = None

    def render(self) -> str:
        """The chunk with its section-string header: `# Wiki Article: ...\\n## Section Title: ...\\n{text}`."""
        return section_string(self.title, self.section_title, self.text)


def pack_sentences(sentences: Sequence[str], max_tokens: int,
                   count_tokens: Callable[[str], int]) -> list[tuple[str, int]]:
    """Greedily pack whole sentences into (text, token count) chunks of at most `max_tokens` tokens.

    A sentence is added to the current chunk while the chunk stays within `max_tokens`; otherwise it
    starts the next chunk. A sentence longer than `max_tokens` is therefore a chunk of its own, and a
    section that fits is one chunk. The first sentence of a chunk counts as `count_tokens(s)`, each
    following one as `count_tokens(" " + s)`: for tokenizers that pre-split at spaces (byte-level
    BPE, SentencePiece, WordPiece) the sum equals `count_tokens` of the joined chunk text.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens (L) must be at least 1, got {max_tokens}")
    chunks: list[tuple[str, int]] = []
    current: list[str] = []
    length = 0
    for sentence in sentences:
        if current:
            extra = count_tokens(SENTENCE_JOINER + sentence)
            if length + extra <= max_tokens:
                current.append(sentence)
                length += extra
                continue
            chunks.append((SENTENCE_JOINER.join(current), length))
        current = [sentence]
        length = count_tokens(sentence)
    if current:
        chunks.append((SENTENCE_JOINER.join(current), length))
    return chunks


class Chunker:
    """Splits the candidate sections of articles into chunks of at most `max_tokens` generator tokens.

    `count_tokens(text) -> int` must count the generator tokenizer's tokens without special tokens
    (`Generator.count_tokens`). "References" / "External links" sections are skipped, as are
    sections without text.
    """

    def __init__(self, splitter: Splitter, count_tokens: Callable[[str], int], max_tokens: int):
        if max_tokens < 1:
            raise ValueError(f"cda.chunk_tokens (L) must be at least 1, got {max_tokens}")
        self.splitter = splitter
        self.count_tokens = count_tokens
        self.max_tokens = max_tokens

    def chunk_texts(self, texts: Sequence[str]) -> list[list[tuple[str, int]]]:
        """(text, token count) chunks of each text."""
        return [pack_sentences(sentences, self.max_tokens, self.count_tokens)
                for sentences in self.splitter.split_many(texts)]

    def chunk_article(self, article: ArticleLike) -> list[Chunk]:
        """Every chunk of the article's candidate sections, in section order then chunk order."""
        count = min(len(article.section_titles), len(article.section_texts))
        indexes = [i for i in range(count)
                   if not is_excluded_section(article.section_titles[i]) and article.section_texts[i].strip()]
        packed = self.chunk_texts([article.section_texts[i] for i in indexes])
        return [Chunk(url=article.url, title=article.title, section_index=index,
                      section_title=article.section_titles[index], chunk_index=j, text=text, token_count=n)
                for index, chunks in zip(indexes, packed) for j, (text, n) in enumerate(chunks)]
