"""The `blip2_qff` component: loads the QFF model (HF, LAVIS or qkvqa checkpoint, or tiny) with its tokenizer and image processor."""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from qkvqa.components.registry import ComponentSpec, register_component, resolve_pretrained, tiny_model
from qkvqa.errors import ConfigError, MissingWeightsError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

# Blip2Config of Salesforce/blip2-itm-vit-g (models.md §1.5); the default base config of a LAVIS checkpoint.
ITM_VIT_G_CONFIG = {
    "vision_config": {"image_size": 224},
    "qformer_config": {"vocab_size": 30523, "use_qformer_text_input": True},
}

# models.md §8 tiny BLIP-2 retrieval model; every entry can be overridden through `spec.options`.
TINY_DEFAULTS = {
    "image_size": 28,
    "patch_size": 14,
    "vision_hidden_size": 32,
    "vision_layers": 2,
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 4,
    "cross_attention_frequency": 1,
    "num_query_tokens": 4,
    "max_position_embeddings": 128,
    "embed_dim": 16,
    "mlp_ratio": 2,
    "vision_heads": None,  # the ViT's heads: num_heads when unset (a bert:<ref> init: 4, the Q-Former's are BERT's)
}

# Loading settings: tiny vocabulary and seed; LAVIS base config, tokenizer and separate EVA ViT weights.
LOADING_DEFAULTS = {
    "vocab_texts": (),
    "seed": 0,
    "base_config": None,
    "tokenizer": "bert-base-uncased",
    "vision_checkpoint": None,
}

# The component's construction options (`components.qformer.options`): the tiny model's shape and the loading
# settings. Everything else the QFF reads (focus, gate, text limits, scorer, ...) is the `qff:` section's, one
# `QFFConfig` (`qkvqa.config.schema.qff_settings`) that `build_qff_component` hands over whole.
KNOWN_OPTIONS = {**TINY_DEFAULTS, **LOADING_DEFAULTS}
# Article images whose ViT states enter the LRU go through the ViT in forwards of exactly this many (see
# `QFFComponent.score_sections_many`): a shape that fills a GPU, fixed so that the states never depend on the batch.
VIT_CHUNK = 8


def image_key(image: Any) -> tuple:
    """The ViT-cache key of an image: its mode, size and a hash of its pixels (the same URL may name other pixels in
    another KB or image folder; equal pixels give equal states)."""
    import hashlib

    return ("pixels", image.mode, image.size, hashlib.blake2b(image.tobytes(), digest_size=16).hexdigest())


@dataclass
class SectionRequest:
    """One question's sections to score (`QFFComponent.score_sections_many`)."""

    question: str
    image: Any  # the query image (PIL)
    article_images: Sequence[Any]  # each article's main image, None when it has none
    article_sections: Sequence[Sequence[str]]  # each article's candidate section texts
    focus: Optional[str] = None  # the component's focus by default


