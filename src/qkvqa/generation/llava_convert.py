"""Convert an original LLaVA checkpoint (`model_type: llava_llama`, ReflectiVA's generator) into a transformers `LlavaForConditionalGeneration` directory."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from qkvqa.errors import DataError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

# What the converted directory records about its making; bump CONVERTER_VERSION whenever the output of a given
# source changes (key map, config, processor, template handling), so that the protocol card tells conversions apart.
CONVERTER_VERSION = 1
RECORD = "qkvqa_llava_conversion.json"
IMAGE_TOKEN = "<image>"  # llava/constants.py DEFAULT_IMAGE_TOKEN
CONV_MODE = "llama_3_1"  # the conversation ReflectiVA's release scripts use (llava/conversation.py)

# The original LLaVA layout (llava/model/language_model/llava_llama.py: LlavaLlamaForCausalLM, whose `model` is a
# LlamaModel + LlavaMetaModel) -> transformers 4.57 LlavaForConditionalGeneration. mm_projector is an nn.Sequential
# (llava/model/multimodal_projector/builder.py, mlp2x_gelu: Linear, GELU, Linear), hence indexes 0 and 2.
KEY_MAP: tuple[tuple[str, str], ...] = (
    (r"^model\.embed_tokens\.", "model.language_model.embed_tokens."),
    (r"^model\.layers\.", "model.language_model.layers."),
    (r"^model\.norm\.", "model.language_model.norm."),
    (r"^lm_head\.", "lm_head."),
    (r"^model\.mm_projector\.0\.", "model.multi_modal_projector.linear_1."),
    (r"^model\.mm_projector\.2\.", "model.multi_modal_projector.linear_2."),
    # a CLIPVisionTower saved inside the checkpoint: CLIPVisionTower.vision_tower is a CLIPVisionModel
    (r"^model\.vision_tower\.vision_tower\.vision_model\.", "model.vision_tower.vision_model."),
)
DROPPED = (r"\.rotary_emb\.inv_freq$",)  # buffers older transformers saved; recomputed on load
VISION_PREFIX = "model.vision_tower.vision_model."
EMBED_KEYS = ("model.language_model.embed_tokens.weight", "lm_head.weight")
# config.json fields of the LLaVA layout that transformers' Llava has no place for, or that must hold one value
SUPPORTED = {
    "mm_projector_type": ("mlp2x_gelu",),  # LlavaMultiModalProjector: linear_1, act, linear_2
    "mm_patch_merge_type": ("flat", None),  # 'spatial*'/'unpad' is LLaVA-NeXT, not Llava
    "image_aspect_ratio": ("pad", "square", None),  # 'anyres' is LLaVA-NeXT
    "mm_vision_select_feature": ("patch", "cls_patch", None),
    "mm_use_im_start_end": (False, None),
    "s2": (False, None),
    "siglip": (False, None),
}
FEATURE_STRATEGY = {"patch": "default", None: "default", "cls_patch": "full"}  # clip_encoder.py feature_select
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _fail(path: Path, field: str, problem: str) -> DataError:
    return DataError(f"{path}: {field}: {problem}")


def read_json(path: Path) -> dict:
    """A JSON object from `path`, or a DataError naming the file."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: missing (expected an original LLaVA checkpoint directory)") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not readable JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a JSON object")
    return obj


def check_source_config(src: Path) -> dict:
    """The source's config.json, refused (file and field named) unless it is the LLaVA layout this converter maps."""
    path = src / "config.json"
    config = read_json(path)
    if config.get("model_type") != "llava_llama":
        raise _fail(
            path,
            "model_type",
            f"is {config.get('model_type')!r}, not 'llava_llama' (the original LLaVA "
            "layout); a transformers Llava directory needs no conversion",
        )
    for field in ("mm_vision_tower", "mm_hidden_size", "hidden_size", "vocab_size"):
        if field not in config:
            raise _fail(path, field, "missing (every LLaVA checkpoint records it)")
    if not isinstance(config.get("mm_vision_select_layer"), int):
        raise _fail(path, "mm_vision_select_layer", f"is {config.get('mm_vision_select_layer')!r}, not an integer")
    for field, allowed in SUPPORTED.items():
        if config.get(field) not in allowed:
            raise _fail(
                path,
                field,
                f"is {config.get(field)!r}; transformers' LlavaForConditionalGeneration "
                f"reproduces only {[a for a in allowed if a is not None]}",
            )
    return config


