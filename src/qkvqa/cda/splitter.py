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
        """The sentences of each text (one spaCy pass over all of them)."""
        result: list[list[str]] = []
        for doc in self.nlp.pipe(texts, batch_size=self.batch_size):
            text = doc.text
            sentences: list[str] = []
            for span in doc.sents:
                # Slicing the text avoids building a Python Token per token (Span.text would).
                sentence = text[span.start_char : span.end_char]
                pieces = sentence.split("\n") if self.split_on_newlines and "\n" in sentence else (sentence,)
                sentences.extend(piece.strip() for piece in pieces if piece.strip())
            result.append(sentences)
        return result


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
