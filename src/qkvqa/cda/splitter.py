"""Sentence splitter for chunking: spaCy's blank English tokenizer + rule-based sentencizer (kind `spacy_sentencizer`)."""

from __future__ import annotations

from typing import Iterable, Sequence

from qkvqa.components.registry import ComponentSpec, register_component
from qkvqa.errors import ConfigError

# The blank English tokenizer splits a sentence after these (models.md section 7); a special case
# keeps each one a single token, so that the sentencizer no longer ends a sentence there. Each is added as written,
# lowercased and capitalised: "fig. 3", "no. 42", "(est. 1120)" and "Pop. 12,000" were split where en_core_web_sm
# (spaCy's trained pipeline) does not split (tests/real/test_real_sentences.py compares the two on real-style text).
# Taxonomy's "sp." / "spp." are left out: they often end a sentence ("... and other Conus spp.").
ABBREVIATIONS = ("Fig.", "No.", "Nos.", "Approx.", "Ft.", "c.", "ca.", "est.", "pop.", "vol.", "pp.", "cf.", "vs.")
DEFAULT_ABBREVIATIONS = tuple(
    dict.fromkeys(form for a in ABBREVIATIONS for form in (a, a.lower(), a[:1].upper() + a[1:].lower()))
)


class SentenceSplitter:
    """Splits texts into sentences with `spacy.blank("en")` + `sentencizer`, with extra abbreviation special cases.

    With `split_on_newlines` (default) a line break always ends a sentence: KB section texts put
    paragraphs and list items on separate lines, often without final punctuation. Sentences are
    returned stripped of surrounding whitespace; whitespace-only pieces are dropped.
    """

    def __init__(self, extra_abbreviations: Sequence[str] = (), split_on_newlines: bool = True, batch_size: int = 256):
        import spacy
        from spacy.symbols import ORTH

        self.abbreviations = tuple(dict.fromkeys([*DEFAULT_ABBREVIATIONS, *extra_abbreviations]))
        self.split_on_newlines = split_on_newlines
        self.batch_size = batch_size
        self.nlp = spacy.blank("en")
        self.nlp.add_pipe("sentencizer")
        for abbreviation in self.abbreviations:
            if not abbreviation or any(ch.isspace() for ch in abbreviation):
                raise ConfigError(f"splitter abbreviation {abbreviation!r} must be one non-empty token without spaces")
            self.nlp.tokenizer.add_special_case(abbreviation, [{ORTH: abbreviation}])

    def split(self, text: str) -> list[str]:
        """The sentences of one text, in order."""
        return self.split_many([text])[0]

    def split_many(self, texts: Iterable[str]) -> list[list[str]]:
        """The sentences of each text (one spaCy pass over all of them). A text longer than PIECE_CHARS goes through
        spaCy in pieces cut at a line break (which ends a sentence anyway), else at a space: a 1 MB KB section stopped
        an evaluation after stage 1 with spaCy's E088 (its `max_length`) and 2.2 GB of memory (issue 44)."""
        owners: list[int] = []
        pieces: list[str] = []
        count = 0
        for count, text in enumerate(texts, 1):
            for piece in _pieces(text, PIECE_CHARS):
                owners.append(count - 1)
                pieces.append(piece)
        result: list[list[str]] = [[] for _ in range(count)]
        for owner, doc in zip(owners, self.nlp.pipe(pieces, batch_size=self.batch_size)):
            text = doc.text
            sentences = result[owner]
            for span in doc.sents:
                # Slicing the text avoids building a Python Token per token (Span.text would).
                sentence = text[span.start_char : span.end_char]
                parts = sentence.split("\n") if self.split_on_newlines and "\n" in sentence else (sentence,)
                sentences.extend(part.strip() for part in parts if part.strip())
        return result


PIECE_CHARS = 100_000  # well under spaCy's max_length (1,000,000), and a bounded memory per piece


def _pieces(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` characters, cut after a line break where there is one, else after a space,
    else anywhere; the pieces joined give `text` back."""
    if len(text) <= limit:
        return [text]
    out, start = [], 0
    while len(text) - start > limit:
        end = start + limit
        cut = text.rfind("\n", start + 1, end)
        if cut < 0:
            cut = text.rfind(" ", start + 1, end)
        cut = end if cut < 0 else cut + 1
        out.append(text[start:cut])
        start = cut
    out.append(text[start:])
    return out


@register_component("spacy_sentencizer")
def build_spacy_sentencizer(spec: ComponentSpec) -> SentenceSplitter:
    """A SentenceSplitter; options: `extra_abbreviations` (list), `split_on_newlines` (bool). It has no weights."""
    if spec.pretrained:
        raise ConfigError(
            f"components.splitter (kind spacy_sentencizer) loads no weights; remove "
            f"`pretrained: {spec.pretrained}` and set `tiny: true`"
        )
    options = dict(spec.options)
    known = {"extra_abbreviations", "split_on_newlines"}
    unknown = set(options) - known
    if unknown:
        raise ConfigError(f"components.splitter.options: unknown key(s) {sorted(unknown)}; valid: {sorted(known)}")
    return SentenceSplitter(
        extra_abbreviations=list(options.get("extra_abbreviations", ())),
        split_on_newlines=bool(options.get("split_on_newlines", True)),
    )