def dtype_name(dtype: Any) -> str:
    """bf16 / fp16 / fp32 for a torch dtype (its torch name otherwise)."""
    return {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32"}.get(str(dtype), str(dtype))


class QFFComponent:
    """A QFF model bundled with its tokenizer and image processor; tokenises, preprocesses and scores sections.

    `model` is the `QFFModel` (see `qkvqa.qff.model`); the trainer calls its encoders directly, the
    reranker calls `score_sections` and feeds the result to `qkvqa.qff.scoring.rerank`.
    """

    def __init__(self, model, tokenizer, image_processor, qff: Any = None, scorer=None):
        """`qff`: the `qff:` section the component reads its focus, text limits, preprocessing and batch sizes from
        (`qkvqa.config.schema.qff_settings`; None: the defaults), kept whole as `self.qff`; `scorer`: the
        `SectionScorer` every score goes through (`qkvqa.qff.scorers`; None: the one `qff` selects)."""
        from qkvqa.config.schema import qff_settings
        from qkvqa.qff.scorers import scorer_from_qff

        qff = qff_settings(qff)
        self.qff = qff
        self.model = model
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.focus = qff.focus
        if self.focus not in (model.focus, "none"):
            raise ConfigError(
                f"qff.focus={self.focus!r}, but the loaded QFF model was built with focus="
                f"{model.focus!r}; use {model.focus!r} or 'none'"
            )
        self.max_text_tokens = min(int(qff.max_text_tokens), model.max_text_tokens)
        self.question_max_tokens = min(int(qff.question_max_tokens), model.max_text_tokens)
        self.blip_text_preprocess = bool(qff.blip_text_preprocess)
        self.scorer = scorer if scorer is not None else scorer_from_qff(qff)
        self.section_batch_size = int(qff.section_batch_size)
        self.image_transform = qff.image_transform
        self.vit_lru_size = int(qff.vit_lru_size)
        self._vit_cache: "OrderedDict[Any, Any]" = OrderedDict()  # image content key -> ViT states [P, Dv]
        self._vit_version: Any = None  # the ViT weights the cached states came from
        self.vit_cache_stats = {"hits": 0, "misses": 0}

    @property
    def score_direction(self) -> Optional[str]:
        """The late-interaction scorer's `score_direction` (None for a scorer without that option)."""
        return self.scorer.options.get("score_direction")

    @property
    def question_norm(self) -> str:
        """How the question tokens are normalised at inference (qff.question_norm; per_token for a scorer without
        that option, which the rerank sidecar records)."""
        return self.scorer.options.get("question_norm", "per_token")

    def preprocessing(self) -> dict:
        """The input preprocessing a trained QFF must be used with (recorded with its weights, checked on load)."""
        from qkvqa.qff.image_processing import IMAGE_GEOMETRY

        return {
            "image_transform": self.image_transform,
            "image_geometry": IMAGE_GEOMETRY.get(self.image_transform),
            "blip_text_preprocess": self.blip_text_preprocess,
        }

    def scoring(self) -> dict:
        """What else changes this QFF's scores, recorded with its weights and checked on load (`check_scoring`): the
        scorer (name or import path, options, a plugin's source sha256) and the text limits; `runtime_options` names
        the scorer options a trained QFF may be used with at another value (named on the card)."""
        from qkvqa.qff.scorers import runtime_options

        return {
            **self.scorer.record(),
            "runtime_options": runtime_options(type(self.scorer)),
            "max_text_tokens": self.max_text_tokens,
            "question_max_tokens": self.question_max_tokens,
        }

    def runtime_settings(self) -> dict:
        """The settings that change speed or memory but no score (allowed to differ from training; on the card)."""
        return {
            "qff.attention": self.model.attention,
            "qff.section_batch_size": self.section_batch_size,
            "qff.vit_lru_size": self.vit_lru_size,
        }

    @property
    def device(self):
        """The device the model's Q-Former lives on."""
        return self.model.base.qformer.layernorm.weight.device

    # ------------------------------------------------------------------ inputs
    def prepare_text(self, text: str) -> str:
        """The text as the model sees it: LAVIS `blip_caption` cleaning when `blip_text_preprocess` is on."""
        if self.blip_text_preprocess:
            from qkvqa.data.sections import blip_caption

            return blip_caption(text)
        return text

    def tokenize_questions(self, questions: Sequence[str]):
        """`input_ids` / `attention_mask` `[B, L]` on the model's device, ≤ `question_max_tokens`, padded to the longest."""
        return self._tokenize(questions, self.question_max_tokens)

    def tokenize_sections(self, sections: Sequence[str]):
        """`input_ids` / `attention_mask` `[B, L]` on the model's device, ≤ `max_text_tokens` (512), padded to the longest."""
        return self._tokenize(sections, self.max_text_tokens)

    def _tokenize(self, texts: Sequence[str], max_length: int):
        batch = self.tokenizer(
            [self.prepare_text(t) for t in texts],
            padding="longest",
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        return {
            "input_ids": batch["input_ids"].to(self.device),
            "attention_mask": batch["attention_mask"].to(self.device),
        }

    def preprocess_images(self, images: Sequence[Any]):
        """`[N, 3, S, S]` pixel values (PIL images in), in the ViT's dtype on its device."""
        pixels = self.image_processor(images=list(images), return_tensors="pt")["pixel_values"]
        return pixels.to(device=self.model.base.vision_model.device, dtype=self.model.vision_dtype)

    # ------------------------------------------------------------------ inference
    def encode_question(self, question: str, image: Any):
        """The QuestionEncoding of one (question, image) pair."""
        tokens = self.tokenize_questions([question])
        image_states = self.model.encode_image(self.preprocess_images([image]))
        return self.model.encode_question(tokens["input_ids"], tokens["attention_mask"], image_states)

    def score_sections(
        self,
        question: str,
        question_image: Any,
        article_images: Sequence[Any],
        article_sections: Sequence[Sequence[str]],
        focus: Optional[str] = None,
    ) -> list[list[float]]:
        """Late-interaction scores of every section of every article for one question (OMGM `sec_sim` shape).

        `article_images[i]` is article i's main image (None when it has none); `article_sections[i]`
        its candidate section strings. Articles without an image or without sections get `[]` (their QFF score
        is 0 in `rerank`). One question of `score_sections_many`.
        """
        return self.score_sections_many(
            [SectionRequest(question, question_image, article_images, article_sections, focus)]
        )[0]

    def score_sections_many(self, requests: Sequence["SectionRequest"]) -> list[list[list[float]]]:
        """`score_sections` of several questions at once: one batched question pass, each article image through
        the ViT once (and not again while its states are in the LRU cache of `vit_lru_size` images, keyed on the
        image's pixels and cleared when the ViT's weights change), and the
        sections of every question in shared forwards of `section_batch_size`, sorted by token length so that
        padding stays small. Each result equals the one-question call up to float rounding (tested <= 1e-5)."""
        import torch

        results: list[list[list[float]]] = []
        flat: list[tuple[int, int, int, int, int]] = []  # (request, image row, article, section, question)
        texts: list[str] = []
        image_rows: dict[Any, int] = {}  # cache key (or a per-call token) -> image row
        new_images: list[tuple[Any, Any]] = []  # (key, PIL image) not in the LRU
        states_by_key: dict[Any, Any] = {}  # key -> ViT states [P, Dv]
        asking: list[int] = []  # requests with something to score
        cacheable = self._cacheable()
        for r, req in enumerate(requests):
            if len(req.article_images) != len(req.article_sections):
                raise ValueError(
                    f"{len(req.article_images)} article images but {len(req.article_sections)} section lists"
                )
            scores: list[list[float]] = [[] for _ in req.article_sections]
            results.append(scores)
            scored = [
                i
                for i, (image, sections) in enumerate(zip(req.article_images, req.article_sections))
                if image is not None and len(sections) > 0
            ]
            if not scored:
                continue
            question_row = len(asking)
            asking.append(r)
            for i in scored:
                key = image_key(req.article_images[i]) if cacheable else ("call", r, i)
                if key not in image_rows:
                    image_rows[key] = len(image_rows)
                    if key in self._vit_cache:  # taken now: remembering new states may evict it
                        states_by_key[key] = self._recall(key)
                    else:
                        new_images.append((key, req.article_images[i]))
                scores[i] = [0.0] * len(req.article_sections[i])
                for j, text in enumerate(req.article_sections[i]):
                    flat.append((r, image_rows[key], i, j, question_row))
                    texts.append(self.prepare_text(text))
        if not asking:
            return results
        batch_size = self.section_batch_size
        with torch.inference_mode(), self._autocast():
            questions = self.tokenize_questions([requests[r].question for r in asking])
            query_states = self._encode_images([requests[r].image for r in asking])
            question_enc = self.model.encode_question(questions["input_ids"], questions["attention_mask"], query_states)
            # States that enter the LRU are encoded in forwards of exactly VIT_CHUNK images (zero-padded): a
            # forward's floats depend on its shape in the last bits, and which images a batch finds cached depends on
            # the batches before it (another rank, a resumed run); at one fixed shape each image's states depend on
            # that image alone, so every run gets the same states.
            fresh = (
                self._encode_images([image for _, image in new_images], fixed_chunks=cacheable) if new_images else None
            )
            for n, (key, _) in enumerate(new_images):
                states_by_key[key] = fresh[n]
                if cacheable:  # a copy: a view would keep the whole batch alive
                    self._remember(key, fresh[n].clone())
            image_states = torch.stack([states_by_key[key] for key in image_rows])
            ids = self.tokenizer(texts, truncation=True, max_length=self.max_text_tokens)["input_ids"]
            order = sorted(range(len(flat)), key=lambda n: len(ids[n]))
            focuses = {requests[r].focus or self.focus for r in asking}
            if len(focuses) > 1:
                raise ValueError(f"one score_sections_many call scores with one focus, got {sorted(focuses)}")
            focus = focuses.pop()
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                input_ids, attention_mask = self._pad([ids[n] for n in batch])
                image_index = torch.tensor([flat[n][1] for n in batch], device=self.device)
                question_index = torch.tensor([flat[n][4] for n in batch], device=self.device)
                states = self.model.encode_sections(
                    input_ids,
                    attention_mask,
                    image_states,
                    question_enc,
                    image_index=image_index,
                    question_index=question_index,
                    focus=focus,
                )
                tokens = question_enc.tokens.index_select(0, question_index)
                values = self.scorer.score(tokens, states)
                for n, value in zip(batch, values.tolist()):
                    r, _, i, j, _ = flat[n]
                    results[r][i][j] = value
        return results

    def _autocast(self):
        """bf16 autocast on a GPU when the model was loaded in bf16 (its Q-Former keeps fp32 weights, see
        `cast_like_hf`; its matmuls then run in bf16); nothing on CPU or in fp32."""
        import contextlib

        import torch

        if self.device.type == "cuda" and self.model.vision_dtype == torch.bfloat16:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ the ViT-state LRU cache
    def _encode_images(self, images: Sequence[Any], fixed_chunks: bool = False):
        """ViT states `[N, P, Dv]` of PIL images, in forwards of `section_batch_size` images, or (`fixed_chunks`) of
        exactly VIT_CHUNK images, the last one padded with blank images whose states are dropped."""
        import torch

        pixels = self.preprocess_images(images)
        if not fixed_chunks:
            step = self.section_batch_size
            return torch.cat([self.model.encode_image(pixels[s : s + step]) for s in range(0, len(images), step)])
        pad = -len(images) % VIT_CHUNK
        if pad:
            pixels = torch.cat([pixels, pixels.new_zeros((pad, *pixels.shape[1:]))])
        states = torch.cat(
            [self.model.encode_image(pixels[s : s + VIT_CHUNK]) for s in range(0, len(pixels), VIT_CHUNK)]
        )
        return states[: len(images)]

    def _cacheable(self) -> bool:
        """Whether article ViT states are cached: a frozen ViT and a cache size above 0. The cache is emptied when the
        ViT's weights, device or dtype changed since it was filled (`load_state_dict`, `.to(...)`)."""
        if self.vit_lru_size <= 0 or not getattr(self.model, "freeze_vit", False):
            return False
        vision = self.model.base.vision_model
        version = tuple((p.device, p.dtype, p.data_ptr(), p._version) for p in vision.parameters())
        if version != self._vit_version:
            self._vit_cache.clear()
            self._vit_version = version
        return True

    def _remember(self, key: Any, states: Any) -> None:
        self._vit_cache[key] = states
        self._vit_cache.move_to_end(key)
        while len(self._vit_cache) > self.vit_lru_size:
            self._vit_cache.popitem(last=False)
        self.vit_cache_stats["misses"] += 1

    def _recall(self, key: Any) -> Any:
        self._vit_cache.move_to_end(key)
        self.vit_cache_stats["hits"] += 1
        return self._vit_cache[key]

    def vit_cache_hit_rate(self) -> Optional[float]:
        """Hits / lookups of the article ViT-state cache so far (None before any lookup)."""
        total = self.vit_cache_stats["hits"] + self.vit_cache_stats["misses"]
        return self.vit_cache_stats["hits"] / total if total else None

    def _pad(self, sequences: Sequence[Sequence[int]]):
        import torch

        length = max(len(s) for s in sequences)
        input_ids = torch.full((len(sequences), length), self.tokenizer.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), length), dtype=torch.long)
        for row, seq in enumerate(sequences):
            input_ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            attention_mask[row, : len(seq)] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    def save_pretrained(self, out_dir: str | Path, vit_dtype: Optional[str] = None) -> Path:
        """Write the model (safetensors + qff_config.json) and tokenizer so that `pretrained: out_dir` rebuilds it;
        `vit_dtype`: the dtype the ViT ran in while it was trained (default: the model's, bf16 / fp16 / fp32)."""
        out_dir = self.model.save_pretrained(
            out_dir,
            preprocessing=self.preprocessing(),
            vit_dtype=vit_dtype or dtype_name(self.model.vision_dtype),
            scoring=self.scoring(),
        )
        self.tokenizer.save_pretrained(str(out_dir))
        return out_dir


