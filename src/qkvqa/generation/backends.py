"""Generator backends (kinds `llama3`, `qwen2_5_vl`): chat formatting, batched greedy transformers generation, token counting."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Optional, Sequence

from qkvqa.components.registry import ComponentSpec, register_component, resolve_pretrained, tiny_model
from qkvqa.errors import ConfigError
from qkvqa.generation.prompts import GenerationRequest, Prompt, answer_prompt
from qkvqa.generation.tiny import LLAMA3_CHAT_TEMPLATE, write_tiny_llama3, write_tiny_qwen2_5_vl
from qkvqa.utils.logging import get_logger

if TYPE_CHECKING:
    from qkvqa.config.schema import GenerationConfig

log = get_logger(__name__)
BACKENDS = ("hf", "vllm")
OPTION_KEYS = {
    "seed",                       # tiny: the random init seed
    "attn_implementation",        # transformers attention (default sdpa)
    "min_pixels", "max_pixels",   # Qwen2.5-VL image processor limits (default: the checkpoint's)
    "python", "engine_args", "work_dir",   # vLLM backend (qkvqa.generation.vllm_client)
}


class ChatFormat(ABC):
    """The tokenizer side of a generator: chat rendering, batch encoding (left padding) and token counting."""

    generator_type: str           # llm | vlm

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(f"generator tokenizer {type(tokenizer).__name__} is not a fast (tokenizers) tokenizer; "
                              "token counting and truncation need its offsets")
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end generation."""
        return [self.tokenizer.eos_token_id]

    def count_tokens(self, text: str) -> int:
        """Number of tokens of `text` without special tokens."""
        return len(self._backend.encode(text, add_special_tokens=False))

    def truncate_to_tokens(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` (cut at a token boundary) with at most `max_tokens` tokens."""
        encoding = self._backend.encode(text, add_special_tokens=False)
        keep = min(max_tokens, len(encoding.ids))
        while keep > 0:
            prefix = text[:encoding.offsets[keep - 1][1]]
            if self.count_tokens(prefix) <= max_tokens:
                return prefix
            keep -= 1
        return ""

    def token_ids(self, text: str) -> list[int]:
        """Ids of an already rendered chat text (its special tokens are in the text itself)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    @abstractmethod
    def render(self, prompt: Prompt) -> str:
        """The chat text of a prompt, ending with the assistant turn's opening."""

    @abstractmethod
    def encode(self, texts: Sequence[str], images: Sequence[Sequence[Any]]):
        """Model inputs for rendered texts and their images, left-padded, as a BatchEncoding of tensors."""


class Llama3Format(ChatFormat):
    """Llama 3 chat: system and user messages as plain strings; images are never shown.

    A tokenizer without a chat template (a base or fine-tuned checkpoint that ships none) gets the
    Llama 3 format (`LLAMA3_CHAT_TEMPLATE`).
    """

    generator_type = "llm"

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        if not tokenizer.chat_template:
            log.info("generator tokenizer has no chat template; using the Llama 3 format")
            tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE

    @property
    def stop_token_ids(self) -> list[int]:
        """eos and `<|eot_id|>`, as the Llama 3 model card prescribes."""
        eot = self.tokenizer.convert_tokens_to_ids("<|eot_id|>")
        ids = [self.tokenizer.eos_token_id] + ([eot] if eot != self.tokenizer.unk_token_id and eot is not None else [])
        return list(dict.fromkeys(ids))

    def render(self, prompt: Prompt) -> str:
        """The prompt through the tokenizer's chat template."""
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else [])
        messages.append({"role": "user", "content": prompt.user_text()})
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, texts, images):
        """Tokenise rendered texts (the template already holds the bos token)."""
        return self.tokenizer(list(texts), add_special_tokens=False, padding=True, return_token_type_ids=False,
                              return_tensors="pt")


class QwenVLFormat(ChatFormat):
    """Qwen2.5-VL chat through its processor: the user message interleaves text parts and images."""

    generator_type = "vlm"

    def __init__(self, processor):
        super().__init__(processor.tokenizer)
        self.processor = processor

    def render(self, prompt: Prompt) -> str:
        """The prompt through the processor's chat template (one vision placeholder per image)."""
        content = [{"type": "text", "text": part} if isinstance(part, str) else {"type": "image"}
                   for part in prompt.parts]
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else [])
        messages.append({"role": "user", "content": content})
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, texts, images):
        """Processor inputs: the texts with their images (flattened in order), left-padded."""
        flat = [image.convert("RGB") for per_text in images for image in per_text]
        return self.processor(text=list(texts), images=flat or None, padding=True, return_tensors="pt")


class HFRunner:
    """Greedy batched `generate` with transformers; decodes only the new tokens."""

    def __init__(self, model, chat: ChatFormat, device):
        self.model = model.eval().to(device)
        self.chat = chat
        self.device = device

    def run(self, texts: Sequence[str], images: Sequence[Sequence[Any]], max_new_tokens: int,
            batch_size: int) -> list[str]:
        """Answers for rendered chat texts, generated `batch_size` at a time."""
        import torch
        from transformers import GenerationConfig as HFGenerationConfig

        config = HFGenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                    eos_token_id=self.chat.stop_token_ids,
                                    pad_token_id=self.chat.tokenizer.pad_token_id,
                                    bos_token_id=self.model.generation_config.bos_token_id)
        answers: list[str] = []
        for start in range(0, len(texts), batch_size):
            inputs = self.chat.encode(texts[start:start + batch_size], images[start:start + batch_size])
            inputs = inputs.to(self.device)
            with torch.inference_mode():
                output = self.model.generate(**inputs, generation_config=config)
            new_tokens = output[:, inputs["input_ids"].shape[1]:]
            answers.extend(text.strip() for text in
                           self.chat.tokenizer.batch_decode(new_tokens, skip_special_tokens=True))
        return answers


class Generator:
    """What the pipeline calls: answer generation, raw prompt generation and generator-token counting.

    - `generate(batch: list[GenerationRequest]) -> list[str]`: the appendix prompt (or configured
      template) per request, greedy decoding, `generation.max_new_tokens`;
    - `generate_prompts(prompts, max_new_tokens=None) -> list[str]`: any prepared prompts (MLLM
      filtering, summaries);
    - `count_tokens(text) -> int` (no special tokens) and `truncate_to_tokens(text, n) -> str`;
    - `generator_type`: llm | vlm.
    """

    def __init__(self, chat: ChatFormat, runner, settings: "GenerationConfig"):
        self.chat = chat
        self.runner = runner
        self.settings = settings

    @property
    def generator_type(self) -> str:
        """llm (text only) or vlm (reads the image)."""
        return self.chat.generator_type

    def count_tokens(self, text: str) -> int:
        """Generator tokens of `text`, without special tokens (the CDA chunk length)."""
        return self.chat.count_tokens(text)

    def truncate_to_tokens(self, text: str, max_tokens: int) -> str:
        """The longest token-boundary prefix of `text` with at most `max_tokens` generator tokens."""
        return self.chat.truncate_to_tokens(text, max_tokens)

    def generate(self, batch: Sequence[GenerationRequest]) -> list[str]:
        """One answer per request, in order."""
        return self.generate_prompts([answer_prompt(r, self.generator_type, self.settings) for r in batch])

    def generate_prompts(self, prompts: Sequence[Prompt], max_new_tokens: Optional[int] = None) -> list[str]:
        """One output per prompt, in order (images dropped for an LLM)."""
        if not prompts:
            return []
        texts = [self.chat.render(p) for p in prompts]
        images = [p.images if self.generator_type == "vlm" else [] for p in prompts]
        return self.runner.run(texts, images, max_new_tokens or self.settings.max_new_tokens,
                               self.settings.batch_size)


# Kind -> writer of its tiny random checkpoint.
WRITERS = {"llama3": write_tiny_llama3, "qwen2_5_vl": write_tiny_qwen2_5_vl}


def _check_options(spec: ComponentSpec) -> None:
    unknown = set(spec.options) - OPTION_KEYS
    if unknown:
        raise ConfigError(f"components.generator.options: unknown key(s) {sorted(unknown)}; valid: {sorted(OPTION_KEYS)}")


def _model_path(spec: ComponentSpec, write_tiny) -> str:
    if spec.tiny:
        return str(tiny_model(spec, write_tiny, seed=int(spec.options.get("seed", 0))))
    return resolve_pretrained(spec)


def _load_chat(spec: ComponentSpec, path: str) -> ChatFormat:
    local_only = spec.tiny or not spec.allow_download
    if spec.kind == "llama3":
        from transformers import AutoTokenizer

        return Llama3Format(AutoTokenizer.from_pretrained(path, local_files_only=local_only))
    from transformers import AutoProcessor

    pixels = {k: int(spec.options[k]) for k in ("min_pixels", "max_pixels") if k in spec.options}
    return QwenVLFormat(AutoProcessor.from_pretrained(path, local_files_only=local_only, use_fast=True, **pixels))


def _load_model(spec: ComponentSpec, path: str):
    local_only = spec.tiny or not spec.allow_download
    kwargs = dict(dtype=spec.torch_dtype(), local_files_only=local_only,
                  attn_implementation=spec.options.get("attn_implementation", "sdpa"))
    if spec.kind == "llama3":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(path, **kwargs)
    from transformers import Qwen2_5_VLForConditionalGeneration

    return Qwen2_5_VLForConditionalGeneration.from_pretrained(path, **kwargs)


def build_generator(spec: ComponentSpec | dict, generation: Optional["GenerationConfig"] = None) -> Generator:
    """The generator of `components.generator` with the `generation:` settings (backend hf or vllm)."""
    from qkvqa.components.registry import spec_from_mapping
    from qkvqa.config.schema import GenerationConfig

    if not isinstance(spec, ComponentSpec):
        spec = spec_from_mapping(spec)
    settings = generation if generation is not None else GenerationConfig()
    if spec.kind not in WRITERS:
        raise ConfigError(f"components.generator.kind: {spec.kind!r} is not one of {', '.join(sorted(WRITERS))}")
    if not spec.tiny and not spec.pretrained:
        raise ConfigError("components.generator: set `pretrained: <local dir or hub id>` or `tiny: true`")
    if settings.backend not in BACKENDS:
        raise ConfigError(f"generation.backend: {settings.backend!r} is not one of {', '.join(BACKENDS)}")
    _check_options(spec)
    path = _model_path(spec, WRITERS[spec.kind])
    chat = _load_chat(spec, path)
    if settings.backend == "vllm":
        from qkvqa.generation.vllm_client import VLLMRunner

        return Generator(chat, VLLMRunner.from_spec(spec, path, chat), settings)
    return Generator(chat, HFRunner(_load_model(spec, path), chat, spec.torch_device()), settings)


@register_component("llama3")
def build_llama3(spec: ComponentSpec) -> Generator:
    """Llama-3(.1)-8B(-Instruct) with transformers and the default `generation:` settings (see build_generator)."""
    return build_generator(spec)


@register_component("qwen2_5_vl")
def build_qwen2_5_vl(spec: ComponentSpec) -> Generator:
    """Qwen2.5-VL-7B-Instruct with transformers and the default `generation:` settings (see build_generator)."""
    return build_generator(spec)
