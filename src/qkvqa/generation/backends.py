"""Generator backends (kinds `llama3`, `chat_lm`, `qwen2_5_vl`, `reflectiva`, each one class): chat formatting, batched greedy generation, token counting."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Optional, Sequence

from qkvqa.components.hub import check_head
from qkvqa.components.plugins import Option
from qkvqa.components.registry import (
    ComponentKind,
    ComponentSpec,
    component_kind,
    register_kind,
    resolve_pretrained,
    tiny_model,
)
from qkvqa.errors import ConfigError
from qkvqa.generation.llava_convert import RECORD, read_record
from qkvqa.generation.prompts import GenerationRequest, Prompt, answer_prompt, reflectiva_prompt
from qkvqa.generation.tiny import LLAMA3_CHAT_TEMPLATE, write_tiny_chatml_lm, write_tiny_llama3, write_tiny_qwen2_5_vl
from qkvqa.generation.tiny_llava import write_tiny_reflectiva
from qkvqa.utils.logging import get_logger

if TYPE_CHECKING:
    from qkvqa.config.schema import GenerationConfig

log = get_logger(__name__)
BACKENDS = ("hf", "vllm")
PROMPT_STYLES = ("reflectiva", "appendix")
# heads of a model that generates text (an encoder, a classifier or a bare LlamaModel would answer noise)
CAUSAL_LM_HEADS = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


class ChatFormat(ABC):
    """The tokenizer side of a generator: chat rendering, batch encoding (left padding) and token counting."""

    generator_type: str  # llm | vlm

    def __init__(self, tokenizer):
        if not getattr(tokenizer, "is_fast", False):
            raise ConfigError(
                f"generator tokenizer {type(tokenizer).__name__} is not a fast (tokenizers) tokenizer; "
                "token counting and truncation need its offsets"
            )
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.tokenizer = tokenizer
        self._backend = tokenizer.backend_tokenizer

    @property
    def stop_token_ids(self) -> list[int]:
        """Token ids that end generation."""
        return [self.tokenizer.eos_token_id]

    @property
    def suppress_token_ids(self) -> list[int]:
        """Token ids generation never produces (none but a placeholder the model's vocabulary gained)."""
        return []

    def answer_prompt(self, request: GenerationRequest, settings: "GenerationConfig") -> Prompt:
        """The answer prompt of a request: the appendix prompt for its dataset and generator type, or the template."""
        return answer_prompt(request, self.generator_type, settings)

    def messages(self, prompt: Prompt, content) -> list[dict]:
        """Chat messages of a prompt: system, earlier turns, the user message; `content(parts)` renders each turn."""
        messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
        messages.extend({"role": role, "content": content(parts)} for role, parts in prompt.history)
        messages.append({"role": "user", "content": content(prompt.parts)})
        return messages

    def count_tokens(self, text: str) -> int:
        """Number of tokens of `text` without special tokens."""
        return len(self._backend.encode(text, add_special_tokens=False))

    def truncate_to_tokens(self, text: str, max_tokens: int) -> str:
        """The longest prefix of `text` (cut at a token boundary) with at most `max_tokens` tokens."""
        encoding = self._backend.encode(text, add_special_tokens=False)
        keep = min(max_tokens, len(encoding.ids))
        while keep > 0:
            prefix = text[: encoding.offsets[keep - 1][1]]
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


LLAMA3_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")


def _single_token(tokenizer, token: str) -> bool:
    """Whether `token` is one token of `tokenizer` (a special token it knows), not split into pieces of text."""
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    return len(ids) == 1 and ids[0] != tokenizer.unk_token_id


class TextChatFormat(ChatFormat):
    """A text-only LLM's chat: messages as plain strings through the tokenizer's chat template; images never shown."""

    generator_type = "llm"

    def render(self, prompt: Prompt) -> str:
        """The prompt through the tokenizer's chat template."""
        messages = self.messages(prompt, lambda parts: "".join(p for p in parts if isinstance(p, str)))
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, texts, images):
        """Tokenise rendered texts (the template already holds whatever special tokens it wants, bos included)."""
        return self.tokenizer(
            list(texts), add_special_tokens=False, padding=True, return_token_type_ids=False, return_tensors="pt"
        )


