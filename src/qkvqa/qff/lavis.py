"""LAVIS `Blip2Qformer` checkpoint (`blip2_pretrained.pth`) -> HF `Blip2ForImageTextRetrieval` state-dict names (models.md §1.6)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Mapping, Optional

import torch

from qkvqa.errors import MissingWeightsError

# LAVIS keys with no HF counterpart: the learned ITC temperature, the captioning LM head, position-id buffers.
_DROPPED = re.compile(r"^(temp|Qformer\.cls\..*|.*position_ids)$")

# Whole-key renames outside the per-layer blocks.
_RENAMES = {
    "Qformer.bert.embeddings.word_embeddings.weight": "embeddings.word_embeddings.weight",
    "Qformer.bert.embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
    "Qformer.bert.embeddings.LayerNorm.weight": "qformer.layernorm.weight",
    "Qformer.bert.embeddings.LayerNorm.bias": "qformer.layernorm.bias",
    "ln_vision.weight": "vision_model.post_layernorm.weight",
    "ln_vision.bias": "vision_model.post_layernorm.bias",
    "visual_encoder.cls_token": "vision_model.embeddings.class_embedding",
    "visual_encoder.pos_embed": "vision_model.embeddings.position_embedding",
    "visual_encoder.patch_embed.proj.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual_encoder.patch_embed.proj.bias": "vision_model.embeddings.patch_embedding.bias",
}

_PREFIXES = {"vision_proj.": "vision_projection.", "text_proj.": "text_projection.", "itm_head.": "itm_head."}

_QFORMER_LAYER = re.compile(r"^Qformer\.bert\.encoder\.layer\.(\d+)\.(.+)$")
_VIT_BLOCK = re.compile(r"^visual_encoder\.blocks\.(\d+)\.(.+)$")
_VIT_PARTS = {
    "norm1.": "layer_norm1.",
    "norm2.": "layer_norm2.",
    "attn.qkv.weight": "self_attn.qkv.weight",
    "attn.proj.": "self_attn.projection.",
    "mlp.fc1.": "mlp.fc1.",
    "mlp.fc2.": "mlp.fc2.",
}


def _vit_block_key(rest: str) -> Optional[str]:
    for lavis_part, hf_part in _VIT_PARTS.items():
        if rest.startswith(lavis_part):
            return hf_part + rest[len(lavis_part) :]
    return None


def convert_lavis_state_dict(
    state: Mapping[str, torch.Tensor], num_vision_layers: int
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename a LAVIS `Blip2Qformer` state dict to HF names; returns (HF state dict, LAVIS keys left out).

    The EVA block's separate `attn.q_bias` / `attn.v_bias` become HF's `self_attn.qkv.bias =
    cat(q_bias, 0, v_bias)`. ViT blocks at or beyond `num_vision_layers` are left out (LAVIS
    keeps 39 of EVA's 40 blocks). Keys that are dropped on purpose (`temp`, `Qformer.cls.*`,
    position-id buffers) and keys with no known counterpart are both listed in the second value.
    """
    out: dict[str, torch.Tensor] = {}
    left_out: list[str] = []
    qv_bias: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        if _DROPPED.match(key):
            left_out.append(key)
        elif key in _RENAMES:
            out[_RENAMES[key]] = value
        elif key == "query_tokens":
            out[key] = value
        elif m := _QFORMER_LAYER.match(key):
            rest = m.group(2).replace("attention.self.", "attention.attention.")
            out[f"qformer.encoder.layer.{m.group(1)}.{rest}"] = value
        elif m := _VIT_BLOCK.match(key):
            block, rest = int(m.group(1)), m.group(2)
            if block >= num_vision_layers:
                left_out.append(key)
            elif rest in ("attn.q_bias", "attn.v_bias"):
                qv_bias.setdefault(block, {})[rest[5]] = value
            elif (hf := _vit_block_key(rest)) is not None:
                out[f"vision_model.encoder.layers.{block}.{hf}"] = value
            else:
                left_out.append(key)
        elif (prefix := next((p for p in _PREFIXES if key.startswith(p)), None)) is not None:
            out[_PREFIXES[prefix] + key[len(prefix) :]] = value
        else:
            left_out.append(key)
    for block, biases in qv_bias.items():
        if set(biases) != {"q", "v"}:
            raise MissingWeightsError(
                f"LAVIS ViT block {block} has {sorted(biases)}_bias but needs both q_bias and v_bias"
            )
        q, v = biases["q"], biases["v"]
        out[f"vision_model.encoder.layers.{block}.self_attn.qkv.bias"] = torch.cat([q, torch.zeros_like(v), v])
    return out, left_out


def read_lavis_checkpoint(path: str | Path, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of a LAVIS `.pth` (its `"model"` entry when present), with `prefix` added to every key.

    `prefix="visual_encoder."` reads a bare EVA ViT checkpoint (`eva_vit_g.pth`) in LAVIS names.
    """
    try:
        ckpt = torch.load(str(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as e:
        raise MissingWeightsError(f"no LAVIS checkpoint at {path}") from e
    state = ckpt.get("model", ckpt) if isinstance(ckpt, dict) else None
    if not isinstance(state, dict):
        raise MissingWeightsError(f"{path} does not hold a state dict (nor a dict with a 'model' state dict)")
    return {prefix + k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
