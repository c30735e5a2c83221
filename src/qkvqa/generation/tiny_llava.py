"""Tiny random LLaVA checkpoints in the original layout (llava_llama + a CLIP tower directory) and their conversion, for tests (kind `reflectiva`)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from qkvqa.generation.tiny import LLAMA3_CHAT_TEMPLATE, LLAMA3_SPECIALS, TINY_TEXT, byte_level_bpe

# ReflectiVA's reflective tokens are Llama 3.1's reserved special tokens renamed (RET 128251, REL 128253,
# <paragraph> 128254, </paragraph> 128255 in its train.py); the tiny tokenizer holds them as added tokens too.
REFLECTIVE_SPECIALS = ["[No Retrieval]", "[Retrieval]", "[Relevant]", "[Irrelevant]", "<paragraph>", "</paragraph>"]
TINY_CLIP_VISION = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    image_size=28,
    patch_size=14,
    projection_dim=16,
)
TINY_CLIP_TEXT = dict(
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    vocab_size=64,
    max_position_embeddings=16,
    projection_dim=16,
)
# The fields LLaVA's training writes into config.json (ReflectiVA's scripts/train_reflectiva.sh settings).
LLAVA_FIELDS = dict(
    mm_vision_tower="openai/clip-vit-large-patch14-336",
    mm_projector_type="mlp2x_gelu",
    mm_vision_select_layer=-2,
    mm_vision_select_feature="patch",
    mm_use_im_start_end=False,
    mm_use_im_patch_token=False,
    image_aspect_ratio="pad",
    mm_patch_merge_type="flat",
    tokenizer_model_max_length=4096,
    tokenizer_padding_side="right",
    tune_mm_mlp_adapter=False,
    freeze_mm_mlp_adapter=False,
    unfreeze_mm_vision_tower=False,
    use_mm_proj=True,
    s2=False,
    siglip=False,
    mm_projector_lr=None,
)


def write_tiny_clip_tower(out_dir: Path, seed: int = 0) -> Path:
    """A random tiny CLIPModel (text and vision towers, as openai/clip-vit-large-patch14-336 ships) and its
    CLIPImageProcessor (28x28, shortest-edge resize then centre crop) in `out_dir`."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = CLIPConfig(text_config=TINY_CLIP_TEXT, vision_config=TINY_CLIP_VISION, projection_dim=16)
    CLIPModel(config).save_pretrained(str(out_dir))
    size = TINY_CLIP_VISION["image_size"]
    CLIPImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size}).save_pretrained(
        str(out_dir)
    )
    return out_dir


def write_tiny_llava_source(out_dir: Path, seed: int = 0, saved_tower: bool = True) -> Path:
    """A random tiny LLaVA-LLaMA checkpoint in the original layout: config.json with model_type llava_llama and the
    mm_* fields, two safetensors shards with the original key names (model.*, lm_head, model.mm_projector.0/2) and an
    index, a byte-level tokenizer with the Llama 3 chat template, generation_config.json.

    `saved_tower` also stores random `model.vision_tower.vision_tower.vision_model.*` weights, which LLaVA does not
    load (its tower comes from mm_vision_tower): a converter that used them would give other logits.
    """
    import torch
    from safetensors.torch import save_file
    from tokenizers import processors
    from transformers import CLIPVisionConfig, CLIPVisionModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from qkvqa.utils.io import atomic_write_json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bos, eos = LLAMA3_SPECIALS[0], "<|eot_id|>"
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=byte_level_bpe(), bos_token=bos, eos_token=eos)
    tokenizer.add_special_tokens(
        {"additional_special_tokens": [t for t in LLAMA3_SPECIALS if t != bos] + REFLECTIVE_SPECIALS}
    )
    bos_id = tokenizer.convert_tokens_to_ids(bos)
    tokenizer.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
    )
    tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    tokenizer.save_pretrained(str(out_dir))
    eos_ids = tokenizer.convert_tokens_to_ids([eos, "<|end_of_text|>"])

    torch.manual_seed(seed)
    text = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=bos_id, eos_token_id=eos_ids, **TINY_TEXT)
    language = LlamaForCausalLM(text)
    hidden, vision_hidden = text.hidden_size, TINY_CLIP_VISION["hidden_size"]
    projector = torch.nn.Sequential(
        torch.nn.Linear(vision_hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden)
    )
    state = {k: v.contiguous() for k, v in language.state_dict().items()}
    state.update({f"model.mm_projector.{k}": v.contiguous() for k, v in projector.state_dict().items()})
    if saved_tower:
        vision = CLIPVisionModel(CLIPVisionConfig(**TINY_CLIP_VISION))
        state.update(
            {
                f"model.vision_tower.vision_tower.{k}": v.contiguous()
                for k, v in vision.state_dict().items()
                if not k.endswith("position_ids")
            }
        )
    keys = sorted(state)
    first = [k for k in keys if k.startswith("model.layers.0.") or k.startswith("model.embed_tokens")]
    shards = {
        "model-00001-of-00002.safetensors": {k: state[k] for k in first},
        "model-00002-of-00002.safetensors": {k: state[k] for k in keys if k not in first},
    }
    for name, tensors in shards.items():
        save_file(tensors, str(out_dir / name), metadata={"format": "pt"})
    atomic_write_json(
        out_dir / "model.safetensors.index.json",
        {"metadata": {}, "weight_map": {k: n for n, t in shards.items() for k in t}},
    )
    config = {
        **text.to_dict(),
        **LLAVA_FIELDS,
        "mm_hidden_size": vision_hidden,
        "model_type": "llava_llama",
        "architectures": ["LlavaLlamaForCausalLM"],
        "torch_dtype": "float32",
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (out_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos_id, "eos_token_id": eos_ids, "do_sample": False}), encoding="utf-8"
    )
    return out_dir


def write_tiny_reflectiva(out_dir: Path, seed: int = 0) -> Path:
    """A tiny LLaVA in the original layout, converted into `out_dir` by qkvqa.generation.llava_convert (the kind
    reflectiva's `tiny: true`: the converter and the loading code are the real ones)."""
    from qkvqa.generation.llava_convert import convert_llava

    work = Path(tempfile.mkdtemp(prefix="qkvqa-tiny-llava-"))
    try:
        source = write_tiny_llava_source(work / "source", seed=seed)
        tower = write_tiny_clip_tower(work / "clip", seed=seed + 1)
        convert_llava(source, out_dir, vision_tower=tower, source_id="tiny", progress=lambda message: None)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Path(out_dir)
