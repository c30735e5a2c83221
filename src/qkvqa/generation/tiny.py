"""Tiny random generators for tests: a Llama-3-style chat LM and a Qwen2.5-VL with an offline processor (models.md section 8)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
QWEN_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Our own Jinja templates in the two models' chat formats.
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# A wide initialisation makes the random models' outputs depend on the whole prompt, not only on
# its last (identical) chat-template tokens, so that mixed-up batch rows would show in tests.
TINY_TEXT = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=8192,
    initializer_range=0.5,
)
TINY_VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=4,
    out_hidden_size=64,
    patch_size=14,
    spatial_merge_size=2,
    temporal_patch_size=2,
    window_size=56,
    fullatt_block_indexes=[1],
)
# transformers 4.57 key (5.x renames it rope_parameters); sum(mrope_section) = head_dim / 2 = (64 / 4) / 2.
TINY_MROPE = {"type": "mrope", "mrope_section": [2, 3, 3]}
TINY_IMAGE_PIXELS = 56 * 56


def byte_level_bpe():
    """A `tokenizers` byte-level BPE without merges: every UTF-8 byte is one token, so any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    backend = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def _special_ids(tokenizer, specials: Sequence[str]) -> dict[str, int]:
    """Ids of the special tokens, checked to be single added tokens (after the 256 byte tokens)."""
    ids = dict(zip(specials, tokenizer.convert_tokens_to_ids(list(specials))))
    if any(i is None or i < 256 for i in ids.values()) or len(set(ids.values())) != len(ids):
        raise RuntimeError(f"tiny tokenizer special tokens were not added as single tokens: {ids}")
    return ids


def write_tiny_llama3(out_dir: Path, seed: int = 0) -> Path:
    """Write a random tiny Llama with a byte-level tokenizer and a Llama-3 chat template to `out_dir`."""
    import torch
    from tokenizers import processors
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bos, eos = LLAMA3_SPECIALS[:2]
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(), bos_token=bos, eos_token=eos)
    tokenizer.add_special_tokens({"additional_special_tokens": LLAMA3_SPECIALS[2:]})
    ids = _special_ids(tokenizer, LLAMA3_SPECIALS)
    # Like Llama 3's tokenizer: the bos token is prepended when special tokens are requested.
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids[bos])]
    )
    tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out_dir))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=ids[bos], eos_token_id=ids[eos], **TINY_TEXT)
    LlamaForCausalLM(config).save_pretrained(str(out_dir))
    return out_dir


# ChatML in SmolLM2-135M-Instruct's own words (its chat_template: a default system turn when none is given).
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_tiny_chatml_lm(out_dir: Path, seed: int = 0) -> Path:
    """Write a random tiny Llama with a ChatML template whose tokenizer, like SmolLM2's as transformers converts it from
    GGUF, says eos = `<|im_start|>` while its generation_config says `<|im_end|>` (kind chat_lm must stop on the
    latter)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    eot_text, start, end = CHATML_SPECIALS
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(), bos_token=start, eos_token=start)
    tokenizer.add_special_tokens({"additional_special_tokens": CHATML_SPECIALS})
    ids = _special_ids(tokenizer, CHATML_SPECIALS)
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(str(out_dir))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=ids[start], eos_token_id=ids[end], **TINY_TEXT)
    LlamaForCausalLM(config).save_pretrained(str(out_dir))
    GenerationConfig(bos_token_id=ids[start], eos_token_id=ids[end], pad_token_id=ids[end]).save_pretrained(out_dir)
    return out_dir


def write_tiny_qwen2_5_vl(out_dir: Path, seed: int = 0) -> Path:
    """Write a random tiny Qwen2.5-VL and its processor (byte-level Qwen2 tokenizer, 56x56 images) to `out_dir`."""
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2TokenizerFast,
        Qwen2VLImageProcessorFast,
        Qwen2VLVideoProcessor,
    )

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=byte_level_bpe(),
        unk_token=None,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS})
    ids = _special_ids(tokenizer, QWEN_SPECIALS)
    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessorFast(min_pixels=TINY_IMAGE_PIXELS, max_pixels=TINY_IMAGE_PIXELS),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(),
        chat_template=QWEN_CHAT_TEMPLATE,
    )
    processor.save_pretrained(str(out_dir))
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            bos_token_id=ids["<|endoftext|>"],
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|endoftext|>"],
            rope_scaling=TINY_MROPE,
            **TINY_TEXT,
        ),
        vision_config=TINY_VISION,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )
    torch.manual_seed(seed)
    Qwen2_5_VLForConditionalGeneration(config).save_pretrained(str(out_dir))
    return out_dir


# ---------------------------------------------------------------------- a tiny extractive reader (the demo's)
_STOP = frozenset(
    "a an the of this that these those is are was were be what which who whom whose when where how "
    "in on to by for with and or do does did it its their there from at as has have had mainly "
    "typically typical can could many much".split()
)
# The words a fact sentence puts before its value ("measures 45 cm", "native to the Andes", "described ... in 1887").
_LINKS = ("measures", "is", "are", "was", "contains", "to", "in", "of", "on", "by", "reach", "reaches", "at", "for")


def _words(text: str) -> list[str]:
    import re

    return re.findall(r"[A-Za-z0-9]+(?:[-'][A-Za-z0-9]+)*", text.lower())


def extract_answer(question: str, context: str) -> str:
    """The span after the last linking word (`_LINKS`) of the context sentence that shares the most content words
    with the question (the earliest on a tie: CDA puts its best chunks first); '' for an empty context."""
    import re

    asked = {w for w in _words(question) if w not in _STOP}
    lines = [line for line in context.splitlines() if not line.lstrip().startswith("#")]  # CDA's article/section heads
    sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", "\n".join(lines)) if s.strip()]
    if not sentences:
        return ""
    best = max(range(len(sentences)), key=lambda i: (len(asked & set(_words(sentences[i]))), -i))
    sentence = sentences[best].rstrip(".!?")
    tokens = sentence.split()
    cut = max((i for i, t in enumerate(tokens[:-1]) if t.lower().strip(",;:") in _LINKS), default=-1)
    return " ".join(tokens[cut + 1 :]).strip(" ,;:") if cut >= 0 else sentence


class ExtractiveReader:
    """Answers from the context alone, without a language model: `extract_answer` of each request's question and
    context (`generation.reader: extractive`, what the demo uses so that its accuracy follows its contexts). Stated
    as such in the report; everything else (token counts for CDA's chunks, raw prompts) is the wrapped generator's."""

    kind = "extractive reader"

    def __init__(self, generator):
        self.generator = generator

    def __getattr__(self, name: str):
        return getattr(self.generator, name)

    def generate(self, batch) -> list[str]:
        """One extracted answer per GenerationRequest."""
        return [extract_answer(request.question, request.context or "") for request in batch]