# ---------------------------------------------------------------------- tiny model
def tiny_vision_config(options: Mapping[str, Any], default_heads: int) -> dict:
    """The tiny random ViT of `options` (keys of TINY_DEFAULTS); `default_heads` when `vision_heads` is unset."""
    o = {**TINY_DEFAULTS, **options}
    return dict(
        hidden_size=o["vision_hidden_size"],
        intermediate_size=o["mlp_ratio"] * o["vision_hidden_size"],
        num_hidden_layers=o["vision_layers"],
        num_attention_heads=o["vision_heads"] or default_heads,
        image_size=o["image_size"],
        patch_size=o["patch_size"],
        initializer_range=0.02,
    )  # the HF default (1e-10) gives a degenerate random ViT


def tiny_blip2_config(vocab_size: int, **options: Any):
    """The models.md §8 tiny `Blip2Config` with `options` (keys of TINY_DEFAULTS) applied."""
    from transformers import Blip2Config

    o = {**TINY_DEFAULTS, **options}
    return Blip2Config(
        vision_config=tiny_vision_config(o, o["num_heads"]),
        qformer_config=dict(
            vocab_size=vocab_size,
            hidden_size=o["hidden_size"],
            num_hidden_layers=o["num_layers"],
            num_attention_heads=o["num_heads"],
            intermediate_size=o["mlp_ratio"] * o["hidden_size"],
            max_position_embeddings=o["max_position_embeddings"],
            use_qformer_text_input=True,
            cross_attention_frequency=o["cross_attention_frequency"],
        ),
        num_query_tokens=o["num_query_tokens"],
        image_text_hidden_size=o["embed_dim"],
    )


