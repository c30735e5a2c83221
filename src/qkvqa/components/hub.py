"""The hub models qkvqa loads: the files each one's builder reads, and where a download leaves them under paths.weights_dir."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Optional

# hub id -> the files its builder loads (`huggingface-cli download ID --include ...`); the README's download commands
# are these. What the patterns leave out is never read: EVA-CLIP-8B's raw EVA_CLIP_8B_psz14_s9B.pt, LLaMA-3's
# original/consolidated.*.pth, TF / Flax / ONNX exports.
HUB_FILES: dict[str, tuple[str, ...]] = {
    "BAAI/EVA-CLIP-8B": ("*.json", "*.py", "*.safetensors"),  # trust_remote_code: its modeling_*.py
    # EVA-CLIP-8B's model card loads its tokenizer from openai/clip-vit-large-patch14 (components.*.options.tokenizer)
    "openai/clip-vit-large-patch14": (
        "vocab.json",
        "merges.txt",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ),
    "Salesforce/blip2-itm-vit-g": ("*.json", "*.safetensors", "*.txt"),
    "BAAI/bge-reranker-v2-m3": ("*.json", "*.safetensors", "sentencepiece.bpe.model"),
    "Qwen/Qwen2.5-VL-7B-Instruct": ("*.json", "*.safetensors", "merges.txt"),
    "meta-llama/Meta-Llama-3-8B-Instruct": ("*.json", "model-*.safetensors"),  # gated: accept the licence first
    "kortukov/answer-equivalence-bem": ("*.json", "*.safetensors", "vocab.txt"),
    # the BERT tokenizer a LAVIS .pth checkpoint is read with (components.qformer.options.tokenizer)
    "google-bert/bert-base-uncased": ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "config.json"),
}
# hub ids also spelt without their owner (transformers resolves both)
ALIASES = {"bert-base-uncased": "google-bert/bert-base-uncased"}
GATED = ("meta-llama/Meta-Llama-3-8B-Instruct",)
# the architecture each component kind loads (config.json `architectures[0]`); a kind not listed is not compared
ARCHITECTURES = {
    "blip2_qff": ("Blip2ForImageTextRetrieval",),
    "bge_reranker": ("XLMRobertaForSequenceClassification",),
    "qwen2_5_vl": ("Qwen2_5_VLForConditionalGeneration",),
    "llama3": ("LlamaForCausalLM",),
    "reflectiva": ("LlavaForConditionalGeneration",),  # after `qkvqa convert-llava` (the release is llava_llama)
    "bem": ("BertForSequenceClassification",),
    "clip_hf": ("CLIPModel",),
}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# first path parts that name the usual local folders, not a hub owner (`weights/reflectiva-llava-hf` is a folder)
LOCAL_FOLDERS = ("weights", "checkpoints", "data", "cache", "models")
WEIGHT_FILE_SUFFIXES = (".pth", ".pt", ".bin", ".safetensors", ".ckpt")  # files that hold weights


def is_hub_id(ref: Any) -> bool:
    """Whether `ref` reads as a hub id (`owner/name`, or a known owner-less alias) rather than a path."""
    if not isinstance(ref, str) or not ref:
        return False
    if ref in ALIASES:
        return True
    return (
        bool(_HUB_ID.match(ref))
        and not ref.endswith(WEIGHT_FILE_SUFFIXES)
        and not ref.startswith((".", "~"))
        and ref.split("/")[0] not in LOCAL_FOLDERS
        and not os.path.exists(ref)
    )


def local_dir(weights_dir: str | os.PathLike, hub_id: str) -> Path:
    """Where `huggingface-cli download HUB_ID --local-dir WEIGHTS_DIR/HUB_ID` (the README's commands) leaves a model."""
    return Path(weights_dir).expanduser() / ALIASES.get(hub_id, hub_id)


def download_command(hub_id: str, weights_dir: str = "weights", revision: Optional[str] = None) -> str:
    """The README's download command of `hub_id`: only the files loaded, into the paths.weights_dir layout."""
    repo = ALIASES.get(hub_id, hub_id)
    include = " ".join(f"'{p}'" if "*" in p else p for p in HUB_FILES.get(repo, ("*.json", "*.safetensors")))
    rev = f" --revision {revision}" if revision else ""
    return f"huggingface-cli download {repo}{rev} --include {include} --local-dir {weights_dir}/{repo}"


def downloaded_revision(directory: str | os.PathLike) -> Optional[str]:
    """The hub commit a directory's files came from: the snapshot folder of an HF cache, or the commit that
    `huggingface-cli download --local-dir` records in `.cache/huggingface/download/*.metadata` (first line); None."""
    directory = Path(directory)
    if directory.parent.name == "snapshots" and re.fullmatch(r"[0-9a-f]{40}", directory.name):
        return directory.name
    meta = directory / ".cache" / "huggingface" / "download"
    for name in ("config.json.metadata", *sorted(p.name for p in meta.glob("*.metadata"))[:1]) if meta.is_dir() else ():
        try:
            first = (meta / name).read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, IndexError):
            continue
        if re.fullmatch(r"[0-9a-f]{40}", first):
            return first
    return None


