"""Tiny Llama-3 and Qwen2.5-VL generators: batched left-padded greedy generation equals one-by-one, token counting."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from qkvqa.components import build_component
from qkvqa.config.schema import GenerationConfig
from qkvqa.errors import ConfigError
from qkvqa.generation.backends import Generator, build_generator
from qkvqa.generation.prompts import GenerationRequest, Prompt, answer_prompt
from qkvqa.generation.tiny import write_tiny_llama3

# A short template keeps the byte-level prompts short (the appendix prompts run in test_appendix_prompt_generates).
SETTINGS = GenerationConfig(
    max_new_tokens=5, batch_size=4, prompt="template", template="Context: {context}\nQuestion: {question}\nAnswer:"
)


def requests():
    heron = "# Wiki Article: Grey heron\n## Section Title: Description\nThe grey heron is tall. Its wingspan is wide."
    return [
        GenerationRequest("What is the wingspan of this bird?", heron, Image.new("RGB", (70, 50), "red"), "evqa"),
        GenerationRequest("Which region?", "Südtirol", None, "infoseek"),
        GenerationRequest("How tall is it?", heron + " " + heron, Image.new("RGB", (56, 56), "blue"), "infoseek"),
        GenerationRequest("Name?", "x", Image.new("RGB", (90, 40), "green"), "evqa"),
    ]


@pytest.fixture(scope="module", params=["llama3", "qwen2_5_vl"])
def generator(request) -> Generator:
    return build_generator({"kind": request.param, "tiny": True, "device": "cpu"}, SETTINGS)


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_batched_generation_equals_one_by_one(generator):
    reqs = requests()
    batched = generator.generate(reqs)
    single = [generator.generate([r])[0] for r in reqs]
    assert batched == single
    assert len(set(batched)) > 1  # rows are not interchangeable
    # One byte per token, so at most one character per new token: max_new_tokens is honoured.
    assert all(len(a) <= 5 for a in batched) and max(map(len, batched)) >= 3
    short = generator.generate_prompts([Prompt(None, ("hello",))] * 2, max_new_tokens=1)
    assert len(short) == 2 and all(len(a) <= 1 for a in short)
    assert generator.generate([]) == []


def test_batches_are_left_padded(generator):
    prompts = [Prompt(None, ("short",)), Prompt("system", ("a much longer user message than the first",))]
    texts = [generator.chat.render(p) for p in prompts]
    inputs = generator.chat.encode(texts, [[], []])
    mask = inputs["attention_mask"]
    assert mask[0, 0] == 0 and mask[1, 0] == 1 and bool(mask[:, -1].all())
    assert generator.chat.tokenizer.padding_side == "left"


def test_appendix_prompt_generates(generator):
    settings = GenerationConfig(max_new_tokens=3)
    request = requests()[0]
    paper = Generator(generator.chat, generator.runner, settings)
    assert paper.generate([request]) == generator.generate_prompts(
        [answer_prompt(request, generator.generator_type, settings)], max_new_tokens=3
    )
    text = generator.chat.render(answer_prompt(request, generator.generator_type, settings))
    assert "Answer the encyclopedic question about the given image." in text
    assert "- Question: What is the wingspan of this bird?" in text
    if generator.generator_type == "vlm":
        assert text.count("<|vision_start|><|image_pad|><|vision_end|>") == 1 and text.endswith(
            "<|im_start|>assistant\n"
        )
    else:
        assert "<|image_pad|>" not in text and text.startswith("<|begin_of_text|><|start_header_id|>system")
        assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_token_counting_without_special_tokens(generator):
    tokenizer = generator.chat.tokenizer
    assert generator.count_tokens("heron") == 5 and generator.count_tokens("Südtirol") == 9  # UTF-8 bytes
    assert generator.count_tokens("<|im_end|>" if generator.generator_type == "vlm" else "<|eot_id|>") == 1
    if generator.generator_type == "llm":
        assert len(tokenizer("heron")["input_ids"]) == 6  # the bos token is added there, not counted here
    assert generator.truncate_to_tokens("Südtirol is", 2) == "S"  # never half a character
    assert generator.truncate_to_tokens("Südtirol is", 3) == "Sü"
    assert generator.truncate_to_tokens("Südtirol is", 100) == "Südtirol is"
    assert generator.truncate_to_tokens("abc", 0) == ""


def test_llama_stops_at_eot_and_eos():
    generator = build_component({"kind": "llama3", "tiny": True, "device": "cpu"})
    tok = generator.chat.tokenizer
    assert generator.chat.stop_token_ids == [tok.eos_token_id, tok.convert_tokens_to_ids("<|eot_id|>")]
    assert generator.settings == GenerationConfig()


def test_a_tokenizer_without_chat_template_gets_the_llama3_format(tmp_path):
    from transformers import AutoTokenizer

    from qkvqa.generation.backends import Llama3Format

    path = write_tiny_llama3(tmp_path / "llama")
    plain = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    plain.chat_template = None
    prompt = Prompt("Be brief.", ("Which river?",))
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhich river?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert Llama3Format(plain).render(prompt) == expected


def test_pretrained_directory_loads_the_same_model(tmp_path):
    path = write_tiny_llama3(tmp_path / "llama", seed=3)
    from_dir = build_generator({"kind": "llama3", "pretrained": str(path), "device": "cpu"}, SETTINGS)
    tiny = build_generator({"kind": "llama3", "tiny": True, "device": "cpu", "options": {"seed": 3}}, SETTINGS)
    reqs = requests()[:2]
    assert from_dir.generate(reqs) == tiny.generate(reqs)
    for name, value in from_dir.runner.model.state_dict().items():
        torch.testing.assert_close(value, tiny.runner.model.state_dict()[name], rtol=0, atol=0)


def test_generator_spec_errors():
    with pytest.raises(ConfigError, match="generation.backend"):
        build_generator({"kind": "llama3", "tiny": True}, GenerationConfig(backend="tgi"))
    with pytest.raises(ConfigError, match="unknown key"):
        build_generator({"kind": "llama3", "tiny": True, "options": {"temperature": 0.2}})
    with pytest.raises(ConfigError, match="components.generator.kind"):
        build_generator({"kind": "bert_text_encoder", "tiny": True})
    with pytest.raises(ConfigError, match="pretrained"):
        build_generator({"kind": "qwen2_5_vl"})