def write_tiny_blip2(out_dir: str | Path, texts: Sequence[str] = (), seed: int = 0, **options: Any) -> Path:
    """Write a random tiny `Blip2ForImageTextRetrieval` and its BERT tokenizer (with `[DEC]` bos) in HF format."""
    import torch
    from transformers import Blip2ForImageTextRetrieval

    from qkvqa.components.tiny_tokenizers import load_bert_tokenizer, write_bert_vocab

    out_dir = Path(out_dir)
    write_bert_vocab(out_dir, texts)
    tokenizer = load_bert_tokenizer(out_dir, add_dec_token=True)
    config = tiny_blip2_config(len(tokenizer), **options)
    torch.manual_seed(seed)
    model = Blip2ForImageTextRetrieval(config)
    # HF zero-initialises query_tokens (all queries equal); LAVIS draws them from N(0, 0.02).
    model.query_tokens.data.normal_(std=config.qformer_config.initializer_range)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


# ---------------------------------------------------------------------- Q-Former from a BERT (init bert:<ref>)
BERT_INIT = "bert:"
BERT_INIT_FORMAT = "qkvqa-qformer-from-bert"
# options that shape the Q-Former: with init bert:<ref> they come from the BERT (option -> BERT config field); an
# option set in the config must equal the BERT's value, so that a config never says one shape and builds another
BERT_SHAPE_OPTIONS = {
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "max_position_embeddings": "max_position_embeddings",
}


def bert_init_ref(init: Optional[str]) -> Optional[str]:
    """The BERT reference of `components.qformer.init: bert:<ref>` (hub id or directory), None for another init."""
    if isinstance(init, str) and init.startswith(BERT_INIT) and init[len(BERT_INIT) :].strip():
        return init[len(BERT_INIT) :].strip()
    return None


