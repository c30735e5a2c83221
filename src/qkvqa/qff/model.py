"""The question-focused Q-Former: a wrapper nn.Module around a stock `Blip2ForImageTextRetrieval` (models.md §2)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import Blip2Config, Blip2ForImageTextRetrieval
from transformers.models.blip_2.modeling_blip_2 import Blip2QFormerAttention, Blip2QFormerMultiHeadAttention

from qkvqa.config.schema import FOCUS_GATES as GATES  # declared with the config
from qkvqa.config.schema import FOCUS_MODES
from qkvqa.errors import ConfigError, MissingWeightsError
from qkvqa.qff.attention import ATTENTION_IMPLEMENTATIONS, attend

CHECKPOINT_WEIGHTS = "model.safetensors"


def missing_file(path: Path) -> None:
    """MissingWeightsError naming `qff.checkpoint` when the trained-QFF folder `path` lacks its config or weights."""
    from qkvqa.errors import MissingWeightsError

    for name in (CHECKPOINT_CONFIG, CHECKPOINT_WEIGHTS):
        if path.is_dir() and not (path / name).is_file():
            raise MissingWeightsError(
                f"qff.checkpoint {path}: no {name} there (a trained QFF folder holds {CHECKPOINT_CONFIG} and "
                f"{CHECKPOINT_WEIGHTS}); copy the whole RUN/qff folder that `qkvqa train` wrote, or point "
                "qff.checkpoint at it"
            )


CHECKPOINT_CONFIG = "qff_config.json"
CHECKPOINT_FORMAT = "qkvqa-qff"
CHECKPOINT_VERSION = 1


@dataclass
class QuestionEncoding:
    """The question pass: the query outputs of every Q-Former layer (H_q^l), the last one being Q_tokens.

    `layer_states[l]` is the query slice `[B, Q, D]` of layer l's output, so `len(layer_states)` is the
    number of Q-Former layers and `tokens` (= `layer_states[-1]`) is the 32-query fusion feature
    matrix used by late-interaction scoring.
    """

    layer_states: tuple[torch.Tensor, ...]

    @property
    def tokens(self) -> torch.Tensor:
        """Q_tokens: the last layer's query outputs, `[B, Q, D]`."""
        return self.layer_states[-1]


