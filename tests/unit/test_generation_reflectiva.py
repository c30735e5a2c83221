"""Kind reflectiva: a tiny LLaVA converted through the real converter generates end to end with tiny: true, reads the
image, batches like one-by-one, and renders ReflectiVA's conversation (conv llama_3_1) text."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from qkvqa.config.schema import GenerationConfig
from qkvqa.errors import ConfigError
from qkvqa.generation.backends import Generator, build_generator
from qkvqa.generation.llava_convert import CONVERTER_VERSION
from qkvqa.generation.prompts import GenerationRequest, Prompt, reflectiva_prompt
from qkvqa.generation.tiny_llava import write_tiny_llava_source

SETTINGS = GenerationConfig(max_new_tokens=4, batch_size=3)
HERON = "# Wiki Article: Grey heron\n## Section Title: Description\nThe grey heron is tall."
SYSTEM = (
    "You are a helpful language and vision assistant. You are able to understand the visual content that the "
    "user provides, and assist the user with a variety of tasks using natural language."
)


def requests():
    return [
        GenerationRequest("What is the wingspan of this bird?", HERON, Image.new("RGB", (70, 50), "red"), "evqa"),
        GenerationRequest("Which region?", "Südtirol", None, "infoseek"),
        GenerationRequest("How tall is it?", HERON + " " + HERON, Image.new("RGB", (30, 56), "blue"), "infoseek"),
        GenerationRequest("Name?", "x", Image.new("RGB", (90, 40), "green"), "evqa"),
    ]


@pytest.fixture(scope="module")
def generator(tmp_path_factory) -> Generator:
    with pytest.MonkeyPatch.context() as patch:  # module-scoped: before the per-test tiny dir is set
        patch.setenv("QKVQA_TINY_DIR", str(tmp_path_factory.mktemp("tiny")))
        yield build_generator({"kind": "reflectiva", "tiny": True, "device": "cpu"}, SETTINGS)


def test_prompt_is_reflectivas_conversation_text(generator):
    request = GenerationRequest("What is this?", "Some passage.", Image.new("RGB", (28, 28)), "evqa")
    text = generator.chat.render(generator.chat.answer_prompt(request, SETTINGS))
    # release_retrieval.py concat_paragraph through conv llama_3_1 and the tiny checkpoint's Llama 3 template,
    # ending where the assistant answers
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + SYSTEM + "<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\n<image>\n\nWhat is this?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n[Retrieval]<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nConsider this paragraph: <paragraph>Some passage.</paragraph>. "
        "Give a short answer.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    # the same messages as conv.get_prompt() builds them, through the checkpoint's own template
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "<image>\n\nWhat is this?"},
        {"role": "assistant", "content": "[Retrieval]"},
        {
            "role": "user",
            "content": "Consider this paragraph: <paragraph>Some passage.</paragraph>. Give a short answer.",
        },
    ]
    plain = generator.chat.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert text.startswith(plain) and generator.chat.opening_added
    assert reflectiva_prompt(request, short=False).parts == (
        "Consider this paragraph: <paragraph>Some passage.</paragraph>",
    )


def test_tokens_hold_one_bos_and_the_expanded_image(generator):
    request = requests()[0]
    text = generator.chat.render(generator.chat.answer_prompt(request, SETTINGS))
    inputs = generator.chat.encode([text], [[request.image]])
    ids = inputs["input_ids"][0].tolist()
    tokenizer = generator.chat.tokenizer
    assert ids.count(tokenizer.bos_token_id) == 1 and ids[0] == tokenizer.bos_token_id
    config = generator.runner.model.config
    assert ids.count(config.image_token_index) == config.image_seq_length == 4  # (28 / 14) ** 2 patches
    assert tuple(inputs["pixel_values"].shape) == (1, 3, 28, 28)


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_generates_end_to_end_batched_like_one_by_one(generator):
    reqs = requests()
    batched = generator.generate(reqs)
    single = [generator.generate([r])[0] for r in reqs]
    assert batched == single
    assert len(batched) == 4 and all(isinstance(a, str) for a in batched)
    assert len(set(batched)) > 1
    assert generator.generator_type == "vlm"
    assert generator.count_tokens("héron") == len("héron".encode("utf-8"))
    assert generator.conversion["converter_version"] == CONVERTER_VERSION
    assert len(generator.conversion["source"]["fingerprint"]["sha256"]) == 64


def test_the_image_reaches_the_model(generator):
    chat, model = generator.chat, generator.runner.model
    question = GenerationRequest("What is it?", HERON, Image.new("RGB", (28, 28), "red"), "evqa")
    text = chat.render(chat.answer_prompt(question, SETTINGS))
    logits = []
    for colour in ("red", "blue"):
        inputs = chat.encode([text], [[Image.new("RGB", (28, 28), colour)]])
        with torch.no_grad():
            logits.append(model(**inputs).logits[0, -1])
    assert not torch.allclose(logits[0], logits[1], atol=1e-3)


def test_image_placeholder_is_never_generated_and_a_literal_one_is_text(generator):
    chat = generator.chat
    assert chat.suppress_token_ids == [generator.runner.model.config.image_token_index]
    assert chat.tokenizer.convert_tokens_to_ids("<|eot_id|>") in chat.stop_token_ids
    text = chat.render(Prompt(None, ("a passage that says <image> in it",)))
    assert "<image>" not in text and chat.text_image_tokens == 1


def test_generate_prompts_with_filter_style_prompts(generator):
    prompts = [
        Prompt("sys", (Image.new("RGB", (40, 20)), " - Question: q ", Image.new("RGB", (20, 40)))),
        Prompt(None, ("hello",)),
    ]
    out = generator.generate_prompts(prompts, max_new_tokens=2)
    assert len(out) == 2


def test_the_original_layout_and_vllm_are_refused(tmp_path):
    source = write_tiny_llava_source(tmp_path / "raw")
    with pytest.raises(ConfigError, match="original LLaVA layout.*qkvqa convert-llava"):
        build_generator({"kind": "reflectiva", "pretrained": str(source), "device": "cpu"}, SETTINGS)
    with pytest.raises(ConfigError, match="vllm"):
        build_generator({"kind": "reflectiva", "tiny": True}, GenerationConfig(backend="vllm"))
    with pytest.raises(ConfigError, match="short_prompt"):
        build_generator(
            {"kind": "reflectiva", "tiny": True, "device": "cpu", "options": {"short_prompt": "yes"}}, SETTINGS
        )
    assert json.loads((source / "config.json").read_text())["model_type"] == "llava_llama"


def test_appendix_prompt_style_gives_the_papers_vlm_prompt(generator):
    from qkvqa.generation.prompts import EVQA_VLM_SYSTEM, answer_prompt

    request = requests()[0]
    chat = generator.chat
    try:
        chat.prompt_style = "appendix"
        prompt = chat.answer_prompt(request, SETTINGS)
    finally:
        chat.prompt_style = "reflectiva"
    assert prompt == answer_prompt(request, "vlm", SETTINGS) and prompt.system == EVQA_VLM_SYSTEM
    assert "<image>" in chat.render(prompt) and not prompt.history
    with pytest.raises(ConfigError, match="prompt_style"):
        build_generator(
            {"kind": "reflectiva", "tiny": True, "device": "cpu", "options": {"prompt_style": "x"}}, SETTINGS
        )
