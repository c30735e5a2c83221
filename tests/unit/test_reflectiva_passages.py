"""ReflectiVA's Wiki100k KB read as ReflectiVA reads it (issue 30 item 6): an article's `wikipedia_content` becomes
the passages of aimagelab/ReflectiVA `rag_evaluation/infoseek/release_retrieval.py` `uniform_passages_of_sentences`
(n=300, line 152): spaCy blank English + sentencizer, whole sentences packed greedily into passages of at most 300
spaCy tokens. The fixture `tests/fixtures/public/reflectiva/Wiki100k_ver_1_0-all.json` has articles without blank
lines (each used to become one section, cut at 512 words by the QFF's text preprocessing, in silence)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from spacy.lang.en import English

from qkvqa.config.schema import Config
from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.data.sections import REFLECTIVA_PASSAGE_TOKENS, reflectiva_passages
from qkvqa.errors import DataError, StaleArtifactError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures/public/reflectiva/Wiki100k_ver_1_0-all.json"
W = "https://en.wikipedia.org/wiki/"


@pytest.fixture(scope="module")
def nlp():
    """The pipeline ReflectiVA builds (release_retrieval.py lines 49-50), independently of qkvqa's copy."""
    model = English()
    model.add_pipe("sentencizer")
    return model


@pytest.fixture
def store(tmp_path):
    build_kb_store(FIXTURE, tmp_path / "store")
    return KBStore.open(tmp_path / "store", source=FIXTURE)


def _content(url: str) -> str:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))[url]["wikipedia_content"]


def test_an_article_without_blank_lines_becomes_several_passages_of_at_most_300_spacy_tokens(store, nlp):
    content = _content(W + "Grey-crested_warbler")
    assert "\n\n" not in content and len(nlp(content)) > 2 * REFLECTIVA_PASSAGE_TOKENS
    article = store.get_by_url(W + "Grey-crested_warbler")
    assert len(article.section_texts) >= 3 and article.section_titles == [""] * len(article.section_texts)
    sentences = {s.text: len(s) for s in nlp(content).sents}
    for text in article.section_texts:
        assert sum(n for s, n in sentences.items() if s in text) <= REFLECTIVA_PASSAGE_TOKENS
    assert " ".join(article.section_texts) == " ".join(s.text for s in nlp(content).sents)
    assert store.manifest["source"]["reflectiva_passages"] == "spacy_300" and store.reflectiva_passages == "spacy_300"


@pytest.mark.parametrize("url", ["Grey-crested_warbler", "Harbour_Bridge_(Velmora)", "Blue_jay", "Empty_article"])
def test_passages_are_whole_sentences_packed_greedily_as_reflectiva_packs_them(nlp, url):
    """Each passage joins consecutive sentences with one space; the next sentence would take it over 300 tokens; a
    sentence over 300 tokens is a passage of its own, not cut."""
    sentences = list(nlp(_content(W + url)).sents)
    passages = reflectiva_passages(_content(W + url))
    position = 0
    for k, passage in enumerate(passages):
        taken, tokens = [], 0
        while position < len(sentences) and (not taken or tokens + len(sentences[position]) <= 300):
            taken.append(sentences[position])
            tokens += len(sentences[position])
            position += 1
        assert passage == " ".join(s.text for s in taken), (url, k)
        assert tokens <= 300 or len(taken) == 1
    assert position == len(sentences)
    if url.startswith("Harbour"):
        assert len(nlp(passages[0])) > 300  # the overlong first sentence stands alone, uncut


def test_tokens_are_spacy_tokens_not_whitespace_words(nlp):
    """Punctuation counts: 160 words with a comma after each are 320 spaCy tokens, so two sentences of them do not
    share a passage although their 160 + 10 words would fit in 300."""
    first = "It has " + ", ".join(f"item{k}" for k in range(158)) + "."
    second = "The next sentence has exactly ten short words in it."
    assert len(first.split()) + len(second.split()) < 300 < len(nlp(first)) + len(nlp(second))
    assert reflectiva_passages(f"{first} {second}") == [first, second]


def test_blank_lines_stay_a_switch_recorded_in_the_manifest(tmp_path):
    build_kb_store(FIXTURE, tmp_path / "paragraphs", reflectiva_passages="blank_lines")
    store = KBStore.open(tmp_path / "paragraphs", reflectiva_passages="blank_lines")
    assert store.get_by_url(W + "Blue_jay").section_texts == [
        "The blue jay is a passerine bird.",
        "It is native to eastern North America.",
        "Its diet includes nuts and seeds.",
    ]
    assert len(store.get_by_url(W + "Grey-crested_warbler").section_texts) == 1  # no blank line: one section
    with pytest.raises(StaleArtifactError, match="'blank_lines', the run asks for 'spacy_300'.*--reflectiva-passages"):
        KBStore.open(tmp_path / "paragraphs", reflectiva_passages="spacy_300")
    with pytest.raises(DataError, match="unknown ReflectiVA passage rule 'sentences'"):
        build_kb_store(FIXTURE, tmp_path / "bad", reflectiva_passages="sentences")


def test_a_store_built_before_the_rule_was_recorded_reads_as_blank_lines_and_is_refused_for_the_default(tmp_path):
    build_kb_store(FIXTURE, tmp_path / "old", reflectiva_passages="blank_lines")
    manifest_path = tmp_path / "old/manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["source"]["reflectiva_passages"]  # what an older qkvqa wrote
    manifest_path.write_text(json.dumps(manifest))
    assert KBStore.open(tmp_path / "old").reflectiva_passages == "blank_lines"
    with pytest.raises(StaleArtifactError, match="rebuild it"):
        KBStore.open(tmp_path / "old", reflectiva_passages="spacy_300")


def test_the_default_is_reflectivas_passages():
    assert Config().data.reflectiva_passages == "spacy_300"