def _weight_files(src: Path) -> list[Path]:
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if (src / index).exists():
            weight_map = read_json(src / index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise _fail(src / index, "weight_map", "missing or empty")
            return [src / name for name in sorted(set(weight_map.values()))]
    for pattern in ("*.safetensors", "pytorch_model*.bin"):
        found = sorted(src.glob(pattern))
        if found:
            return found
    raise DataError(f"{src}: no weights (model.safetensors[.index.json] or pytorch_model*.bin)")


def _tensors(path: Path) -> Iterator[tuple[str, Any]]:
    """(key, tensor) of one weight file, safetensors read lazily."""
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as handle:
            for key in handle.keys():
                yield key, handle.get_tensor(key)
    else:
        import torch

        yield from torch.load(str(path), map_location="cpu", weights_only=True).items()


def map_key(key: str) -> Optional[str]:
    """The transformers Llava name of an original LLaVA key; None for a buffer that is not carried over."""
    if any(re.search(pattern, key) for pattern in DROPPED):
        return None
    for pattern, replacement in KEY_MAP:
        if re.match(pattern, key):
            return re.sub(pattern, replacement, key, count=1)
    raise KeyError(key)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def fingerprint(files: list[Path], root: Path) -> dict:
    """{sha256 over the files' names, sizes and contents, files: {name: {size, sha256}}} of what was read."""
    entries = {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in sorted(set(files))}
    lines = "".join(f"{name}\0{e['size']}\0{e['sha256']}\n" for name, e in entries.items())
    return {"sha256": hashlib.sha256(lines.encode("utf-8")).hexdigest(), "files": entries}


def hub_origin(src: Path) -> dict:
    """The hub id and commit of a source found in the HF cache (`models--OWNER--NAME/snapshots/COMMIT`), or the commit
    that `huggingface-cli download --local-dir` records; empty when unknown."""
    real = src.resolve()
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        owner_name = real.parent.parent.name[len("models--") :].split("--", 1)
        return {"hub_id": "/".join(owner_name), "revision": real.name}
    meta = src / ".cache" / "huggingface" / "download" / "config.json.metadata"
    try:
        first = meta.read_text(encoding="utf-8").splitlines()[0].strip()
    except (OSError, IndexError):
        return {}
    return {"revision": first} if re.fullmatch(r"[0-9a-f]{40}", first) else {}


def _vision_config(tower: Path) -> tuple[dict, Path]:
    path = tower / "config.json"
    config = read_json(path)
    if config.get("model_type") == "clip":
        vision = dict(config.get("vision_config") or {})
        if not vision:
            raise _fail(path, "vision_config", "missing from a CLIP config")
    elif config.get("model_type") == "clip_vision_model":
        vision = dict(config)
    else:
        raise _fail(
            path,
            "model_type",
            f"is {config.get('model_type')!r}, not 'clip' or 'clip_vision_model' "
            "(LLaVA's CLIPVisionTower loads a CLIPVisionModel)",
        )
    vision["model_type"] = "clip_vision_model"
    for key in ("architectures", "transformers_version", "_name_or_path"):
        vision.pop(key, None)
    return vision, path


def _vision_tensors(tower: Path) -> Iterator[tuple[str, Any]]:
    """The vision tower's `vision_model.*` weights as Llava keys (a CLIPModel's text tower and projections are left)."""
    for path in _weight_files(tower):
        for key, tensor in _tensors(path):
            if key.startswith("vision_model."):
                if not key.endswith("position_ids"):
                    yield VISION_PREFIX + key[len("vision_model.") :], tensor


def image_processor_for(tower: Path, aspect_ratio: Optional[str]):
    """LlavaImageProcessor with the tower's CLIP preprocessing; do_pad reproduces llava/mm_utils.py `expand2square`
    (the padding colour is int(mean * 255) per channel, the image pasted at the centre) for image_aspect_ratio 'pad'."""
    from transformers import LlavaImageProcessor

    path = tower / "preprocessor_config.json"
    pre = read_json(path)
    keys = (
        "do_resize",
        "size",
        "resample",
        "do_center_crop",
        "crop_size",
        "do_rescale",
        "rescale_factor",
        "do_normalize",
        "image_mean",
        "image_std",
        "do_convert_rgb",
    )
    kwargs = {k: pre[k] for k in keys if k in pre}
    if not kwargs.get("image_mean"):
        raise _fail(path, "image_mean", "missing (the pad colour and normalisation need it)")
    return LlavaImageProcessor(do_pad=aspect_ratio == "pad", **kwargs)


def _text_config(config: dict, vocab_size: int) -> tuple[dict, list[str]]:
    from transformers import LlamaConfig

    llama_keys = set(LlamaConfig().to_dict()) | {"rope_scaling", "head_dim"}
    llama_keys -= {"architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype", "dtype"}
    text = {k: v for k, v in config.items() if k in llama_keys}
    text.update(model_type="llama", vocab_size=vocab_size)
    dropped = sorted(
        k
        for k in config
        if k not in llama_keys
        and k not in ("architectures", "model_type", "transformers_version", "_name_or_path", "torch_dtype", "dtype")
    )
    return text, dropped


def convert_llava(
    src: str | os.PathLike,
    out: str | os.PathLike,
    vision_tower: Optional[str | os.PathLike] = None,
    source_id: Optional[str] = None,
    progress: Callable[[str], None] = log.info,
) -> dict:
    """Write `out` (a new or empty directory): the LLaVA checkpoint `src` as a transformers Llava model, processor
    and chat template; returns the conversion record (also written to `out/RECORD`).

    The vision tower comes from `vision_tower` (a CLIP directory, as LLaVA's builder loads it from config
    `mm_vision_tower`) unless the config says `unfreeze_mm_vision_tower: true`, in which case LLaVA loads the
    checkpoint's own `model.vision_tower.*` weights, and so does this.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaProcessor

    from qkvqa.utils.io import atomic_write_json, make_shareable

    src, out = Path(src).expanduser(), Path(out).expanduser()
    if not src.is_dir():
        raise DataError(f"{src}: not a directory (expected an original LLaVA checkpoint directory)")
    config = check_source_config(src)
    tower_from_checkpoint = bool(config.get("unfreeze_mm_vision_tower"))
    if vision_tower is None and not tower_from_checkpoint:
        raise DataError(
            f"{src / 'config.json'}: mm_vision_tower: LLaVA loads the vision tower from "
            f"{config['mm_vision_tower']!r}, which the checkpoint does not hold; pass its directory "
            "(--vision-tower DIR, e.g. `huggingface-cli download openai/clip-vit-large-patch14-336 "
            "--local-dir weights/openai/clip-vit-large-patch14-336`)"
        )
    tower = Path(vision_tower).expanduser() if vision_tower is not None else None
    if out.exists() and any(out.iterdir()):
        raise DataError(f"{out}: exists and is not empty; converting writes a new directory")

    vision, vision_config_path = _vision_config(tower) if tower is not None else (None, None)
    weight_files = _weight_files(src)
    tokenizer_files = [src / name for name in TOKENIZER_FILES if (src / name).exists()]
    if not (src / "tokenizer_config.json").exists():
        raise DataError(
            f"{src / 'tokenizer_config.json'}: missing (ReflectiVA renders its prompt with the "
            "checkpoint's own tokenizer and chat template: TOKENIZER_PATH=$model)"
        )
    tokenizer = AutoTokenizer.from_pretrained(str(src), use_fast=True, local_files_only=True)
    if not tokenizer.chat_template:
        raise _fail(
            src / "tokenizer_config.json",
            "chat_template",
            "missing (conv 'llama_3_1' is rendered by tokenizer.apply_chat_template)",
        )
    if IMAGE_TOKEN in tokenizer.get_vocab():
        raise _fail(
            src / "tokenizer_config.json",
            "added_tokens",
            f"{IMAGE_TOKEN!r} is already a token; LLaVA "
            "marks the image with id -200 outside the vocabulary, so a source with this token is not one "
            "this converter knows",
        )

    # <image>: the first id after the tokenizer's vocabulary. LLaVA splices the image where id -200 stands
    # (llava/mm_utils.py tokenizer_image_token); transformers' Llava needs a real id, expanded to one token per
    # image feature by the processor and replaced by the features (masked_scatter). Its embedding row is never
    # read; its lm_head row is added (the mean of the others) only when the id lies past the checkpoint's rows,
    # and generation suppresses it.
    image_token_id = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]}, replace_additional_special_tokens=False)
    if tokenizer.convert_tokens_to_ids(IMAGE_TOKEN) != image_token_id:
        raise DataError(f"{src}: the tokenizer did not give {IMAGE_TOKEN!r} the id {image_token_id}")
    source_rows = int(config["vocab_size"])
    vocab_size = max(source_rows, image_token_id + 1)
    text, dropped_fields = _text_config(config, vocab_size)

    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    try:
        progress(f"converting {src} -> {out}")
        count = len(weight_files) + (0 if tower_from_checkpoint else 1)
        names = iter(f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count))
        weight_map: dict[str, str] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        ignored: list[str] = []
        found_vision = 0

        def write_shard(shard: dict[str, Any], origin: str) -> None:
            name = next(names)
            save_file(shard, str(partial / name), metadata={"format": "pt"})
            weight_map.update({key: name for key in shard})
            shapes.update({key: tuple(t.shape) for key, t in shard.items()})
            progress(f"{origin}: {len(shard)} tensors -> {name}")

        for path in weight_files:  # one shard in memory at a time
            shard: dict[str, Any] = {}
            for key, tensor in _tensors(path):
                try:
                    new = map_key(key)
                except KeyError:
                    raise _fail(
                        path,
                        key,
                        "is not a key of the LLaVA layout this converter maps (model.embed_tokens, "
                        "model.layers.*, model.norm, lm_head, model.mm_projector.0/2, "
                        "model.vision_tower.vision_tower.vision_model.*)",
                    ) from None
                if new is None:
                    continue
                if new.startswith(VISION_PREFIX):
                    found_vision += 1
                    if not tower_from_checkpoint:
                        # LLaVA builds the tower with delay_load and loads it from mm_vision_tower: saved keys unused
                        ignored.append(key)
                        continue
                if new in weight_map or new in shard:
                    raise _fail(path, key, f"maps to {new}, which another key already gave")
                if new in EMBED_KEYS and vocab_size > tensor.shape[0]:
                    mean = tensor.float().mean(0, keepdim=True).to(tensor.dtype)
                    extra = mean.expand(vocab_size - tensor.shape[0], -1)
                    tensor = torch.cat([tensor, extra], 0)
                shard[new] = tensor.contiguous()
            write_shard(shard, path.name)
            del shard
        if tower_from_checkpoint:
            if not found_vision:
                raise _fail(
                    src / "config.json",
                    "unfreeze_mm_vision_tower",
                    "is true, so LLaVA loads the vision "
                    "tower from the checkpoint, but it holds no model.vision_tower.* keys",
                )
            if vision is None:
                raise DataError(
                    f"{src}: pass --vision-tower (its config.json and preprocessor_config.json give the "
                    "tower's architecture and image preprocessing)"
                )
        else:
            write_shard(dict(_vision_tensors(tower)), str(tower))
        required = [
            "model.language_model.embed_tokens.weight",
            "model.language_model.norm.weight",
            "model.multi_modal_projector.linear_1.weight",
            "model.multi_modal_projector.linear_2.weight",
            VISION_PREFIX + "embeddings.patch_embedding.weight",
        ]
        if not text.get("tie_word_embeddings"):
            required.append("lm_head.weight")
        for key in required:
            if key not in weight_map:
                raise DataError(
                    f"{src}: weights: no tensor for {key} (mapped names) in {[p.name for p in weight_files]}"
                )
        atomic_write_json(partial / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})

        vision_cfg = CLIPVisionConfig(**vision)
        select_feature = config.get("mm_vision_select_feature")
        strategy = FEATURE_STRATEGY[select_feature]
        patches = (vision_cfg.image_size // vision_cfg.patch_size) ** 2
        proj = shapes["model.multi_modal_projector.linear_1.weight"]
        if proj != (text["hidden_size"], vision_cfg.hidden_size):
            raise _fail(
                src / "config.json",
                "mm_hidden_size",
                f"the projector's first layer is {proj}, not "
                f"(hidden_size, vision hidden_size) = ({text['hidden_size']}, {vision_cfg.hidden_size})",
            )
        llava = LlavaConfig(
            vision_config=vision_cfg.to_dict(),
            text_config=LlamaConfig(**text).to_dict(),
            image_token_index=image_token_id,
            projector_hidden_act="gelu",  # builder.py: nn.GELU() (exact)
            vision_feature_select_strategy=strategy,
            vision_feature_layer=int(config["mm_vision_select_layer"]),
            image_seq_length=patches + (1 if strategy == "full" else 0),
            multimodal_projector_bias=True,
            tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
        )
        llava.architectures = ["LlavaForConditionalGeneration"]
        if config.get("torch_dtype") or config.get("dtype"):  # the weights keep the source's dtype
            llava.dtype = config.get("dtype") or config["torch_dtype"]
        llava.save_pretrained(str(partial))

        processor = LlavaProcessor(
            image_processor=image_processor_for(tower if tower is not None else src, config.get("image_aspect_ratio")),
            tokenizer=tokenizer,
            patch_size=vision_cfg.patch_size,
            vision_feature_select_strategy=strategy,
            num_additional_image_tokens=1,
            image_token=IMAGE_TOKEN,
            chat_template=tokenizer.chat_template,
        )
        processor.save_pretrained(str(partial))
        for name in ("generation_config.json",):
            if (src / name).exists():
                shutil.copyfile(src / name, partial / name)

        origin = hub_origin(src)
        if source_id:
            origin["hub_id"] = source_id
        read = weight_files + tokenizer_files + [src / "config.json"]
        record = {
            "converter": "qkvqa.generation.llava_convert",
            "converter_version": CONVERTER_VERSION,
            "source": {"path": str(src.resolve()), **origin, "fingerprint": fingerprint(read, src)},
            "vision_tower": {
                "path": str(tower.resolve()) if tower is not None else None,
                "name": config["mm_vision_tower"],
                "weights_from": "checkpoint" if tower_from_checkpoint else "vision_tower_dir",
                "fingerprint": (
                    fingerprint(_weight_files(tower) + [vision_config_path, tower / "preprocessor_config.json"], tower)
                    if tower is not None
                    else None
                ),
            },
            "ignored_keys": len(ignored),
            "image_token": {
                "token": IMAGE_TOKEN,
                "id": image_token_id,
                "source_rows": source_rows,
                "rows_added": vocab_size - source_rows,
            },
            "llava": {
                "mm_vision_select_layer": config["mm_vision_select_layer"],
                "mm_vision_select_feature": select_feature or "patch",
                "mm_projector_type": config.get("mm_projector_type"),
                "image_aspect_ratio": config.get("image_aspect_ratio"),
                "tokenizer_model_max_length": config.get("tokenizer_model_max_length"),
                "tokenizer_padding_side": config.get("tokenizer_padding_side"),
                "conv_mode": CONV_MODE,
            },
            "dropped_config_fields": dropped_fields,
        }
        atomic_write_json(partial / RECORD, record)
        make_shareable(partial)
        if out.exists():
            out.rmdir()
        os.rename(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    progress(
        f"wrote {out} (source sha256 {record['source']['fingerprint']['sha256'][:12]}, converter {CONVERTER_VERSION})"
    )
    return record


def read_record(directory: str | os.PathLike) -> Optional[dict]:
    """The conversion record of a converted directory, or None when it has none."""
    path = Path(directory) / RECORD
    return read_json(path) if path.exists() else None


def card_fields(directory: str | os.PathLike) -> Optional[dict]:
    """What a protocol card shows of a converted directory: source hub id and revision, source sha256, the converter
    version that wrote it and whether it is this code's, the tower and where its weights came from; None when the
    directory holds no record."""
    record = read_record(directory)
    if record is None:
        return None
    source, tower = record.get("source") or {}, record.get("vision_tower") or {}
    return {
        "converted_from": source.get("hub_id"),
        "revision": source.get("revision"),
        "source_sha256": (source.get("fingerprint") or {}).get("sha256"),
        "converter_version": record.get("converter_version"),
        "converter_current": record.get("converter_version") == CONVERTER_VERSION,
        "vision_tower": tower.get("name"),
        "vision_tower_weights": tower.get("weights_from"),
        "vision_tower_sha256": (tower.get("fingerprint") or {}).get("sha256"),
    }
