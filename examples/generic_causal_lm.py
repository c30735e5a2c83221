"""A generic transformers causal LM as qkvqa's generator, from outside the package (docs/extending.md "A generator").

Any checkpoint that `AutoModelForCausalLM` loads and whose tokenizer has a chat template; the paper's LLM prompts go
through that template and generation stops at the tokenizer's eos or at `options.stop_token`. One config line names
it (the module must be importable: run from this repository's root with `PYTHONPATH=.`):

    components.generator={kind: examples.generic_causal_lm:GenericCausalLM, pretrained: HuggingFaceTB/SmolLM2-135M-Instruct}
"""

from __future__ import annotations

from qkvqa.components.plugins import Option
from qkvqa.errors import ConfigError
from qkvqa.generation.backends import GeneratorKind, TextChatFormat


class GenericCausalLM(GeneratorKind):
    """AutoModelForCausalLM with its tokenizer's chat template (the transformers loading is GeneratorKind's)."""

    vllm = False  # only the transformers backend runs it
    options = {
        **GeneratorKind.options,  # seed, attn_implementation, ...: what every generator reads
        "stop_token": Option(str, None, doc="a token that also ends an answer (ChatML's <|im_end|>)"),
        "max_prompt_tokens": Option(int, None, low=16, high=131072, doc="refuse longer prompts"),
    }

    def load_chat(self, spec, path):
        """The tokenizer, its chat template required; `stop_token` added to the tokens that end an answer."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=not spec.allow_download)
        if not tokenizer.chat_template:
            raise ConfigError(f"components.generator.pretrained: {path} has no chat template; use a chat checkpoint")
        stop = spec.options.get("stop_token")
        stop_id = tokenizer.convert_tokens_to_ids(stop) if stop else None
        if stop and stop_id in (None, tokenizer.unk_token_id):
            raise ConfigError(f"components.generator.options.stop_token: {stop!r} is not a token of {path}")
        return _Chat(tokenizer, stop_id, spec.options.get("max_prompt_tokens"))


class _Chat(TextChatFormat):
    """The chat template's text, stopping at eos or the extra stop token; a prompt over the limit is refused."""

    def __init__(self, tokenizer, stop_id, max_prompt_tokens):
        super().__init__(tokenizer)
        self.stop_id, self.max_prompt_tokens = stop_id, max_prompt_tokens

    @property
    def stop_token_ids(self):
        return [*super().stop_token_ids, *([self.stop_id] if self.stop_id is not None else [])]

    def encode(self, texts, images):
        inputs = super().encode(texts, images)
        if self.max_prompt_tokens and inputs["input_ids"].shape[1] > self.max_prompt_tokens:
            raise ConfigError(
                f"components.generator.options.max_prompt_tokens={self.max_prompt_tokens}: a prompt has "
                f"{inputs['input_ids'].shape[1]} tokens; raise it, or lower cda.chunk_tokens, cda.K1 or cda.K2"
            )
        return inputs