class Llama3Format(TextChatFormat):
    """Llama 3 chat: system and user messages as plain strings; images are never shown.

    A tokenizer without a chat template (a base or fine-tuned checkpoint that ships none) gets the
    Llama 3 format (`LLAMA3_CHAT_TEMPLATE`).
    """

    def __init__(self, tokenizer):
        super().__init__(tokenizer)
        if not tokenizer.chat_template:
            missing = [t for t in LLAMA3_SPECIAL_TOKENS if not _single_token(tokenizer, t)]
            if missing:  # the markers would be plain text: 193 prompt tokens against 73 (issue 44)
                raise ConfigError(
                    f"components.generator: kind llama3, but its tokenizer ({tokenizer.name_or_path}) has no chat "
                    f"template and lacks Llama 3's special tokens {missing}, so the Llama 3 chat markers would be "
                    "tokenized as plain text; point pretrained at a Llama 3 checkpoint, or use kind chat_lm for a "
                    "model with a chat template of its own"
                )
            log.info("generator tokenizer has no chat template; using the Llama 3 format")
            tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE

    @property
    def stop_token_ids(self) -> list[int]:
        """eos and `<|eot_id|>`, as the Llama 3 model card prescribes."""
        eot = self.tokenizer.convert_tokens_to_ids("<|eot_id|>")
        ids = [self.tokenizer.eos_token_id] + ([eot] if eot != self.tokenizer.unk_token_id and eot is not None else [])
        return list(dict.fromkeys(ids))


def no_chat_template(where: Any, role: str = "generator") -> str:
    """The refusal of a Qwen2.5-VL folder without a chat template."""
    return (
        f"components.{role}: kind qwen2_5_vl, but {where} has no chat template (chat_template.json or "
        "chat_template in tokenizer_config.json); copy Qwen2.5-VL-7B-Instruct's chat_template.json into it"
    )


class QwenVLFormat(ChatFormat):
    """Qwen2.5-VL chat through its processor: the user message interleaves text parts and images."""

    generator_type = "vlm"

    def __init__(self, processor):
        super().__init__(processor.tokenizer)
        self.processor = processor
        if not (getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None)):
            # a traceback at the first prompt, after stage 1 and the filter had run (issue 44)
            raise ConfigError(no_chat_template(getattr(processor.tokenizer, "name_or_path", "") or "its folder"))

    def render(self, prompt: Prompt) -> str:
        """The prompt through the processor's chat template (one vision placeholder per image)."""
        messages = self.messages(
            prompt,
            lambda parts: [
                {"type": "text", "text": part} if isinstance(part, str) else {"type": "image"} for part in parts
            ],
        )
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, texts, images):
        """Processor inputs: the texts with their images (flattened in order), left-padded."""
        flat = [image.convert("RGB") for per_text in images for image in per_text]
        return self.processor(text=list(texts), images=flat or None, padding=True, return_tensors="pt")


