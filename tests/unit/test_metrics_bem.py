"""BEM judge: official input layout and segment ids, threshold, EM shortcut, overflow, tiny round trip, loading."""

from __future__ import annotations

import pytest
import torch

from qkvqa.components.registry import ComponentSpec, build_component, registered_kinds
from qkvqa.errors import ConfigError, MissingWeightsError
from qkvqa.metrics import evqa
from qkvqa.metrics.bem import APPROXIMATE_LABEL, BEM_LABEL, BemJudge, write_tiny_bem

VOCAB = ["why is the sky blue light scattering of rayleigh red green paris france mont blanc sep"]
SKY = ("why is the sky blue", "light scattering", "scattering of light")


@pytest.fixture(scope="module")
def judge(monkeypatch_module):
    return build_component(ComponentSpec(kind="bem", tiny=True, device="cpu", options={"vocab_texts": VOCAB}))


@pytest.fixture(scope="module")
def monkeypatch_module(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QKVQA_TINY_DIR", str(tmp_path_factory.mktemp("tiny")))
        yield mp


def _tokens(judge, ids):
    return judge.tokenizer.convert_ids_to_tokens(ids)


def _fixed_head(judge, bias):
    """Make the classifier output `bias` whatever the input (a real model with hand-set weights)."""
    with torch.no_grad():
        judge.model.classifier.weight.zero_()
        judge.model.classifier.bias.copy_(torch.tensor(bias))


@pytest.fixture
def fixed_judge(monkeypatch_module):
    return build_component(ComponentSpec(kind="bem", tiny=True, device="cpu", options={"vocab_texts": VOCAB}))


def test_bem_is_a_registered_kind():
    assert "bem" in registered_kinds()


def test_layout_is_candidate_reference_question_with_segments_0_1_2(judge):
    assert judge.label == BEM_LABEL and judge.model.config.type_vocab_size == 3
    ((input_ids, token_types),) = judge.encode([SKY])
    assert _tokens(judge, input_ids) == [
        "[CLS]",
        "scattering",
        "of",
        "light",
        "[SEP]",
        "light",
        "scattering",
        "[SEP]",
        "why",
        "is",
        "the",
        "sky",
        "blue",
        "[SEP]",
    ]
    assert token_types == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2]
    batch = judge.collate(judge.encode([SKY, ("q", "r", "c")]))
    assert batch["token_type_ids"][0].tolist() == token_types
    assert batch["token_type_ids"][1].tolist() == [0, 0, 0, 1, 1, 2, 2] + [0] * 7  # padding gets 0
    assert batch["attention_mask"].sum(1).tolist() == [14, 7]
    assert batch["input_ids"][1, 7:].eq(judge.tokenizer.pad_token_id).all()


def test_raw_text_is_tokenised_without_preprocessing_or_special_tokens(judge):
    ((input_ids, _),) = judge.encode([("Q", "The Answer: Paris!", "[SEP] x")])
    tokens = _tokens(judge, input_ids)
    assert tokens[1:6] == ["[", "sep", "]", "x", "[SEP]"]  # '[SEP]' in an answer stays text
    assert tokens[6:12] == ["the", "answer", ":", "paris", "!", "[SEP]"]  # no preprocess_answer


def test_two_token_types_give_segments_0_1_and_an_approximate_label(monkeypatch_module):
    two = build_component(
        ComponentSpec(kind="bem", tiny=True, device="cpu", options={"vocab_texts": VOCAB, "type_vocab_size": 2})
    )
    assert two.label == APPROXIMATE_LABEL and "approximate" in two.label
    ((_, token_types),) = two.encode([SKY])
    assert token_types == [0] * 5 + [1] * 9
    assert 0.0 <= two.equivalent(*SKY) <= 1.0


def test_tiny_round_trip_gives_the_same_scores(judge, tmp_path):
    triples = [SKY, ("where is mont blanc", "france", "paris"), ("q", "red&&green", "red")]
    before = judge.score_batch(triples)
    judge.save_pretrained(tmp_path / "bem")
    reloaded = build_component(ComponentSpec(kind="bem", pretrained=str(tmp_path / "bem"), device="cpu"))
    assert reloaded.score_batch(triples) == before
    assert reloaded.label == BEM_LABEL


def test_batched_scores_equal_one_at_a_time(judge):
    triples = [SKY, ("where is mont blanc", "france", "paris"), ("q", "a much longer reference text here", "x")] * 3
    judge.batch_size = 4
    batched = judge.score_batch(triples)
    single = [judge.equivalent(*t) for t in triples]
    assert batched == pytest.approx(single, abs=1e-5)
    assert all(0.0 <= p <= 1.0 for p in batched)
    assert judge.score_batch([]) == []


@pytest.mark.parametrize("bias, expected", [([0.0, 0.0], 1.0), ([0.0, -1e-3], 0.0), ([0.0, 2.0], 1.0)])
def test_threshold_is_inclusive_at_one_half(fixed_judge, bias, expected):
    _fixed_head(fixed_judge, bias)
    question, reference, candidate = SKY
    assert evqa.evaluate_example(question, [reference], candidate, "automatic", bem=fixed_judge) == expected


