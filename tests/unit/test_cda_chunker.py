"""Sentence splitting and sentence-preserving chunks: exact chunks on hand-written sections."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qkvqa.cda.chunker import Chunk, Chunker, SentenceLengths, pack_sentences
from qkvqa.cda.splitter import SentenceSplitter
from qkvqa.components import build_component
from qkvqa.errors import ConfigError


def words(text: str) -> int:
    """A token counter for hand-checkable tests: one token per whitespace-separated word."""
    return len(text.split())


@pytest.fixture(scope="module")
def splitter() -> SentenceSplitter:
    return SentenceSplitter()


@pytest.fixture(scope="module")
def byte_tokens():
    """The tiny generators' tokenizer: byte-level BPE without merges, so one token per UTF-8 byte."""
    from transformers import AutoTokenizer

    from qkvqa.components.registry import ComponentSpec, tiny_model
    from qkvqa.generation.backends import Llama3Format
    from qkvqa.generation.tiny import write_tiny_llama3

    path = tiny_model(ComponentSpec(kind="llama3"), write_tiny_llama3)
    return Llama3Format(AutoTokenizer.from_pretrained(str(path), local_files_only=True)).count_tokens


def article(titles, texts, url="https://en.wikipedia.org/wiki/Everest", title="Mount Everest"):
    return SimpleNamespace(url=url, title=title, section_titles=list(titles), section_texts=list(texts))


def test_abbreviations_do_not_end_sentences(splitter):
    text = (
        "The summit of Mt. Everest is shown in Fig. 3 of the U.S. report. It was surveyed c. 1850 by "
        "No. 5 party. Approx. 300 climbers reach it. Ft. Worth is far away. Dr. Smith agreed."
    )
    assert splitter.split(text) == [
        "The summit of Mt. Everest is shown in Fig. 3 of the U.S. report.",
        "It was surveyed c. 1850 by No. 5 party.",
        "Approx. 300 climbers reach it.",
        "Ft. Worth is far away.",
        "Dr. Smith agreed.",
    ]


@pytest.mark.slow
def test_extra_abbreviations_from_the_component_options():
    text = "See Sect. 2 for details. Then stop."
    assert SentenceSplitter().split(text) == ["See Sect.", "2 for details.", "Then stop."]
    configured = build_component(
        {"kind": "spacy_sentencizer", "tiny": True, "options": {"extra_abbreviations": ["Sect."]}}
    )
    assert configured.split(text) == ["See Sect. 2 for details.", "Then stop."]


def test_splitter_spec_errors():
    with pytest.raises(ConfigError, match="no weights"):
        build_component({"kind": "spacy_sentencizer", "pretrained": "en_core_web_sm"})
    with pytest.raises(ConfigError, match="unknown key"):
        build_component({"kind": "spacy_sentencizer", "tiny": True, "options": {"abbreviations": ["x."]}})
    with pytest.raises(ConfigError, match="one non-empty token"):
        SentenceSplitter(extra_abbreviations=["e. g."])


def test_line_breaks_end_sentences_unless_disabled(splitter):
    text = "Habitat and range\nIt lives in rivers. It also lives in lakes!\n\n  \nIt eats fish."
    assert splitter.split(text) == [
        "Habitat and range",
        "It lives in rivers.",
        "It also lives in lakes!",
        "It eats fish.",
    ]
    assert SentenceSplitter(split_on_newlines=False).split(text) == [
        "Habitat and range\nIt lives in rivers.",
        "It also lives in lakes!",
        "It eats fish.",
    ]
    assert splitter.split_many(["One. Two.", "", "   ", "Three"]) == [["One.", "Two."], [], [], ["Three"]]


def test_greedy_packing_of_whole_sentences():
    sentences = ["a b c.", "d e.", "f g h i.", "j."]  # 3, 2, 4, 1 words
    assert pack_sentences(sentences, 5, SentenceLengths(words)) == [("a b c. d e.", 5), ("f g h i. j.", 5)]
    assert pack_sentences(sentences, 6, SentenceLengths(words)) == [("a b c. d e.", 5), ("f g h i. j.", 5)]
    assert pack_sentences(sentences, 9, SentenceLengths(words)) == [("a b c. d e. f g h i.", 9), ("j.", 1)]
    assert pack_sentences([], 5, SentenceLengths(words)) == []
    with pytest.raises(ValueError, match="at least 1"):
        pack_sentences(sentences, 0, SentenceLengths(words))