def cached_snapshot(hub_id: str, revision: Optional[str] = None) -> Optional[Path]:
    """The local HF cache's snapshot folder of `hub_id` at `revision` (a branch through refs/, or a commit), found
    without the network; None when the cache does not hold it."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(ALIASES.get(hub_id, hub_id), "config.json", revision=revision)
    return Path(cached).parent if isinstance(cached, str) else None


def under_weights_dir(cfg: Any) -> None:
    """With paths.weights_dir set, every component's hub id (`pretrained`, `options.tokenizer`) becomes its folder in
    the README's download layout, `{weights_dir}/{hub id}` (preset=local_weights); paths are left as they are."""
    from omegaconf import OmegaConf

    weights_dir = OmegaConf.select(cfg, "paths.weights_dir")
    components = OmegaConf.select(cfg, "components")
    if not weights_dir or components is None or OmegaConf.is_readonly(cfg):
        return
    for name in components:
        spec = components[name]
        if spec.get("tiny"):
            continue
        if is_hub_id(spec.get("pretrained")):
            spec.pretrained = str(local_dir(weights_dir, spec.pretrained))
        options = spec.get("options") or {}
        if is_hub_id(options.get("tokenizer")):
            spec.options.tokenizer = str(local_dir(weights_dir, options["tokenizer"]))


def check_head(path: str | os.PathLike, where: str, heads: tuple[str, ...], num_labels: Optional[int] = None) -> None:
    """Refuse, before loading, a checkpoint whose config.json declares another kind of head than `heads` (class-name
    endings such as "ForSequenceClassification") or another number of labels than `num_labels`: a two-label
    cross-encoder read as BGE's one-logit reranker, or an encoder read as a generator, gives numbers and no error."""
    import json

    from qkvqa.errors import ConfigError

    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # no readable config.json: the loader's own error says so
    architectures = config.get("architectures") or []
    wrong = [a for a in architectures if not a.endswith(heads)]
    if wrong:
        raise ConfigError(
            f"{where}.pretrained: {path} is a {wrong[0]}, not a model with a {' / '.join('…' + h for h in heads)} "
            "head; point it at a checkpoint of that kind"
        )
    if num_labels is not None:
        labels = len(config["id2label"]) if isinstance(config.get("id2label"), dict) else config.get("num_labels", 2)
        if labels != num_labels:
            raise ConfigError(
                f"{where}.pretrained: {path} has {labels} output labels (config.json id2label), and this kind reads "
                f"{num_labels}; its scores would be another model's. Point it at a checkpoint with {num_labels}"
            )


TOKENIZER_FILES = (
    "tokenizer.json",
    "sentencepiece.bpe.model",
    "spiece.model",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
)


def check_tokenizer_files(path: str | os.PathLike, where: str) -> None:
    """Refuse, before loading, a local checkpoint folder with no tokenizer file (a folder downloaded with the weights
    only): transformers' error came after stage 1 and the filter had run, as a traceback (issue 44)."""
    from qkvqa.errors import MissingWeightsError

    folder = Path(path)
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise MissingWeightsError(
            f"{where}.pretrained: {folder} has no tokenizer files (none of {', '.join(TOKENIZER_FILES)}); download "
            "the checkpoint's whole folder (its tokenizer too), e.g. `huggingface-cli download HUB_ID --local-dir "
            f"{folder}`"
        )
