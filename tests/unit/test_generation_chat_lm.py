"""Kind chat_lm: any causal LM with a chat template, stopping where its template ends a turn (the tiny ChatML model
has SmolLM2's converted tokenizer's mislabelled eos); the real SmolLM2 runs in tests/real/test_real_weights.py."""

from __future__ import annotations

import pytest

from qkvqa.config.schema import GenerationConfig
from qkvqa.errors import ConfigError
from qkvqa.generation.backends import GENERATOR_KINDS, ChatTemplateFormat, build_generator
from qkvqa.generation.prompts import GenerationRequest
from qkvqa.generation.tiny import write_tiny_chatml_lm


@pytest.fixture(scope="module")
def chat_lm():
    return build_generator({"kind": "chat_lm", "tiny": True}, GenerationConfig(batch_size=3, max_new_tokens=6))


def test_stop_tokens_come_from_the_template_and_generation_config_not_the_tokenizers_eos(chat_lm):
    tokenizer = chat_lm.chat.tokenizer
    assert tokenizer.eos_token == "<|im_start|>"  # mislabelled, as SmolLM2's GGUF conversion has it
    assert chat_lm.chat.end_of_turn == "<|im_end|>"
    assert chat_lm.chat.stop_token_ids == [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assert tokenizer.eos_token_id not in chat_lm.chat.stop_token_ids


def test_batched_answers_equal_one_at_a_time_and_the_appendix_prompt_is_rendered(chat_lm):
    requests = [GenerationRequest(f"question {i}?", f"context number {i} " * (i + 1)) for i in range(3)]
    assert chat_lm.generate(requests) == [chat_lm.generate([r])[0] for r in requests]
    text = chat_lm.chat.render(chat_lm.chat.answer_prompt(requests[0], chat_lm.settings))
    assert text.endswith("<|im_start|>assistant\n") and "- Question: question 0? The answer is:" in text
    assert chat_lm.generator_type == "llm"


def test_a_template_without_an_end_of_turn_token_or_none_at_all_is_refused(tmp_path):
    folder = write_tiny_chatml_lm(tmp_path / "lm")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ConfigError, match="writes no special token after an assistant message"):
        ChatTemplateFormat(tokenizer)
    tokenizer.chat_template = None
    with pytest.raises(ConfigError, match="kind chat_lm needs a tokenizer with a chat template"):
        ChatTemplateFormat(tokenizer)


def test_every_generator_kind_is_one_registered_class_and_options_are_checked_per_kind():
    with pytest.raises(ConfigError, match="unknown key\\(s\\) \\['min_pixels'\\] for kind chat_lm"):
        build_generator({"kind": "chat_lm", "tiny": True, "options": {"min_pixels": 4}})
    with pytest.raises(ConfigError, match="is not one of chat_lm, llama3, qwen2_5_vl, reflectiva"):
        build_generator({"kind": "chat", "tiny": True})
    from qkvqa.components.registry import registered_kinds

    assert set(GENERATOR_KINDS) <= set(registered_kinds())