def test_a_sentence_longer_than_L_is_its_own_chunk():
    sentences = ["Short one.", "This sentence has far more than five words in it.", "Tail end.", "Last."]
    assert pack_sentences(sentences, 5, SentenceLengths(words)) == [
        ("Short one.", 2),
        ("This sentence has far more than five words in it.", 10),
        ("Tail end. Last.", 3),
    ]


def test_a_section_shorter_than_L_is_one_chunk(splitter):
    chunker = Chunker(splitter, words, max_tokens=60)
    text = "Mount Everest is Earth's highest mountain. It lies in the Mahalangur Himal. Climbers use Fig. 3."
    assert chunker.chunk_texts([text]) == [[(text, 16)]]


def test_chunks_of_an_article_keep_their_metadata_and_render_with_the_header(splitter):
    a = article(
        ["Abstract", "References", "Climbing", "External links", "Empty"],
        [
            "Everest is tall. It is in Nepal.",
            "Smith, J. (1999). A book.",
            "The first ascent was in 1953. Hillary and Norgay reached the top. Many followed them.",
            "Official site.",
            "   ",
        ],
    )
    chunks = Chunker(splitter, words, max_tokens=8).chunk_article(a)
    assert chunks == [
        Chunk(a.url, a.title, 0, "Abstract", 0, "Everest is tall. It is in Nepal.", 7),
        Chunk(a.url, a.title, 2, "Climbing", 0, "The first ascent was in 1953.", 6),
        Chunk(a.url, a.title, 2, "Climbing", 1, "Hillary and Norgay reached the top.", 6),
        Chunk(a.url, a.title, 2, "Climbing", 2, "Many followed them.", 3),
    ]
    assert chunks[1].render() == (
        "# Wiki Article: Mount Everest\n## Section Title: Climbing\nThe first ascent was in 1953."
    )


def test_lengths_count_generator_tokens_not_characters(splitter, byte_tokens):
    text = "Südtirol is in Italy. It has mountains."  # 39 characters, 40 UTF-8 bytes
    assert len(text) == 39 and byte_tokens(text) == 40
    assert Chunker(splitter, byte_tokens, 40).chunk_texts([text]) == [[(text, 40)]]
    assert Chunker(splitter, byte_tokens, 39).chunk_texts([text]) == [
        [("Südtirol is in Italy.", 22), ("It has mountains.", 17)]
    ]


def test_token_count_of_a_chunk_equals_the_count_of_its_text(splitter, byte_tokens):
    text = (
        "The Dolomites are a mountain range in northeastern Italy. They form part of the Southern "
        "Limestone Alps. The highest peak is Marmolada (3,343 m). Approx. 18 peaks rise above 3,000 m. "
        "Fig. 2 shows the Tre Cime di Lavaredo."
    )
    chunks = Chunker(splitter, byte_tokens, 70).chunk_texts([text])[0]
    # spaCy keeps "m." as one token, so "... 3,000 m. Fig. 2 ..." stays one (over-long) sentence.
    assert [count for _, count in chunks] == [57, 46, 40, 75]
    for chunk_text, count in chunks:
        assert count == byte_tokens(chunk_text)
        assert count <= 70 or len(splitter.split(chunk_text)) == 1


def test_sentence_lengths_match_a_trained_bpe(splitter):
    """With merges, a sentence often counts differently alone and after a space; both counts stay exact."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from qkvqa.generation.backends import LLAMA3_SPECIAL_TOKENS, Llama3Format
    from qkvqa.generation.prompts import DOLOMITES_EXAMPLE, EVQA_LLM_SYSTEM, INFOSEEK_LLM_SYSTEM

    corpus = [DOLOMITES_EXAMPLE, EVQA_LLM_SYSTEM, INFOSEEK_LLM_SYSTEM] * 3
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.train_from_iterator(
        corpus,
        trainers.BpeTrainer(vocab_size=600, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(LLAMA3_SPECIAL_TOKENS)})  # kind llama3 needs them
    count = Llama3Format(tokenizer).count_tokens
    sentences = [s for text in corpus for s in splitter.split(text)] + ["(1889) Eiffel’s  tower.", "Südtirol", "42 m."]
    lengths = SentenceLengths(count)
    assert [lengths(s) for s in sentences] == [(count(s), count(" " + s)) for s in sentences]
    assert sum(count(s) != count(" " + s) for s in sentences) >= 3
    for L in (5, 20, 60):
        for chunks in Chunker(splitter, count, L).chunk_texts(corpus):
            for text, n in chunks:
                assert n == count(text) and (n <= L or len(splitter.split(text)) == 1)
