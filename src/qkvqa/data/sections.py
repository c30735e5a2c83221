"""Section strings of KB articles (data-formats.md section 9): header format, candidate filter, LAVIS text preprocessing."""

from __future__ import annotations

import re
from typing import Iterator, NamedTuple, Optional, Sequence

from qkvqa.errors import DataError

# Sections whose title contains one of these (case-insensitive) are never candidates (EchoSight, OMGM).
EXCLUDED_SECTION_KEYWORDS = ("external links", "references")

# LAVIS `BlipCaptionProcessor` eval settings used by the anchors' checkpoints.
BLIP_CAPTION_MAX_WORDS = 512
_BLIP_PUNCTUATION = re.compile(r'[.!"()*#:;~]')
_BLIP_SPACE_RUNS = re.compile(r"\s{2,}")


class CandidateSection(NamedTuple):
    """One candidate section: its ORIGINAL index in the article's section lists, its title and its section string."""

    index: int
    section_title: str
    text: str


def is_excluded_section(section_title: str) -> bool:
    """True for "References" / "External links"-like section titles, which are never candidates."""
    lowered = section_title.lower()
    return any(keyword in lowered for keyword in EXCLUDED_SECTION_KEYWORDS)


def is_empty_section(text: str) -> bool:
    """True for a section with no text (a bare "See also" or "Gallery"): a header alone, never a candidate."""
    return not text.strip()


def is_candidate_section(section_title: str, text: str) -> bool:
    """The one rule for which sections the QFF scores, mining draws and CDA chunks: text, and a title that
    is not references / external links."""
    return not is_excluded_section(section_title) and not is_empty_section(text)


def section_string(title: str, section_title: str, text: str) -> str:
    """The EchoSight section string: `# Wiki Article: {title}\\n## Section Title: {section_title}\\n{text}`."""
    return f"# Wiki Article: {title}\n## Section Title: {section_title}\n{text}"


def candidate_sections(
    title: str, section_titles: Sequence[str], section_texts: Sequence[str], evidence_section_id: Optional[int] = None
) -> Iterator[CandidateSection]:
    """Yield the candidate sections of one article in order, keeping each section's original index.

    Excluded titles ("external links", "references") and sections without text are skipped, except the
    evidence section, which is always yielded so that it can serve as the positive. `evidence_section_id`
    indexes the unfiltered lists; an index outside them raises DataError. The KB build report counts both
    kinds (`excluded_section`, `empty_section`).
    """
    count = min(len(section_titles), len(section_texts))
    if evidence_section_id is not None and not 0 <= evidence_section_id < count:
        raise DataError(f"article {title!r}: evidence_section_id {evidence_section_id} is outside its {count} sections")
    for index in range(count):
        section_title = section_titles[index]
        if index != evidence_section_id and not is_candidate_section(section_title, section_texts[index]):
            continue
        yield CandidateSection(index, section_title, section_string(title, section_title, section_texts[index]))


# ReflectiVA's passages of a Wiki100k article's `wikipedia_content` (aimagelab/ReflectiVA,
# rag_evaluation/infoseek/release_retrieval.py, `uniform_passages_of_sentences`, called with n=300 at line 152):
# spaCy's blank English pipeline (`spacy.lang.en.English()`) with the rule-based "sentencizer", sentences packed in
# order into passages of at most REFLECTIVA_PASSAGE_TOKENS spaCy tokens (whitespace tokens such as a blank line
# count), joined by one space; a sentence longer than that is a passage of its own, never cut.
REFLECTIVA_PASSAGE_TOKENS = 300
_REFLECTIVA_NLP = None


def _reflectiva_nlp():
    global _REFLECTIVA_NLP
    if _REFLECTIVA_NLP is None:
        from spacy.lang.en import English

        nlp = English()
        nlp.add_pipe("sentencizer")
        _REFLECTIVA_NLP = nlp
    return _REFLECTIVA_NLP


def reflectiva_passages(text: str, max_tokens: int = REFLECTIVA_PASSAGE_TOKENS) -> list[str]:
    """ReflectiVA's `uniform_passages_of_sentences(text, n=max_tokens)`, line for line: the passages it reads an
    article's `wikipedia_content` as. `[]` for a text without sentences (as ReflectiVA). A text over spaCy's
    `max_length` (1,000,000 characters), which ReflectiVA's call would refuse, is read whole all the same."""
    nlp = _reflectiva_nlp()
    if len(text) >= nlp.max_length:
        nlp.max_length = len(text) + 1
    passages: list[str] = []
    passage: list[str] = []
    tokens_in_passage = 0
    for sent in nlp(text).sents:
        if tokens_in_passage + len(sent) > max_tokens:
            if passage:
                passages.append(" ".join(passage))
                passage = [sent.text]
                tokens_in_passage = len(sent)
            else:
                passages.append(sent.text)
        else:
            passage.append(sent.text)
            tokens_in_passage += len(sent)
    if passage:
        passages.append(" ".join(passage))
    return passages


def blip_caption(text: str, max_words: int = BLIP_CAPTION_MAX_WORDS) -> str:
    """LAVIS `blip_caption` eval preprocessing: lowercase, `.!"()*#:;~` to spaces, squeeze, keep `max_words` words."""
    text = _BLIP_PUNCTUATION.sub(" ", text.lower())
    text = _BLIP_SPACE_RUNS.sub(" ", text)
    text = text.rstrip("\n").strip(" ")
    words = text.split(" ")
    if len(words) > max_words:
        text = " ".join(words[:max_words])
    return text