class LlavaFormat(ChatFormat):
    """ReflectiVA's generator as `qkvqa convert-llava` writes it: conversation `llama_3_1` through the checkpoint's own
    chat template, the image as `<image>` in the text (expanded by the processor to one token per image feature).

    ReflectiVA renders its conversation with `add_generation_prompt=False` after an empty assistant turn
    (llava/conversation.py, SeparatorStyle.LLAMA_3_1) and reads the first generated token as its reflective token
    (release_retrieval.py: `128251 == output_ids[0][0]`), so its prompt ends where the assistant answers: when the
    template leaves the assistant's opening out, it is added (the text the template gives with
    `add_generation_prompt=True`). Prompts are tokenised without an added bos, as `tokenizer_image_token(...)[1:]`
    leaves one bos, the template's.
    """

    generator_type = "vlm"
    TEXT_IMAGE_TOKEN = "< image>"  # a literal "<image>" in a passage would be read as the image placeholder

    def __init__(
        self,
        processor,
        record: dict,
        eos_ids: Sequence[int] = (),
        short_prompt: bool = True,
        prompt_style: str = "reflectiva",
    ):
        super().__init__(processor.tokenizer)
        self.processor = processor
        self.record = record
        self.image_token = processor.image_token
        self.image_token_id = processor.image_token_id
        self.short_prompt = short_prompt
        self.prompt_style = prompt_style
        self.max_length = (record.get("llava") or {}).get("tokenizer_model_max_length")
        self._eos_ids = list(eos_ids)
        self.over_length = 0  # prompts longer than LLaVA's tokenizer_model_max_length (it cuts them)
        self.text_image_tokens = 0  # literal "<image>" strings replaced in passages
        probe = [{"role": "user", "content": "x"}]
        plain = self.tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
        # whether the template leaves the assistant's opening out (it is then added to every prompt): for the card
        self.opening_added = self.render(Prompt(None, ("x",))) != plain

    @property
    def stop_token_ids(self) -> list[int]:
        """The checkpoint's generation_config eos ids, eos and `<|eot_id|>` (conv llama_3_1's stop_token_ids)."""
        eot = self.tokenizer.convert_tokens_to_ids("<|eot_id|>")
        ids = self._eos_ids + [self.tokenizer.eos_token_id]
        ids += [eot] if eot not in (None, self.tokenizer.unk_token_id) else []
        return list(dict.fromkeys(i for i in ids if i is not None))

    @property
    def suppress_token_ids(self) -> list[int]:
        """`<image>`: the converter's placeholder, which the original model could never generate."""
        return [self.image_token_id]

    def answer_prompt(self, request: GenerationRequest, settings: "GenerationConfig") -> Prompt:
        """ReflectiVA's own conversation with `generation.prompt: auto` (unless options.prompt_style is appendix: the
        paper's VLM prompt); the configured template otherwise."""
        if settings.prompt == "auto" and self.prompt_style == "reflectiva":
            return reflectiva_prompt(request, short=self.short_prompt)
        return answer_prompt(request, self.generator_type, settings)

    def _content(self, parts) -> str:
        out = []
        for part in parts:
            if isinstance(part, str):
                if self.image_token in part:
                    self.text_image_tokens += part.count(self.image_token)
                    log.warning(
                        "a prompt text holds %r; written as %r so that it is not read as an image",
                        self.image_token,
                        self.TEXT_IMAGE_TOKEN,
                    )
                    part = part.replace(self.image_token, self.TEXT_IMAGE_TOKEN)
                out.append(part)
            else:
                out.append(self.image_token)
        return "".join(out)

    def render(self, prompt: Prompt) -> str:
        """The conversation through the checkpoint's chat template, ending with the assistant's opening."""
        messages = self.messages(prompt, self._content)
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        opened = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if opened.startswith(text) and not text.endswith(opened[len(text) :]):
            text = opened
        return text

    def encode(self, texts, images):
        """Processor inputs (no added bos: the template holds it), left-padded; images flattened in order."""
        flat = [image.convert("RGB") for per_text in images for image in per_text]
        inputs = self.processor(
            text=list(texts),
            images=flat or None,
            padding=True,
            add_special_tokens=False,
            return_token_type_ids=False,
            return_tensors="pt",
        )
        if self.max_length:
            over = int((inputs["attention_mask"].sum(1) > int(self.max_length)).sum())
            if over:
                self.over_length += over
                log.warning(
                    "%d prompt(s) longer than the checkpoint's tokenizer_model_max_length (%s tokens, images "
                    "included), which LLaVA's prepare_inputs_labels_for_multimodal cuts from the end; "
                    "generated in full",
                    over,
                    self.max_length,
                )
        return inputs