def test_bem_runs_only_when_em_fails_and_sees_the_multi_answer_reference_with_commas(fixed_judge):
    _fixed_head(fixed_judge, [0.0, 5.0])
    seen = []
    handle = fixed_judge.model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(kwargs["input_ids"].clone()), with_kwargs=True
    )
    try:
        assert evqa.evaluate_example("q", ["Paris", "Lutetia"], "paris", "templated", bem=fixed_judge) == 1.0
        assert seen == []  # EM passed: BEM skipped
        assert evqa.evaluate_example("q", ["red&&green"], "crimson", "multi_answer", bem=fixed_judge) == 1.0
        assert len(seen) == 1
        tokens = _tokens(fixed_judge, seen[0][0].tolist())
        assert "&" not in tokens and "," in tokens  # && became ','
    finally:
        handle.remove()
    _fixed_head(fixed_judge, [5.0, 0.0])
    assert evqa.evaluate_example("q", ["red&&green&&blue"], "red", "multi_answer", bem=fixed_judge) == 0.0
    assert evqa.evaluate_example("q", ["red&&green"], "red", "multi_answer", bem=fixed_judge) == 1.0  # EM accepts


def test_evaluate_with_bem_batches_and_labels(fixed_judge):
    _fixed_head(fixed_judge, [0.0, 5.0])
    questions = [
        {"data_id": f"E-VQA_{i}", "question": "q", "answer": "Paris|Lutetia", "question_type": "templated"}
        for i in range(5)
    ]
    predictions = [{"data_id": f"E-VQA_{i}", "prediction": "Paris" if i == 0 else "London"} for i in range(5)]
    rows = []
    handle = fixed_judge.model.register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    fixed_judge.batch_size = 32
    try:
        result = evqa.evaluate(predictions, questions, bem=fixed_judge)
    finally:
        handle.remove()
    assert rows == [8]  # 4 EM failures x 2 references, one batch
    assert result["label"] == BEM_LABEL and result["all"]["accuracy"] == 100.0
    assert evqa.evaluate(predictions, questions)["all"]["accuracy"] == 20.0


def test_overflow_raises_by_default_and_truncation_is_counted(monkeypatch_module):
    long_candidate = " ".join(["scattering"] * 80)
    short = {"vocab_texts": VOCAB, "max_position_embeddings": 64}
    raising = build_component(ComponentSpec(kind="bem", tiny=True, device="cpu", options=short))
    assert raising.max_length == 64
    with pytest.raises(ValueError, match=r"86 tokens .* > 64"):
        raising.equivalent("why", "light", long_candidate)
    truncating = build_component(
        ComponentSpec(kind="bem", tiny=True, device="cpu", options={**short, "overflow": "truncate"})
    )
    (input_ids, token_types), (short_ids, _) = truncating.encode([("why", "light", long_candidate), SKY])
    assert len(input_ids) == 64 and token_types[-3:] == [1, 2, 2]
    assert truncating.truncated_count == 1 and len(short_ids) == 14
    assert 0.0 <= truncating.equivalent("why", "light", long_candidate) <= 1.0
    assert truncating.truncated_count == 2


def test_configuration_errors(tmp_path, monkeypatch_module):
    with pytest.raises(ConfigError, match="unknown option"):
        build_component(ComponentSpec(kind="bem", tiny=True, options={"batchsize": 4}))
    with pytest.raises(ConfigError, match="overflow"):
        build_component(ComponentSpec(kind="bem", tiny=True, options={"overflow": "silent"}))
    with pytest.raises(MissingWeightsError):
        build_component(ComponentSpec(kind="bem", pretrained=str(tmp_path / "absent")))
    with pytest.raises(MissingWeightsError, match="not in the local cache"):
        build_component(ComponentSpec(kind="bem", pretrained="kortukov/answer-equivalence-bem"))
    three_labels = write_tiny_bem(tmp_path / "three", num_labels=3)
    with pytest.raises(ConfigError, match="3 output labels"):
        build_component(ComponentSpec(kind="bem", pretrained=str(three_labels)))
    no_tokenizer = tmp_path / "no_tokenizer"
    write_tiny_bem(no_tokenizer)
    (no_tokenizer / "vocab.txt").unlink()
    with pytest.raises(MissingWeightsError, match="no tokenizer"):
        build_component(ComponentSpec(kind="bem", pretrained=str(no_tokenizer)))
    assert isinstance(
        build_component(ComponentSpec(kind="bem", pretrained=str(write_tiny_bem(tmp_path / "ok")))), BemJudge
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_auto_device_uses_the_gpu_and_matches_cpu_scores(judge, monkeypatch_module):
    on_gpu = build_component(ComponentSpec(kind="bem", tiny=True, device="auto", options={"vocab_texts": VOCAB}))
    assert next(on_gpu.model.parameters()).device.type == "cuda"
    triples = [SKY, ("where is mont blanc", "france", "paris")]
    assert on_gpu.score_batch(triples) == pytest.approx(judge.score_batch(triples), abs=1e-4)
