"""Fused attention for the Q-Former's HF attention blocks: the same weights through scaled_dot_product_attention.

`Blip2QFormerAttention` (transformers) materialises the `[B, heads, S, S]` score and probability tensors of every
layer in eager PyTorch (544 x 544 per head for 32 queries + 512 section tokens). `attend` computes the same
function from the block's own `query`/`key`/`value`/`output` modules with `torch.nn.functional.
scaled_dot_product_attention`, which picks a fused kernel (flash / memory-efficient on GPU, a blocked one on CPU)
and never holds the full probability tensor. It also lets a caller ask for some rows only (`rows`): the section
pass needs only the 32 query rows of the last layer. The eager HF path stays available (`QFFModel.attention =
"eager"`): it is the stock Q-Former, bit for bit, and the reference the fused path is tested against (fp32,
max abs difference <= 1e-5).
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from qkvqa.config.schema import ATTENTION_IMPLEMENTATIONS  # noqa: F401  (declared with the config)


def attend(
    block: nn.Module,
    hidden_states: torch.Tensor,
    attention_mask: Optional[torch.Tensor] = None,
    encoder_hidden_states: Optional[torch.Tensor] = None,
    rows: Optional[int] = None,
) -> torch.Tensor:
    """`block(hidden_states, attention_mask, encoder_hidden_states=...)` of a `Blip2QFormerAttention`, fused.

    Self-attention when `encoder_hidden_states` is None (keys and values from `hidden_states`, masked by the
    additive `[B, 1, 1, S]` `attention_mask`), else cross-attention to `encoder_hidden_states` without a mask
    (the Q-Former attends to every image patch and question query). `rows`: only the first `rows` positions are
    computed as queries (the output is `[B, rows, D]`); keys and values still come from every position."""
    mha, out = block.attention, block.output
    if getattr(mha, "position_embedding_type", "absolute") != "absolute":
        raise NotImplementedError(
            f"fused Q-Former attention supports absolute position embeddings, not "
            f"{mha.position_embedding_type!r}; set qff.attention=eager"
        )
    batch, heads, size = hidden_states.shape[0], mha.num_attention_heads, mha.attention_head_size
    source = hidden_states if encoder_hidden_states is None else encoder_hidden_states
    queries = hidden_states if rows is None else hidden_states[:, :rows]

    def split(x: torch.Tensor) -> torch.Tensor:  # [B, L, H*d] -> [B, H, L, d]
        return x.view(batch, -1, heads, size).transpose(1, 2)

    q, k, v = split(mha.query(queries)), split(mha.key(source)), split(mha.value(source))
    mask = attention_mask if encoder_hidden_states is None else None
    if mask is not None and mask.dtype != q.dtype:
        mask = mask.to(q.dtype)
    dropout = mha.dropout.p if mha.training else 0.0
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
    context = context.transpose(1, 2).reshape(batch, queries.shape[1], heads * size)
    return out(context, queries)