class HFRunner:
    """Greedy batched `generate` with transformers; decodes only the new tokens."""

    def __init__(self, model, chat: ChatFormat, device):
        self.model = model.eval().to(device)
        self.chat = chat
        self.device = device

    def run(
        self, texts: Sequence[str], images: Sequence[Sequence[Any]], max_new_tokens: int, batch_size: int
    ) -> list[str]:
        """Answers for rendered chat texts, generated `batch_size` at a time."""
        import torch
        from transformers import GenerationConfig as HFGenerationConfig

        config = HFGenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=self.chat.stop_token_ids,
            suppress_tokens=self.chat.suppress_token_ids or None,
            pad_token_id=self.chat.tokenizer.pad_token_id,
            bos_token_id=self.model.generation_config.bos_token_id,
        )
        answers: list[str] = []
        for start in range(0, len(texts), batch_size):
            inputs = self.chat.encode(texts[start : start + batch_size], images[start : start + batch_size])
            inputs = inputs.to(self.device)
            with torch.inference_mode():
                output = self.model.generate(**inputs, generation_config=config)
            new_tokens = output[:, inputs["input_ids"].shape[1] :]
            answers.extend(
                text.strip() for text in self.chat.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
            )
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

    @property
    def conversion(self) -> Optional[dict]:
        """The `qkvqa convert-llava` record of a converted checkpoint (source fingerprint, converter version)."""
        return getattr(self.chat, "record", None)

    def count_tokens(self, text: str) -> int:
        """Generator tokens of `text`, without special tokens (the CDA chunk length)."""
        return self.chat.count_tokens(text)

    def truncate_to_tokens(self, text: str, max_tokens: int) -> str:
        """The longest token-boundary prefix of `text` with at most `max_tokens` generator tokens."""
        return self.chat.truncate_to_tokens(text, max_tokens)

    def generate(self, batch: Sequence[GenerationRequest]) -> list[str]:
        """One answer per request, in order."""
        return self.generate_prompts([self.chat.answer_prompt(r, self.settings) for r in batch])

    def generate_prompts(self, prompts: Sequence[Prompt], max_new_tokens: Optional[int] = None) -> list[str]:
        """One output per prompt, in order (images dropped for an LLM)."""
        if not prompts:
            return []
        texts = [self.chat.render(p) for p in prompts]
        images = [p.images if self.generator_type == "vlm" else [] for p in prompts]
        return self.runner.run(texts, images, max_new_tokens or self.settings.max_new_tokens, self.settings.batch_size)


class ChatTemplateFormat(TextChatFormat):
    """Any causal LM with a chat template of its own (kind `chat_lm`): messages as plain strings, images never shown.

    Generation stops on the template's end-of-turn token (the special token the template writes right after an
    assistant message) and on `generation_config.json`'s eos ids, never on the tokenizer's `eos_token` alone: a
    tokenizer may mislabel it (SmolLM2's, as transformers converts it from GGUF, says `<|im_start|>`, the token that
    opens a turn, while its generation_config says `<|im_end|>`).
    """

    PROBE = "qkvqa-end-of-turn-probe"

    def __init__(self, tokenizer, generation_eos: Sequence[int] = (), where: str = "components.generator"):
        if not tokenizer.chat_template:
            raise ConfigError(
                f"{where}: kind chat_lm needs a tokenizer with a chat template and this one has none; use a chat "
                "(instruct) checkpoint, or add its chat_template.jinja beside tokenizer_config.json"
            )
        super().__init__(tokenizer)
        self.end_of_turn = end_of_turn_token(tokenizer, self.PROBE, where)
        eot_id = tokenizer.convert_tokens_to_ids(self.end_of_turn)
        self._stop = list(dict.fromkeys([eot_id, *generation_eos]))
        if tokenizer.eos_token_id not in self._stop:
            log.info(
                "generator tokenizer's eos_token %r is not where a turn ends; generation stops on %s (the chat "
                "template's end of turn and generation_config's eos)",
                tokenizer.eos_token,
                tokenizer.convert_ids_to_tokens(self._stop),
            )

    @property
    def stop_token_ids(self) -> list[int]:
        """The chat template's end-of-turn token, then generation_config's eos ids."""
        return list(self._stop)


def end_of_turn_token(tokenizer, probe: str, where: str) -> str:
    """The special token a chat template writes right after an assistant message's text (ChatML's `<|im_end|>`,
    Llama 3's `<|eot_id|>`), found by rendering a probe conversation; ConfigError when it writes none."""
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": probe}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    after = text[text.rindex(probe) + len(probe) :] if probe in text else ""
    specials = set(tokenizer.all_special_tokens) | {
        t.content for t in tokenizer.added_tokens_decoder.values() if getattr(t, "special", False)
    }
    for token in tokenizer.convert_ids_to_tokens(tokenizer(after, add_special_tokens=False)["input_ids"]):
        if token in specials:
            return token
        if token.strip("\u0120\u010a\u2581 \n"):  # text before any special token: the turn has no end token
            break
    raise ConfigError(
        f"{where}: the tokenizer's chat template writes no special token after an assistant message "
        f"({after[:40]!r}), so qkvqa cannot tell where an answer ends; use a chat checkpoint whose template ends "
        "each turn with one (ChatML's <|im_end|>, Llama 3's <|eot_id|>)"
    )