def additive_mask(attention_mask: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    """A `[B, 1, 1, S]` additive float mask: 0 where `attention_mask` is 1, `finfo(dtype).min` where it is 0."""
    if attention_mask is None:
        return None
    return (1.0 - attention_mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min


def _select_rows(states: torch.Tensor, n: int, index: Optional[torch.Tensor], what: str) -> torch.Tensor:
    """Rows of `states` for a batch of `n`: by `index`, a broadcast view of one row, or `states` itself."""
    if index is not None:
        if index.shape != (n,):
            raise ValueError(f"{what}_index must have shape ({n},), got {tuple(index.shape)}")
        if states.shape[0] == 1:
            return states.expand(n, *states.shape[1:])
        return states.index_select(0, index.to(states.device))
    if states.shape[0] == n:
        return states
    if states.shape[0] == 1:
        return states.expand(n, *states.shape[1:])
    raise ValueError(f"{what} batch {states.shape[0]} does not match {n} sections; pass {what}_index")


def cast_like_hf(base: Blip2ForImageTextRetrieval, dtype: torch.dtype) -> Blip2ForImageTextRetrieval:
    """Cast `base` to `dtype` except its `_keep_in_fp32_modules` (query tokens, Q-Former), which stay fp32.

    transformers does this for fp16 only; we do it for bf16 as well, so that the trainable Q-Former
    and the new blocks keep fp32 weights and mixed precision casts their compute.
    """
    keep = set(base._keep_in_fp32_modules or ())
    for name, child in base.named_children():
        child.to(torch.float32 if name in keep else dtype)
    for name, param in base.named_parameters(recurse=False):
        param.data = param.data.to(torch.float32 if name in keep else dtype)
    return base


def keep_trainable_in_fp32(module: nn.Module) -> None:
    """Give every trainable parameter fp32 master weights, whatever dtype the model was loaded in.

    `cast_like_hf` keeps the Q-Former fp32 but casts the rest of BLIP-2, the text `embeddings` (word and
    position, about 24M parameters, trained with the Q-Former) among it. A bf16 weight cannot take an
    AdamW step of lr 1e-5 (bf16 holds 8 significant bits: the update rounds away), so under bf16-mixed
    those parameters would be frozen in effect. Mixed precision casts the compute, not the weights."""
    for param in module.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()


class QFFModel(nn.Module):
    """BLIP-2 retrieval model plus question-focused blocks; scores sections against a question.

    Build it AFTER the base weights are loaded: the constructor creates the new blocks and
    initialises them from the loaded base (zero tanh gates, cross-attention warm-started from each
    layer's self-attention), so the section pass equals the stock Q-Former exactly at step 0.

    Focus modes (`focus`):
      - `per_layer`: at layer l the section queries also cross-attend to the question's `H_q^l`
        through `q_xattn[l]`, gated by `tanh(q_gate[l])`;
      - `input`: once before the pass, `F = Queries + tanh(input_gate) * MHA(Queries, Q_tokens)`
        (`input_xattn`, a multi-head attention without output projection, as in the formula);
      - `none`: generic queries (OMGM's IT2IT reranker); the question is ignored.

    `gate`: `tanh` (above; `gate_init` 0 keeps step 0 equal to the stock Q-Former) or `none`, the
    paper's plain residual cross-attention (the block's own residual and LayerNorm, no gate), which
    changes the section pass from step 0 and gives the new blocks gradient at once.

    `attention`: `sdpa` (default) runs every attention block through `qkvqa.qff.attention.attend` (fused kernels,
    and the last layer of the question and section passes computes its 32 query rows only); `eager` runs the HF
    modules themselves, the stock Q-Former bit for bit. It is a runtime setting, not part of the weights.

    A focus block in the user's own code (docs/extending.md): a subclass with `FOCUS_BASE = "per_layer"` (it
    receives the question's states of every layer), which builds its parameters in `build_focus_blocks`, applies them
    in `focus_block` (both attention paths, through `attend_block`) and declares their optimizer groups in
    `PARAMETER_GROUPS`; named in config by its import path, `qff.focus: module.path:ClassName` (`resolve_focus`). One
    that needs the tokenizer's ids reads them in `bind_tokenizer`.
    """

    FOCUS_BASE: Optional[str] = None  # a plugin's built-in path (per_layer); None for QFFModel's own modes

    def __init__(
        self,
        base: Blip2ForImageTextRetrieval,
        focus: str = "per_layer",
        freeze_vit: bool = True,
        gradient_checkpointing: bool = False,
        gate: str = "tanh",
        gate_init: float = 0.0,
        attention: str = "sdpa",
    ):
        super().__init__()
        mode = focus
        if type(self).FOCUS_BASE is not None:  # a plugin focus: the config names the class, it runs FOCUS_BASE's path
            if focus != focus_name(type(self)):
                raise ConfigError(
                    f"{focus_name(type(self))} is built with qff.focus={focus_name(type(self))}, not {focus!r}"
                )
            mode = type(self).FOCUS_BASE
        if mode not in FOCUS_MODES:
            raise ConfigError(f"qff.focus must be one of {FOCUS_MODES} or module.path:ClassName, got {focus!r}")
        if gate not in GATES:
            raise ConfigError(f"qff.gate must be one of {GATES}, got {gate!r}")
        self.base = base
        self.attention = attention
        self.focus = focus
        self.focus_mode = mode  # the built-in path the focus takes (per_layer, input or none)
        self.gate = gate
        self.freeze_vit = freeze_vit
        self.gradient_checkpointing = gradient_checkpointing
        qcfg = base.config.qformer_config
        layers = base.qformer.encoder.layer
        # New blocks live beside the Q-Former, in its dtype (fp32: see cast_like_hf) and on its device.
        where = {"device": base.qformer.layernorm.weight.device, "dtype": base.qformer.layernorm.weight.dtype}
        if mode == "per_layer":
            self.build_focus_blocks(qcfg, layers, where, gate, gate_init)
        elif mode == "input":
            self.input_xattn = Blip2QFormerMultiHeadAttention(qcfg, is_cross_attention=False).to(**where)
            if gate == "tanh":
                self.input_gate = nn.Parameter(torch.full((), float(gate_init), **where))
            self.input_xattn.load_state_dict(layers[0].attention.attention.state_dict())
        if freeze_vit:
            base.vision_model.requires_grad_(False)
        keep_trainable_in_fp32(self)
        self.train(base.training)

    # ------------------------------------------------------------------ the question-focused parameters
    def build_focus_blocks(self, qcfg, layers, where: dict, gate: str, gate_init: float) -> None:
        """Create the per-layer focus parameters (on `where`'s device and dtype): `q_xattn[l]` warm-started from layer
        l's self-attention, and `q_gate` (tanh gates at `gate_init`) unless `gate` is none. A plugin overrides it."""
        self.q_xattn = nn.ModuleList(Blip2QFormerAttention(qcfg, is_cross_attention=False) for _ in layers).to(**where)
        if gate == "tanh":
            self.q_gate = nn.Parameter(torch.full((len(layers),), float(gate_init), **where))
        for block, layer in zip(self.q_xattn, layers):
            block.load_state_dict(layer.attention.state_dict())

    def focus_block(self, i: int, h: torch.Tensor, question_states: torch.Tensor) -> torch.Tensor:
        """Layer i's question focus of the section query states `h` `[B, Q, D]` (after self-attention, before image
        cross-attention), given the question's layer-i query states `[B, Q, D]`. A plugin overrides it."""
        focused = self.attend_block(self.q_xattn[i], h, encoder=question_states)
        return h + torch.tanh(self.q_gate[i]) * (focused - h) if self.gate == "tanh" else focused

    def bind_tokenizer(self, tokenizer) -> None:
        """Hook: `build_blip2_qff` hands every model it builds (fresh or from a checkpoint) the tokenizer it builds
        beside it. The built-in modes need nothing from it; a focus plugin that needs token ids overrides this."""

    def gate_values(self) -> Optional[torch.Tensor]:
        """tanh of every focus gate (one per layer, or the input gate), or None without gates."""
        gate = getattr(self, "q_gate", None)
        gate = gate if gate is not None else getattr(self, "input_gate", None)
        return None if gate is None else torch.tanh(gate.detach()).reshape(-1)

    # The optimizer group of every parameter the focus block adds beside the BLIP-2 base (`base.*`), keyed by the
    # attribute that holds it. A subclass that adds parameters declares them here (`{**QFFModel.PARAMETER_GROUPS,
    # "extra": "focus_blocks"}`); an undeclared one is refused by `focus_parameters`, never put in the base group with
    # weight decay. focus_blocks: lr x qff.new_block_lr_scale, weight decay; focus_gates: the same lr, no weight decay.
    PARAMETER_GROUPS = {
        "q_xattn": "focus_blocks",
        "input_xattn": "focus_blocks",
        "q_gate": "focus_gates",
        "input_gate": "focus_gates",
    }
    FOCUS_GROUPS = ("focus_blocks", "focus_gates")

    def focus_parameters(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(new block weights, gates): the parameters that the base BLIP-2 does not have, as `PARAMETER_GROUPS`
        assigns them; a parameter outside `base.` that it does not assign is a ConfigError naming it."""
        found: dict[str, list[nn.Parameter]] = {group: [] for group in self.FOCUS_GROUPS}
        for name, param in self.named_parameters():
            if name.startswith("base."):
                continue
            group = self.PARAMETER_GROUPS.get(name.split(".")[0])
            if group not in found:
                raise ConfigError(
                    f"{type(self).__name__} parameter {name!r} is in no optimizer group: declare it in "
                    f"{type(self).__name__}.PARAMETER_GROUPS as one of {', '.join(self.FOCUS_GROUPS)} (got {group!r})"
                )
            found[group].append(param)
        return found["focus_blocks"], found["focus_gates"]

    # ------------------------------------------------------------------ properties
    @property
    def num_layers(self) -> int:
        """Number of Q-Former layers."""
        return len(self.base.qformer.encoder.layer)

    @property
    def num_queries(self) -> int:
        """Number of learnable queries (32 for BLIP-2)."""
        return self.base.query_tokens.shape[1]

    @property
    def hidden_size(self) -> int:
        """Q-Former width (768 for BLIP-2)."""
        return self.base.config.qformer_config.hidden_size

    @property
    def image_size(self) -> int:
        """Side of the square images the ViT takes."""
        return self.base.config.vision_config.image_size

    @property
    def max_text_tokens(self) -> int:
        """Longest text the Q-Former's position embeddings allow."""
        return self.base.config.qformer_config.max_position_embeddings

    @property
    def qformer_dtype(self) -> torch.dtype:
        """The Q-Former's compute dtype (fp32 unless the whole model was cast)."""
        return self.base.qformer.layernorm.weight.dtype

    @property
    def vision_dtype(self) -> torch.dtype:
        """The ViT's dtype (pixel values are cast to it)."""
        return self.base.vision_model.embeddings.patch_embedding.weight.dtype

    @property
    def attention(self) -> str:
        """The attention implementation of the layer loop: sdpa | eager."""
        return self._attention

    @attention.setter
    def attention(self, value: str) -> None:
        if value not in ATTENTION_IMPLEMENTATIONS:
            raise ConfigError(f"qff.attention must be one of {ATTENTION_IMPLEMENTATIONS}, got {value!r}")
        self._attention = value

    def train(self, mode: bool = True) -> "QFFModel":
        """Set training mode; a frozen ViT always stays in eval mode."""
        super().train(mode)
        if self.freeze_vit:
            self.base.vision_model.eval()
        return self

    # ------------------------------------------------------------------ encoders
    def encode_image(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """ViT states `[N, P, Dv]` (`vision_model(...).last_hidden_state`); no autograd graph when the ViT is frozen."""
        pixel_values = pixel_values.to(device=self.base.vision_model.device, dtype=self.vision_dtype)
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.freeze_vit):
            return self.base.vision_model(pixel_values=pixel_values).last_hidden_state

    def encode_text(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Text-only Q-Former pass (the ITC text side): last hidden states `[B, L, D]`; `[:, 0]` is [CLS]."""
        embeds = self.base.embeddings(input_ids=input_ids)
        hidden, _ = self._run(embeds, attention_mask, 0, None, None)
        return hidden

    def encode_question(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, image_states: torch.Tensor
    ) -> QuestionEncoding:
        """Question pass: queries + question text + image cross-attention (stock Q-Former), every layer's query states kept."""
        queries = self.base.query_tokens.expand(input_ids.shape[0], -1, -1)
        embeds = self.base.embeddings(input_ids=input_ids, query_embeds=queries)
        _, layer_states = self._run(
            embeds,
            self._with_queries(attention_mask),
            self.num_queries,
            image_states,
            None,
            record=True,
            queries_only_last=True,
        )
        return QuestionEncoding(tuple(layer_states))

    def encode_sections(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        image_states: Optional[torch.Tensor],
        question: Optional[QuestionEncoding] = None,
        *,
        image_index: Optional[torch.Tensor] = None,
        question_index: Optional[torch.Tensor] = None,
        focus: Optional[str] = None,
    ) -> torch.Tensor:
        """Section pass: the `[B, Q, D]` last-layer query outputs h_ij, focused on `question`.

        `input_ids`/`attention_mask`: `[B, L]` section tokens. `image_states`: ViT states, either one row
        per section (`[B, P, Dv]`), one row for all (`[1, P, Dv]`, broadcast without copying), or one
        row per article with `image_index[b]` naming section b's article row (so each article image
        goes through the ViT once); None skips image cross-attention. `question`: a
        QuestionEncoding with one row per section, one row for all (broadcast), or several rows
        with `question_index[b]` naming section b's question. `focus` defaults to the model's focus;
        `"none"` is always allowed and ignores the question.
        """
        focus = focus or self.focus
        if focus not in (self.focus, "none"):
            raise ConfigError(
                f"this QFF model was built with focus={self.focus!r}; it can run {self.focus!r} or "
                f"'none', not {focus!r}"
            )
        n = input_ids.shape[0]
        if focus != "none" and question is None:
            raise ValueError(f"focus={focus!r} needs the question encoding")
        if image_states is not None:
            image_states = _select_rows(image_states, n, image_index, "image")
        queries = self.base.query_tokens.expand(n, -1, -1)
        question_states = None
        if focus != "none" and self.focus_mode == "per_layer":
            question_states = [_select_rows(s, n, question_index, "question") for s in question.layer_states]
        elif focus != "none" and self.focus_mode == "input":
            tokens = _select_rows(question.tokens, n, question_index, "question")
            context, _ = self.input_xattn(hidden_states=queries, encoder_hidden_states=tokens.to(queries.dtype))
            queries = queries + (torch.tanh(self.input_gate) * context if self.gate == "tanh" else context)
        embeds = self.base.embeddings(input_ids=input_ids, query_embeds=queries)
        hidden, _ = self._run(
            embeds,
            self._with_queries(attention_mask),
            self.num_queries,
            image_states,
            question_states,
            queries_only_last=True,
        )
        return hidden[:, : self.num_queries]

    # ------------------------------------------------------------------ the layer loop
    def _with_queries(self, attention_mask: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(
            attention_mask.shape[0], self.num_queries, dtype=attention_mask.dtype, device=attention_mask.device
        )
        return torch.cat([ones, attention_mask], dim=1)

    def _run(
        self,
        embeds: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        query_length: int,
        image_states: Optional[torch.Tensor],
        question_states: Optional[Sequence[torch.Tensor]],
        record: bool = False,
        queries_only_last: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Embedding LayerNorm, then every Q-Former layer; returns the last hidden states and, if `record`, each layer's
        query slice. `queries_only_last`: the caller reads the query rows only, so (sdpa) the last layer computes
        nothing else and the returned states are `[B, query_length, D]`."""
        qformer = self.base.qformer
        dtype = self.qformer_dtype
        x = qformer.dropout(qformer.layernorm(embeds.to(dtype)))
        mask = additive_mask(attention_mask.to(x.device) if attention_mask is not None else None, dtype)
        if image_states is not None:
            image_states = image_states.to(device=x.device, dtype=dtype)
        use_checkpoint = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        recorded = []
        for i in range(self.num_layers):
            q_states = None if question_states is None else question_states[i]
            rows_only = queries_only_last and i == self.num_layers - 1
            if use_checkpoint:
                x = checkpoint(
                    self._layer, i, x, mask, query_length, image_states, q_states, rows_only, use_reentrant=False
                )
            else:
                x = self._layer(i, x, mask, query_length, image_states, q_states, rows_only)
            if record:
                recorded.append(x[:, :query_length])
        return x, recorded

    def _layer(
        self,
        i: int,
        x: torch.Tensor,
        mask: Optional[torch.Tensor],
        query_length: int,
        image_states: Optional[torch.Tensor],
        question_states: Optional[torch.Tensor],
        rows_only: bool = False,
    ) -> torch.Tensor:
        """Q-Former layer i with the question-focused block between self-attention and image cross-attention
        (`rows_only`: the query rows only, see `_run`)."""
        layer = self.base.qformer.encoder.layer[i]
        attended = self.attend_block(
            layer.attention, x, mask, rows=query_length if rows_only and query_length else None
        )
        if query_length == 0:
            return layer.feed_forward_chunk(attended)
        h = attended[:, :query_length]
        if question_states is not None:
            h = self.focus_block(i, h, question_states)
        if layer.has_cross_attention and image_states is not None:
            h = self.attend_block(layer.crossattention, h, encoder=image_states)
        out = layer.feed_forward_chunk_query(h)
        if attended.shape[1] > query_length:
            out = torch.cat([out, layer.feed_forward_chunk(attended[:, query_length:])], dim=1)
        return out

    def attend_block(
        self,
        block: nn.Module,
        x: torch.Tensor,
        mask: Optional[torch.Tensor] = None,
        encoder: Optional[torch.Tensor] = None,
        rows: Optional[int] = None,
    ) -> torch.Tensor:
        """One `Blip2QFormerAttention` block: self-attention (masked) or cross-attention to `encoder`, through the
        HF module (eager) or `attend` (sdpa); `rows`: the first `rows` positions only. A focus block calls it too, so
        that its sdpa and eager paths are the same code."""
        if self._attention == "sdpa":
            return attend(block, x, mask, encoder, rows)
        out = (
            block(hidden_states=x, attention_mask=mask)
            if encoder is None
            else block(hidden_states=x, encoder_hidden_states=encoder)
        )
        return out if rows is None else out[:, :rows]

    # ------------------------------------------------------------------ checkpoints
    def save_pretrained(
        self,
        out_dir: str | Path,
        preprocessing: Optional[dict] = None,
        vit_dtype: Optional[str] = None,
        scoring: Optional[dict] = None,
    ) -> Path:
        """Write `model.safetensors` (keys `base.*`, `q_xattn.*`, `q_gate` / `input_*`) and `qff_config.json` (with the
        weights' sha256, checked on load, the input `preprocessing` the weights were trained with, `vit_dtype`, the
        dtype the frozen ViT ran in during training, and `scoring`, the scorer and text limits they score with)."""
        from safetensors.torch import save_file

        from qkvqa.utils.io import atomic_write_json, make_shareable, sha256_file

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        tmp = out_dir / (CHECKPOINT_WEIGHTS + ".tmp")
        save_file(state, str(tmp), metadata={"format": CHECKPOINT_FORMAT})
        make_shareable(tmp)  # safetensors writes 0600 whatever the umask
        tmp.replace(out_dir / CHECKPOINT_WEIGHTS)
        atomic_write_json(
            out_dir / CHECKPOINT_CONFIG,
            {
                "format": CHECKPOINT_FORMAT,
                "version": CHECKPOINT_VERSION,
                "focus": self.focus,
                **focus_source(type(self)),
                "gate": self.gate,
                "base_class": type(self.base).__name__,
                "weights_sha256": sha256_file(out_dir / CHECKPOINT_WEIGHTS),
                "preprocessing": preprocessing,
                "scoring": scoring,
                "vit_dtype": vit_dtype,
                "base_config": self.base.config.to_dict(),
            },
        )
        return out_dir

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        dtype: Optional[torch.dtype] = None,
        freeze_vit: bool = True,
        gradient_checkpointing: bool = False,
        attention: str = "sdpa",
    ) -> "QFFModel":
        """Rebuild a model written by `save_pretrained`; `dtype` casts like from_pretrained (Q-Former and new blocks stay fp32)."""
        from accelerate import init_empty_weights
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        from qkvqa.errors import DataError
        from qkvqa.utils.io import verify_sha256_once

        path = Path(path)
        missing_file(path)  # a folder copied without its weights: one line, not a traceback (issue 44)
        try:
            meta = json.loads((path / CHECKPOINT_CONFIG).read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(
                f"{path / CHECKPOINT_CONFIG}: unreadable ({e}); re-export the QFF (qkvqa train writes RUN/qff)"
            ) from None
        if meta.get("format") != CHECKPOINT_FORMAT or meta.get("version") != CHECKPOINT_VERSION:
            raise MissingWeightsError(
                f"{path / CHECKPOINT_CONFIG} is not a {CHECKPOINT_FORMAT} v{CHECKPOINT_VERSION} "
                f"checkpoint config (got {meta.get('format')!r} v{meta.get('version')!r})"
            )
        if meta.get("weights_sha256"):
            verify_sha256_once(
                path / CHECKPOINT_WEIGHTS,
                meta["weights_sha256"],
                "QFF weights",
                "copy the trained QFF again, or retrain it",
            )
        try:
            state = load_file(str(path / CHECKPOINT_WEIGHTS))
        except (SafetensorError, OSError) as e:
            raise DataError(
                f"{path / CHECKPOINT_WEIGHTS}: unreadable safetensors ({e}); copy the trained QFF again, or retrain it"
            ) from None
        base_state = {k[len("base.") :]: v for k, v in state.items() if k.startswith("base.")}
        with init_empty_weights():
            base = Blip2ForImageTextRetrieval(Blip2Config.from_dict(meta["base_config"]))
        load_complete(base, base_state, str(path / CHECKPOINT_WEIGHTS))
        if dtype is not None:
            cast_like_hf(base, dtype)
        model = resolve_focus(meta["focus"])(
            base.eval(),
            focus=meta["focus"],
            freeze_vit=freeze_vit,
            gate=meta.get("gate", "tanh"),
            gradient_checkpointing=gradient_checkpointing,
            attention=attention,
        )
        own = {k: v for k, v in state.items() if not k.startswith("base.")}
        expected_own = {k for k in model.state_dict() if not k.startswith("base.")}
        if set(own) != expected_own:
            raise MissingWeightsError(
                f"{path / CHECKPOINT_WEIGHTS}: question-focused keys {sorted(own)} do not match "
                f"focus={meta['focus']!r}, which needs {sorted(expected_own)}"
            )
        model.load_state_dict(own, strict=False)
        return model


def load_complete(base: nn.Module, state: dict, source: str) -> None:
    """Load `state` into a (possibly meta-initialised) module by assignment; every parameter and persistent buffer must be there."""
    result = base.load_state_dict(state, strict=False, assign=True)
    if result.missing_keys:
        raise MissingWeightsError(
            f"{source} lacks {len(result.missing_keys)} weight(s) of the BLIP-2 model, e.g. {result.missing_keys[:5]}"
        )
    if result.unexpected_keys:
        raise MissingWeightsError(
            f"{source} has {len(result.unexpected_keys)} key(s) the BLIP-2 model does not, e.g. "
            f"{result.unexpected_keys[:5]}; was it written for another configuration?"
        )


def focus_name(cls: type) -> str:
    """The `qff.focus` value of a plugin focus class: its import path `module:ClassName`."""
    return f"{cls.__module__}:{cls.__qualname__}"


def focus_source(cls: type) -> dict:
    """For a focus class outside qkvqa: the sha256 of its source file (`focus_source_sha256`); {} otherwise."""
    from qkvqa.components.plugins import plugin_record

    record = plugin_record(cls)
    return {"focus_source_sha256": record["source_sha256"]} if record else {}


def resolve_focus(focus: str) -> type[QFFModel]:
    """The model class `qff.focus` names: QFFModel for a built-in mode (FOCUS_MODES), else the QFFModel subclass at
    `module.path:ClassName` with a FOCUS_BASE; anything else is a ConfigError naming the built-in modes."""
    from qkvqa.components.plugins import register_plugin, resolve_plugin

    for mode in FOCUS_MODES:
        register_plugin("qff.focus", mode, QFFModel)
    cls = resolve_plugin("qff.focus", focus, QFFModel)
    if cls is not QFFModel and cls.FOCUS_BASE != "per_layer":
        raise ConfigError(
            f"qff.focus {focus!r}: {cls.__qualname__} must set FOCUS_BASE = 'per_layer' (docs/extending.md)"
        )
    return cls