def bert_copy_map(num_layers: int) -> dict[str, str]:
    """Blip2ForImageTextRetrieval key -> BERT key (without a `bert.` prefix) of every tensor copied as it is, as LAVIS's
    `Blip2Qformer.init_Qformer` starts BLIP-2 from BERT-base: embeddings (word embeddings apart:
    `write_bert_blip2`), every layer's self-attention and text feed-forward, and the query feed-forward copied from the
    text one (LAVIS copies each `_query` weight from its text twin). Image cross-attention and the query tokens have
    no BERT counterpart and start random."""
    pairs = {
        "embeddings.position_embeddings.weight": "embeddings.position_embeddings.weight",
        "qformer.layernorm.weight": "embeddings.LayerNorm.weight",
        "qformer.layernorm.bias": "embeddings.LayerNorm.bias",
    }
    for n in range(num_layers):
        ours, theirs = f"qformer.encoder.layer.{n}.", f"encoder.layer.{n}."
        for part in ("query", "key", "value"):
            for p in ("weight", "bias"):
                pairs[f"{ours}attention.attention.{part}.{p}"] = f"{theirs}attention.self.{part}.{p}"
        for p in ("weight", "bias"):
            pairs[f"{ours}attention.output.dense.{p}"] = f"{theirs}attention.output.dense.{p}"
            pairs[f"{ours}attention.output.LayerNorm.{p}"] = f"{theirs}attention.output.LayerNorm.{p}"
            for text, query in (("intermediate", "intermediate_query"), ("output", "output_query")):
                pairs[f"{ours}{text}.dense.{p}"] = f"{theirs}{text}.dense.{p}"
                pairs[f"{ours}{query}.dense.{p}"] = f"{theirs}{text}.dense.{p}"
            pairs[f"{ours}output.LayerNorm.{p}"] = f"{theirs}output.LayerNorm.{p}"
            pairs[f"{ours}output_query.LayerNorm.{p}"] = f"{theirs}output.LayerNorm.{p}"
    return pairs