def generation_config_eos(path: str) -> list[int]:
    """The eos ids of a checkpoint's generation_config.json (none without one)."""
    import os

    from transformers import GenerationConfig as HFGenerationConfig

    if not os.path.exists(os.path.join(path, "generation_config.json")):
        return []
    eos_id = HFGenerationConfig.from_pretrained(path, local_files_only=True).eos_token_id
    return list(eos_id) if isinstance(eos_id, (list, tuple)) else ([eos_id] if eos_id is not None else [])


class GeneratorKind(ComponentKind):
    """The generator extension point: how a kind's checkpoint is checked and loaded (`load_chat`, `load_model`).

    `build_generator` asks only this class. A shipped kind is a subclass registered with `register_kind`; a user's is
    a subclass in their own code named by import path (`components.generator.kind: my_lab.gen:MyLM`, docs/extending.md).
    `tiny_writer` is the writer of `tiny: true` (None: the kind runs real weights only; a test writes its own model).
    """

    point = "generator"
    tiny_writer: Any = None
    model_class: str = "AutoModelForCausalLM"  # transformers class that loads the weights
    options = {
        "seed": Option(int, 0, low=0, doc="seed of the tiny random model"),
        "attn_implementation": Option(str, "sdpa", doc="transformers' attention implementation"),
        "python": Option(str, None, doc="the vLLM worker's interpreter (backend vllm)"),
        "engine_args": Option(dict, None, doc="vLLM engine arguments (backend vllm)"),
        "work_dir": Option(str, None, doc="the vLLM worker's folder (backend vllm)"),
    }
    vllm: bool = True  # whether the vLLM backend runs it

    def check_options(self, spec: ComponentSpec, where: str = "components.generator.options") -> None:
        """Refuse an option this kind does not declare, or a value of the wrong type or out of bounds."""
        super().check_options(spec, where)

    def build(self, spec: ComponentSpec) -> "Generator":
        """The generator with the default `generation:` settings (build_generator)."""
        return build_generator(spec)

    def preflight(self, role, spec, folder):
        """Its options, and `tiny: true` only for a kind with a tiny writer, before stage 1."""
        super().preflight(role, spec, folder)
        self._check_tiny(spec)

    def _check_tiny(self, spec: ComponentSpec) -> None:
        if spec.tiny and self.tiny_writer is None:
            raise ConfigError(
                f"components.generator: kind {self.name} has no tiny model; set pretrained: (a checkpoint folder or "
                "hub id) and tiny: false"
            )

    def model_path(self, spec: ComponentSpec) -> str:
        """The checkpoint folder (or hub id) to load: the tiny one, or `pretrained` resolved and checked."""
        if spec.tiny:
            self._check_tiny(spec)
            return str(tiny_model(spec, self.tiny_writer, seed=int(spec.options.get("seed", 0))))
        path = resolve_pretrained(spec)
        if os.path.isdir(path):
            check_head(path, "components.generator", CAUSAL_LM_HEADS)
        return path

    def load_chat(self, spec: ComponentSpec, path: str) -> ChatFormat:
        """The tokenizer side (each kind its own: there is no default)."""
        raise NotImplementedError(f"generator kind {self.name!r} does not define load_chat")

    def load_model(self, spec: ComponentSpec, path: str):
        """The weights, with the spec's dtype and attention implementation."""
        import transformers

        return getattr(transformers, self.model_class).from_pretrained(
            path,
            dtype=spec.torch_dtype(),
            local_files_only=spec.tiny or not spec.allow_download,
            attn_implementation=spec.options.get("attn_implementation", "sdpa"),
        )


