"""The chunk reranker: FlagEmbedding and the native transformers port give the same scores on the tiny cross-encoder."""

from __future__ import annotations

import math

import pytest

from qkvqa.cda.reranker import NativeReranker, sigmoid
from qkvqa.components import build_component, registered_kinds
from qkvqa.errors import ConfigError

QUESTION = "what is the wingspan of the grey heron?"
PAIRS = [
    (QUESTION, "# Wiki Article: Grey heron\n## Section Title: Description\nThe wingspan is 155 to 195 cm."),
    (QUESTION, "# Wiki Article: Grey heron\n## Section Title: Diet\nIt eats fish, frogs and small mammals."),
    ("which river is this?", "The Danube flows through ten countries. " * 80),  # passage truncated
    ("how tall " * 500 + "is it?", "Short passage."),  # query truncated
    ("Qui a construit la tour ?", "Gustave Eiffel’s company built the tower in 1889."),  # <unk> pieces
]


@pytest.fixture(scope="module")
def rerankers():
    spec = {"kind": "bge_reranker", "tiny": True, "device": "cpu"}
    flag = build_component({**spec, "options": {"backend": "flagembedding", "batch_size": 2}})
    native = build_component({**spec, "options": {"backend": "native", "batch_size": 3}})
    return flag, native


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_both_backends_give_the_same_scores(rerankers):
    flag, native = rerankers
    assert isinstance(native, NativeReranker) and type(flag).__name__ == "FlagEmbeddingReranker"
    for normalize in (False, True):
        a = flag.score(PAIRS, normalize=normalize)
        b = native.score(PAIRS, normalize=normalize)
        assert b == pytest.approx(a, abs=1e-5)
        assert max(a) - min(a) > 1e-2  # the tiny model does tell the pairs apart
    raw = native.score(PAIRS, normalize=False)
    assert native.score(PAIRS) == pytest.approx([1 / (1 + math.exp(-x)) for x in raw], abs=1e-12)


@pytest.mark.slow
def test_scores_follow_input_order_and_do_not_depend_on_the_batch(rerankers):
    _, native = rerankers
    together = native.score(PAIRS, batch_size=5)
    alone = [native.score([pair])[0] for pair in PAIRS]
    assert together == pytest.approx(alone, abs=1e-5)
    assert native.score(PAIRS[::-1], batch_size=2) == pytest.approx(together[::-1], abs=1e-5)
    assert native.score([]) == [] and rerankers[0].score([]) == []


def test_max_length_truncates_the_passage_not_the_query(rerankers):
    flag, native = rerankers
    long_pair = [PAIRS[2]]
    assert native.score(long_pair, max_length=32) != pytest.approx(native.score(long_pair, max_length=512), abs=1e-6)
    assert native.score(long_pair, max_length=32) == pytest.approx(flag.score(long_pair, max_length=32), abs=1e-5)


@pytest.mark.slow
def test_sigmoid_is_stable():
    assert sigmoid(0.0) == 0.5
    assert sigmoid(-1000.0) == 0.0 and sigmoid(1000.0) == 1.0
    assert sigmoid(2.0) == pytest.approx(1 / (1 + math.exp(-2.0)))


@pytest.mark.slow
def test_reranker_spec_errors():
    assert {"bge_reranker", "spacy_sentencizer", "llama3", "qwen2_5_vl"} <= set(registered_kinds())
    with pytest.raises(ConfigError, match="backend"):
        build_component({"kind": "bge_reranker", "tiny": True, "options": {"backend": "onnx"}})
    with pytest.raises(ConfigError, match="unknown key"):
        build_component({"kind": "bge_reranker", "tiny": True, "options": {"max_len": 256}})