def read_bert(bert_dir: str | Path) -> tuple[Any, dict]:
    """The BERT's config and its tensors (keys without a `bert.` prefix) from `model.safetensors`."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    bert_dir = Path(bert_dir)
    weights = bert_dir / "model.safetensors"
    if not weights.is_file():
        raise MissingWeightsError(f"{bert_dir}: no model.safetensors (components.qformer.init=bert:<ref> reads it)")
    config = AutoConfig.from_pretrained(str(bert_dir), local_files_only=True)
    if config.model_type != "bert":
        raise ConfigError(
            f"components.qformer.init=bert:<ref> needs a BERT; {bert_dir} holds a {config.model_type!r} model"
        )
    state = {k.removeprefix("bert."): v for k, v in load_file(str(weights)).items()}
    return config, state


def bert_blip2_config(bert_config: Any, **options: Any):
    """A `Blip2Config` whose Q-Former is shaped like `bert_config` (vocabulary + `[DEC]`) and whose ViT is the tiny
    one of `options` (TINY_DEFAULTS; the ViT's heads `vision_heads`, else 4)."""
    from transformers import Blip2Config

    o = {**TINY_DEFAULTS, **options}
    return Blip2Config(
        vision_config=tiny_vision_config(o, TINY_DEFAULTS["num_heads"]),
        qformer_config=dict(
            vocab_size=bert_config.vocab_size + 1,  # [DEC], BLIP-2's bos
            hidden_size=bert_config.hidden_size,
            num_hidden_layers=bert_config.num_hidden_layers,
            num_attention_heads=bert_config.num_attention_heads,
            intermediate_size=bert_config.intermediate_size,
            max_position_embeddings=bert_config.max_position_embeddings,
            hidden_act=bert_config.hidden_act,
            layer_norm_eps=bert_config.layer_norm_eps,
            hidden_dropout_prob=bert_config.hidden_dropout_prob,
            attention_probs_dropout_prob=bert_config.attention_probs_dropout_prob,
            pad_token_id=bert_config.pad_token_id,
            use_qformer_text_input=True,
            cross_attention_frequency=o["cross_attention_frequency"],
        ),
        num_query_tokens=o["num_query_tokens"],
        image_text_hidden_size=o["embed_dim"],
    )


def write_bert_blip2(
    out_dir: str | Path, bert_dir: str, bert_ref: str, bert_sha256: str, seed: int = 0, **options: Any
) -> Path:
    """Write a `Blip2ForImageTextRetrieval` whose Q-Former starts from the BERT in `bert_dir` (`bert_copy_map`), and the
    BERT's tokenizer with `[DEC]` added as bos. The BERT adds its type-0 token-type row to every token (the Q-Former
    has no token types): it is added into the word embeddings, so that the text path's input equals BERT's; `[DEC]`'s
    row starts as `[CLS]`'s. Cross-attention, the query tokens (N(0, 0.02), as LAVIS), the ViT and the heads are
    drawn from `seed`. The config records the init (`qkvqa_init`: ref, weights sha256), so every QFF trained from it
    carries it in its `qff_config.json` (`base_config`)."""
    import torch
    from transformers import AutoTokenizer, Blip2ForImageTextRetrieval

    out_dir = Path(out_dir)
    bert_config, state = read_bert(bert_dir)
    config = bert_blip2_config(bert_config, **options)
    config.qkvqa_init = {"format": BERT_INIT_FORMAT, "bert": bert_ref, "bert_weights_sha256": bert_sha256}
    torch.manual_seed(seed)
    model = Blip2ForImageTextRetrieval(config)
    model.query_tokens.data.normal_(std=config.qformer_config.initializer_range)
    tokenizer = AutoTokenizer.from_pretrained(bert_dir, local_files_only=True)
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    if tokenizer.bos_token_id != bert_config.vocab_size or len(tokenizer) != bert_config.vocab_size + 1:
        raise ConfigError(
            f"{bert_dir}: its tokenizer has {len(tokenizer) - 1} tokens besides [DEC], its model "
            f"{bert_config.vocab_size}; components.qformer.init=bert:<ref> needs a BERT whose tokenizer matches it"
        )
    ours = model.state_dict()
    with torch.no_grad():
        for key, source in bert_copy_map(bert_config.num_hidden_layers).items():
            ours[key].copy_(state[source])
        words = state["embeddings.word_embeddings.weight"] + state["embeddings.token_type_embeddings.weight"][0]
        ours["embeddings.word_embeddings.weight"][: bert_config.vocab_size].copy_(words)
        ours["embeddings.word_embeddings.weight"][bert_config.vocab_size].copy_(words[tokenizer.cls_token_id])
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return out_dir


def bert_qformer_dir(spec: ComponentSpec, options: Mapping[str, Any]) -> Path:
    """The directory of the Q-Former that `init: bert:<ref>` names (written once per content key: the BERT's weights
    sha256, its reference and the ViT's options, through `tiny_model`'s checked cache)."""
    from qkvqa.utils.io import sha256_file

    ref = bert_init_ref(spec.init)
    if spec.tiny:
        raise ConfigError(
            f"components.qformer.init={spec.init!r} builds the Q-Former from that BERT (its ViT the tiny random one of "
            "the options), components.qformer.tiny=true a random tiny one: set components.qformer.tiny=false"
        )
    bert_dir = resolve_pretrained(ComponentSpec(kind=spec.kind, pretrained=ref, allow_download=spec.allow_download))
    if not os.path.isdir(bert_dir):  # a hub id in the HF cache
        from huggingface_hub import snapshot_download

        bert_dir = snapshot_download(bert_dir, local_files_only=not spec.allow_download)
    from transformers import AutoConfig

    bert_config = AutoConfig.from_pretrained(bert_dir, local_files_only=True)
    for option, field in BERT_SHAPE_OPTIONS.items():
        if (
            option in spec.options
            and spec.options[option] is not None
            and spec.options[option] != getattr(bert_config, field)
        ):
            raise ConfigError(
                f"components.qformer.options.{option}={spec.options[option]!r}, but init {spec.init} makes a Q-Former "
                f"shaped like the BERT ({field} {getattr(bert_config, field)}): set it to that or leave it out"
            )
    if options["vocab_texts"]:
        raise ConfigError(
            f"components.qformer.options.vocab_texts builds a tiny vocabulary; init {spec.init} uses the BERT's: "
            "set it to []"
        )
    vision = {k: options[k] for k in TINY_DEFAULTS if k not in BERT_SHAPE_OPTIONS}
    sha = sha256_file(Path(bert_dir) / "model.safetensors")
    return tiny_model(spec, write_bert_blip2, str(bert_dir), ref, sha, options["seed"], **vision)


# ---------------------------------------------------------------------- loading
def _load_tokenizer(ref: str, local_only: bool):
    """A BERT tokenizer from a directory or hub id, with BLIP-2's `[DEC]` bos token added when absent."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(ref, local_files_only=local_only)
    except OSError as e:
        raise MissingWeightsError(
            f"no tokenizer at {ref!r} (local files only: {local_only}); point "
            "components.qformer.options.tokenizer at a BERT-base-uncased tokenizer directory"
        ) from e
    if tokenizer.bos_token is None:
        tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    return tokenizer


def _load_hf(ref: str, dtype, local_only: bool):
    """A stock `Blip2ForImageTextRetrieval` (from_pretrained) and its tokenizer; Q-Former fp32 for every `dtype`."""
    from transformers import Blip2ForImageTextRetrieval

    from qkvqa.qff.model import cast_like_hf

    base = Blip2ForImageTextRetrieval.from_pretrained(ref, dtype=dtype, local_files_only=local_only)
    # transformers keeps `_keep_in_fp32_modules` in fp32 for fp16 only; do the same for bf16.
    return cast_like_hf(base, dtype).eval(), _load_tokenizer(ref, local_only)


def _load_lavis(path: str, options: Mapping[str, Any], dtype, local_only: bool):
    """A `Blip2ForImageTextRetrieval` filled from a LAVIS `.pth` (plus an optional EVA ViT `.pth`) and a tokenizer."""
    from accelerate import init_empty_weights
    from transformers import Blip2Config, Blip2ForImageTextRetrieval

    from qkvqa.qff.lavis import convert_lavis_state_dict, read_lavis_checkpoint
    from qkvqa.qff.model import cast_like_hf, load_complete

    config = Blip2Config(**(options["base_config"] or ITM_VIT_G_CONFIG))
    with init_empty_weights():
        base = Blip2ForImageTextRetrieval(config)
    state = read_lavis_checkpoint(path)
    if options["vision_checkpoint"]:
        state.update(read_lavis_checkpoint(options["vision_checkpoint"], prefix="visual_encoder."))
    converted, left_out = convert_lavis_state_dict(state, config.vision_config.num_hidden_layers)
    if left_out:
        log.info(
            "LAVIS checkpoint %s: %d key(s) have no HF counterpart and were left out, e.g. %s",
            path,
            len(left_out),
            left_out[:5],
        )
    if not any(k.startswith("vision_model.encoder.") for k in converted):
        raise MissingWeightsError(
            f"{path} holds no ViT weights (LAVIS saves only trainable weights); set "
            "components.qformer.options.vision_checkpoint to EVA's eva_vit_g.pth"
        )
    load_complete(base, converted, path)
    cast_like_hf(base, dtype)
    return base.eval(), _load_tokenizer(options["tokenizer"], local_only)


def _options(spec: ComponentSpec) -> dict[str, Any]:
    from qkvqa.config.schema import QFFConfig

    unknown = sorted(set(spec.options) - set(KNOWN_OPTIONS))
    settings = [key for key in unknown if key in QFFConfig.__dataclass_fields__]
    if settings:
        raise ConfigError(
            f"components.qformer.options.{settings[0]}: {settings[0]} is a setting of the qff: section, not an option "
            f"of the component; set qff.{settings[0]} (build_qff_component(spec, qff) reads the section whole)"
        )
    if unknown:
        near = {k: difflib.get_close_matches(k, KNOWN_OPTIONS, n=2) for k in unknown}
        raise ConfigError(
            f"component {spec.kind!r}: unknown option(s) {near} (key: nearest valid names); "
            f"valid options are {sorted(KNOWN_OPTIONS)}"
        )
    return {**KNOWN_OPTIONS, **spec.options}


@register_component("blip2_qff")
def build_blip2_qff(spec: ComponentSpec, qff: Any = None) -> QFFComponent:
    """Build the QFF component from `tiny: true` or `pretrained:` = HF id/dir, LAVIS `.pth` or qkvqa checkpoint dir.

    `qff` is the `qff:` section (`qkvqa.config.schema.qff_settings`; None: the schema's defaults), read whole: the
    focus, gate, text limits, scorer, preprocessing and runtime switches all come from it. The new
    question-focused parameters are created and initialised after the base weights are loaded (HF and LAVIS paths)
    or read from the checkpoint (qkvqa path).
    """
    from qkvqa.config.schema import qff_settings
    from qkvqa.qff.image_processing import blip2_image_processor
    from qkvqa.qff.model import CHECKPOINT_CONFIG, QFFModel, resolve_focus
    from qkvqa.qff.scorers import scorer_from_qff

    if (
        spec.init != "checkpoint" and bert_init_ref(spec.init) is None
    ):  # pretrained_here: pretrain on the config's corpus
        raise ConfigError(
            f"components.qformer.init={spec.init!r} is resolved from the whole config: build it with "
            "qkvqa.qff.pretrain_here.resolve_qformer_spec(cfg) (qkvqa train and qkvqa pretrain-qformer do)"
        )
    options = _options(spec)
    qff = qff_settings(qff)
    scorer = scorer_from_qff(qff)  # before any weights load: a bad scorer stops here
    dtype = spec.torch_dtype()
    local_only = not spec.allow_download
    ref = os.path.expanduser(str(spec.pretrained)) if spec.pretrained else ""
    bert = bert_init_ref(spec.init)
    if bert is None and not spec.tiny and os.path.isdir(ref) and (Path(ref) / CHECKPOINT_CONFIG).exists():
        model = QFFModel.from_checkpoint(
            ref,
            dtype=dtype,
            freeze_vit=qff.freeze_vit,
            gradient_checkpointing=qff.gradient_checkpointing,
            attention=qff.attention,
        )
        _check_preprocessing(Path(ref), qff)
        _check_vit_dtype(Path(ref), model)
        tokenizer = _load_tokenizer(ref, local_only=True)
    else:
        if bert is not None:  # a Q-Former from a BERT, loaded like a tiny or a real BLIP-2
            base, tokenizer = _load_hf(str(bert_qformer_dir(spec, options)), dtype, local_only=True)
        elif spec.tiny:
            tiny = {k: options[k] for k in TINY_DEFAULTS}
            path = str(tiny_model(spec, write_tiny_blip2, options["vocab_texts"], options["seed"], **tiny))
            base, tokenizer = _load_hf(path, dtype, local_only=True)
        elif ref.endswith((".pth", ".pt")):
            base, tokenizer = _load_lavis(ref, options, dtype, local_only)
        else:
            base, tokenizer = _load_hf(resolve_pretrained(spec), dtype, local_only)
        model = resolve_focus(qff.focus)(
            base,
            focus=qff.focus,
            freeze_vit=qff.freeze_vit,
            gradient_checkpointing=qff.gradient_checkpointing,
            gate=qff.gate,
            gate_init=float(qff.gate_init),
            attention=qff.attention,
        )
    model.bind_tokenizer(tokenizer)  # a focus plugin that needs token ids reads them here (QFFModel.bind_tokenizer)
    model.to(spec.torch_device()).eval()
    component = QFFComponent(
        model, tokenizer, blip2_image_processor(model.image_size, qff.image_transform), qff, scorer=scorer
    )
    if bert is None and not spec.tiny and os.path.isdir(ref) and (Path(ref) / CHECKPOINT_CONFIG).exists():
        check_scoring(Path(ref), component, qff)
    return component


def check_scoring(path: Path, component: QFFComponent, qff: Any) -> None:
    """Refuse a trained QFF used with another scorer, scorer option, plugin source (scorer or focus), text limit or gate than it was
    trained with, naming the key and both values; a runtime scorer option that differs is said in one line (QFFs
    written before the scoring was recorded are checked for the gate only)."""
    import json

    from qkvqa.errors import StaleArtifactError
    from qkvqa.qff.model import CHECKPOINT_CONFIG, focus_source

    saved = json.loads((path / CHECKPOINT_CONFIG).read_text(encoding="utf-8"))
    differs = []
    focus_sha = focus_source(type(component.model)).get("focus_source_sha256")
    if saved.get("focus_source_sha256") not in (None, focus_sha):
        differs.append(("qff.focus source sha256", saved["focus_source_sha256"], focus_sha))
    if saved.get("gate") not in (None, qff.gate):
        differs.append(("qff.gate", saved["gate"], qff.gate))
    trained = saved.get("scoring") or {}
    here = component.scoring()
    runtime = set(trained.get("runtime_options", ()))
    for key in ("scorer", "scorer_source_sha256", "max_text_tokens", "question_max_tokens"):
        if key in trained and trained[key] != here.get(key):
            differs.append((f"qff.{key}", trained[key], here.get(key)))
    ours = here.get("scorer_options", {})
    for key, value in (trained.get("scorer_options") or {}).items():
        if trained.get("scorer") != here.get("scorer") or ours.get(key) == value:
            continue
        if key in runtime:
            log.info(
                "QFF %s was trained with scorer option %s=%r; this run scores with %r", path, key, value, ours.get(key)
            )
        else:
            differs.append((f"qff.scorer_options.{key}", value, ours.get(key)))
    if differs:
        said = "; ".join(f"{key}: trained with {a!r}, this config has {b!r}" for key, a, b in differs)
        raise StaleArtifactError(
            f"{path}: {said}. A trained QFF scores as it was trained: set the config to its values, or retrain "
            "(a plugin's source changed: restore the file it was trained with)"
        )


def _check_vit_dtype(path: Path, model: Any) -> Optional[str]:
    """The dtype a trained QFF's ViT ran in during training (`vit_dtype` in its config; None before it was recorded),
    said in one line when this run's ViT dtype differs (the paper trains in bf16 and evaluates in fp16; another
    pair is named on the protocol card). An unknown recorded dtype is refused."""
    import json

    from qkvqa.components.registry import DTYPES
    from qkvqa.errors import DataError
    from qkvqa.qff.model import CHECKPOINT_CONFIG

    trained = json.loads((path / CHECKPOINT_CONFIG).read_text(encoding="utf-8")).get("vit_dtype")
    if trained is None:
        return None
    if trained not in DTYPES:
        raise DataError(
            f"{path / CHECKPOINT_CONFIG}: vit_dtype {trained!r} is not one of {sorted(DTYPES)}; "
            "re-export the QFF with `qkvqa train`"
        )
    here = dtype_name(model.vision_dtype)
    if here != trained:
        log.info(
            "QFF %s was trained with its ViT in %s; this run's ViT runs in %s (components.qformer.dtype)",
            path,
            trained,
            here,
        )
    return trained


def _check_preprocessing(path: Path, qff: Any) -> None:
    """Refuse a trained QFF under other input preprocessing than it was trained with (its scores would shift in
    silence); checkpoints written before the preprocessing was recorded are not checked."""
    import json

    from qkvqa.errors import StaleArtifactError
    from qkvqa.qff.image_processing import IMAGE_GEOMETRY
    from qkvqa.qff.model import CHECKPOINT_CONFIG

    trained = json.loads((path / CHECKPOINT_CONFIG).read_text(encoding="utf-8")).get("preprocessing") or {}
    geometry = trained.get("image_geometry")
    if trained.get("image_transform") == "targetpad" and geometry != IMAGE_GEOMETRY["targetpad"]:
        raise StaleArtifactError(
            f"{path}: trained with image geometry {geometry or 'targetpad_square (unrecorded: qkvqa before the OMGM geometry)'}, which pads "
            f"wide photos to a full square; this qkvqa uses OMGM's {IMAGE_GEOMETRY['targetpad']} (a 1.25:1 pad), so "
            "most 4:3 and 3:2 images would get other pixels than in training. Retrain the QFF (`qkvqa train`)"
        )
    options = {**dataclasses.asdict(qff), "image_geometry": IMAGE_GEOMETRY.get(qff.image_transform)}
    differs = [
        f"qff.{key}: trained with {value!r}, this config has {options[key]!r}"
        for key, value in trained.items()
        if value is not None and options.get(key) != value
    ]
    if differs:
        raise StaleArtifactError(
            f"{path}: {'; '.join(differs)}. Set the config to what the QFF was trained with "
            f"(e.g. qff.{differs[0].split(':')[0][4:]}={trained[differs[0].split(':')[0][4:]]!r})"
        )


def build_qff_component(spec: ComponentSpec | Mapping[str, Any], qff: Any = None) -> QFFComponent:
    """Build the `components.qformer` spec with the `qff:` section (a `QFFConfig`, its DictConfig or a mapping; read
    whole through `qkvqa.config.schema.qff_settings`, so no key of it is left out); `qff.checkpoint`, when set,
    replaces `pretrained` (trained weights for reranking)."""
    from qkvqa.components.registry import buildable_kind, spec_from_mapping
    from qkvqa.config.schema import qff_settings

    if not isinstance(spec, ComponentSpec):
        spec = spec_from_mapping(spec)
    qff = qff_settings(qff)
    if qff.checkpoint:  # trained weights: whatever init they started from
        spec = dataclasses.replace(spec, pretrained=str(qff.checkpoint), tiny=False, init="checkpoint")
    kind, spec = buildable_kind(spec)
    if getattr(kind, "builder", None) is not build_blip2_qff:
        raise ConfigError(
            f"components.qformer.kind={spec.kind!r} is no QFF: the QFF is the blip2_qff component "
            "(its focus by qff.focus, its scorer by qff.scorer)"
        )
    return build_blip2_qff(spec, qff)