class Llama3Kind(GeneratorKind):
    """Llama-3(.1)-8B(-Instruct); a tokenizer without a chat template gets the Llama 3 format."""

    name = "llama3"
    tiny_writer = staticmethod(write_tiny_llama3)

    def load_chat(self, spec, path):
        from transformers import AutoTokenizer

        return Llama3Format(AutoTokenizer.from_pretrained(path, local_files_only=spec.tiny or not spec.allow_download))


class ChatLMKind(GeneratorKind):
    """Any transformers causal LM with a chat template of its own (SmolLM2-135M-Instruct, Qwen2.5-Instruct, ...):
    the paper's LLM prompts (appendix 6.1 / 6.3) through its template, stopping where its template ends a turn."""

    name = "chat_lm"
    tiny_writer = staticmethod(write_tiny_chatml_lm)

    def load_chat(self, spec, path):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=spec.tiny or not spec.allow_download)
        return ChatTemplateFormat(tokenizer, generation_config_eos(path))


class QwenVLKind(GeneratorKind):
    """Qwen2.5-VL-7B-Instruct through its processor (min_pixels / max_pixels: the image processor's limits)."""

    name = "qwen2_5_vl"
    tiny_writer = staticmethod(write_tiny_qwen2_5_vl)
    model_class = "Qwen2_5_VLForConditionalGeneration"
    options = {
        **GeneratorKind.options,
        "min_pixels": Option(int, None, low=1, doc="the image processor's smallest image, in pixels"),
        "max_pixels": Option(int, None, low=1, doc="the image processor's largest image, in pixels"),
    }

    def preflight(self, role, spec, folder):
        """A local folder without a chat template is refused before stage 1 (QwenVLFormat would refuse it at load)."""
        import json

        super().preflight(role, spec, folder)
        if folder is None:
            return

        def has_template(name: str) -> bool:
            try:
                return bool(json.loads((folder / name).read_text(encoding="utf-8")).get("chat_template"))
            except (OSError, ValueError, AttributeError):
                return False

        files = ("chat_template.json", "chat_template.jinja")
        if not any((folder / f).is_file() for f in files) and not any(
            has_template(n) for n in ("tokenizer_config.json", "processor_config.json")
        ):
            raise ConfigError(no_chat_template(folder, role))

    def doctor_tokenizer_ref(self, spec, directory):
        """None when the folder holds its tokenizer.json (its processor reads it from there)."""
        return None if (directory / "tokenizer.json").is_file() else super().doctor_tokenizer_ref(spec, directory)

    def load_chat(self, spec, path):
        from transformers import AutoProcessor

        pixels = {k: int(spec.options[k]) for k in ("min_pixels", "max_pixels") if k in spec.options}
        local_only = spec.tiny or not spec.allow_download
        return QwenVLFormat(AutoProcessor.from_pretrained(path, local_files_only=local_only, use_fast=True, **pixels))


class ReflectivaKind(GeneratorKind):
    """ReflectiVA's LLaVA generator, from a folder `qkvqa convert-llava` wrote (transformers' Llava layout).

    Options: short_prompt (end the passages with ". Give a short answer.", default true, as ReflectiVA's release
    scripts run with --short_prompt); prompt_style (with generation.prompt auto: reflectiva, its conversation, the
    default; appendix, the paper's VLM prompt, appendix 6.2 / 6.4). The vLLM backend does not run it (its worker
    renders no LLaVA image placeholders).
    """

    name = "reflectiva"
    tiny_writer = staticmethod(write_tiny_reflectiva)
    model_class = "LlavaForConditionalGeneration"
    options = {
        **GeneratorKind.options,
        "short_prompt": Option(bool, True, doc='end the passages with ". Give a short answer."'),
        "prompt_style": Option(str, "reflectiva", choices=PROMPT_STYLES, doc="with generation.prompt auto"),
    }
    vllm = False
    readings = ("decoding",)  # ReflectiVA's decoding: the card names the reading

    def weights_hint(self, ref):
        return f"Kind reflectiva loads what `qkvqa convert-llava SRC --vision-tower DIR --out {ref}` writes."

    def model_path(self, spec):
        path = super().model_path(spec)
        if not spec.tiny:
            _check_converted(path)
        return path

    def load_chat(self, spec, path):
        import json
        import os

        from transformers import AutoTokenizer, LlavaImageProcessor, LlavaProcessor

        # The slow LlavaImageProcessor: its PIL resize is the one CLIPImageProcessor ran in ReflectiVA's process_images
        # (the fast one resizes with torch, other pixels); do_pad is expand2square.
        with open(os.path.join(path, "processor_config.json"), encoding="utf-8") as handle:
            settings = {k: v for k, v in json.load(handle).items() if k != "processor_class"}
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, use_fast=True)
        processor = LlavaProcessor(
            image_processor=LlavaImageProcessor.from_pretrained(path, local_files_only=True),
            tokenizer=tokenizer,
            chat_template=tokenizer.chat_template,
            **settings,
        )
        short = spec.options.get("short_prompt", True)
        if not isinstance(short, bool):
            raise ConfigError(f"components.generator.options.short_prompt: expected true or false, got {short!r}")
        style = spec.options.get("prompt_style", "reflectiva")
        if style not in PROMPT_STYLES:
            raise ConfigError(
                f"components.generator.options.prompt_style: {style!r} is not one of {', '.join(PROMPT_STYLES)}"
            )
        eos = generation_config_eos(path)
        return LlavaFormat(processor, read_record(path) or {}, eos, short_prompt=short, prompt_style=style)


# the shipped kinds (registered below); a user's kind is named by import path instead
GENERATOR_KINDS: dict[str, GeneratorKind] = {
    k.name: k for k in (Llama3Kind(), ChatLMKind(), QwenVLKind(), ReflectivaKind())
}


def _check_converted(path: str) -> None:
    """Refuse anything but a directory written by `qkvqa convert-llava` for kind reflectiva."""
    import json
    import os

    fix = (
        "convert ReflectiVA's checkpoint first: `qkvqa convert-llava weights/aimagelab/ReflectiVA --vision-tower "
        "weights/openai/clip-vit-large-patch14-336 --out weights/reflectiva-llava-hf` (docs/generation.md)"
    )
    if not os.path.isdir(path):
        raise ConfigError(
            f"components.generator.pretrained: kind reflectiva loads a local directory written by "
            f"`qkvqa convert-llava`, not the hub id {path!r}; {fix}"
        )
    if not os.path.exists(os.path.join(path, RECORD)):
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as handle:
                model_type = json.load(handle).get("model_type")
        except (OSError, ValueError):
            model_type = None
        what = (
            "is the original LLaVA layout (model_type llava_llama), which transformers cannot load"
            if model_type == "llava_llama"
            else f"has no {RECORD} (it was not written by `qkvqa convert-llava`)"
        )
        raise ConfigError(f"components.generator.pretrained: {path} {what}; {fix}")


def build_generator(spec: ComponentSpec | dict, generation: Optional["GenerationConfig"] = None) -> Generator:
    """The generator of `components.generator` with the `generation:` settings (backend hf or vllm)."""
    from qkvqa.components.registry import spec_from_mapping
    from qkvqa.config.schema import GenerationConfig

    if not isinstance(spec, ComponentSpec):
        spec = spec_from_mapping(spec)
    settings = generation if generation is not None else GenerationConfig()
    try:
        kind = component_kind(spec.kind, "generator", GeneratorKind)
    except ConfigError as e:
        raise ConfigError(f"components.generator.kind: {e}") from None
    if not spec.tiny and not spec.pretrained:
        raise ConfigError("components.generator: set `pretrained: <local dir or hub id>` or `tiny: true`")
    if settings.backend not in BACKENDS:
        raise ConfigError(f"generation.backend: {settings.backend!r} is not one of {', '.join(BACKENDS)}")
    kind.check_options(spec)
    if settings.backend == "vllm" and not kind.vllm:
        raise ConfigError(f"generation.backend: vllm does not run kind {kind.name} here; use backend: hf")
    path = kind.model_path(spec)
    chat = kind.load_chat(spec, path)
    if settings.backend == "vllm":
        from qkvqa.generation.vllm_client import VLLMRunner

        return Generator(chat, VLLMRunner.from_spec(spec, path, chat), settings)
    return Generator(chat, HFRunner(kind.load_model(spec, path), chat, spec.torch_device()), settings)


for _kind in GENERATOR_KINDS.values():
    register_kind(_kind)
