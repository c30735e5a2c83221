"""The doctor's model checks: each model directory's config (architecture, dtype, revision, files), its load on the meta device, one forward."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from qkvqa.components.hub import (
    ARCHITECTURES,
    HUB_FILES,
    cached_snapshot,
    download_command,
    downloaded_revision,
    is_hub_id,
)
from qkvqa.doctor.report import Check
from qkvqa.errors import QkvqaError

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "sentencepiece.bpe.model", "tokenizer.model")
# model card examples with a known output (checked by the forward of `--load --device cuda`)
BEM_CARD_EXAMPLE = (
    "how is the weather in california",
    "infrequent rain",
    "rain",
)  # kortukov/answer-equivalence-bem: ~0
# BAAI/EVA-CLIP-8B's model card classifies its CLIP.png, a diagram, with these captions: "a diagram" first. The
# picture is not shipped here; `card_diagram` draws one of the same kind (labelled boxes joined by arrows).
EVACLIP_CARD_CAPTIONS = ("a diagram", "a dog", "a cat")
# BAAI/bge-reranker-v2-m3's model card scores these two pairs: the panda passage above the greeting
RERANKER_CARD_PAIRS = [
    ("what is panda?", "hi"),
    (
        "what is panda?",
        "The giant panda (Ailuropoda melanoleuca), sometimes called a panda bear or "
        "simply panda, is a bear species endemic to China.",
    ),
]


def used_models(cfg: Any) -> list[str]:
    """The components the config's task loads: an evaluation's (qkvqa.pipeline.protocol.used_components); training's
    Q-Former and the stage-1 encoders that mining uses."""
    from qkvqa.pipeline.protocol import used_components

    if cfg.task == "train":
        return ["qformer", "image_encoder"] + (["text_encoder"] if cfg.retrieval.mode == "image_to_summary" else [])
    if cfg.task in ("retrieve",):
        return ["image_encoder"] + (["text_encoder"] if cfg.retrieval.mode == "image_to_summary" else [])
    if cfg.task == "rerank":
        return ["qformer"]
    return used_components(cfg)


def model_directory(spec: Any, weights_dir: Optional[str] = None) -> tuple[Optional[Path], str]:
    """(directory holding the model's files or None, how it was found / why not: for a folder of the paths.weights_dir
    layout, the download command that fills it)."""
    ref = os.path.expanduser(str(spec.pretrained))
    if os.path.isdir(ref):
        return Path(ref), "local directory"
    if is_hub_id(spec.pretrained) and not ref.startswith("/"):
        snapshot = cached_snapshot(ref, spec.revision)
        if snapshot is not None:
            return snapshot, "HF cache"
        at = f" at revision {spec.revision}" if spec.revision else ""
        return None, (
            f"hub id {ref}{at} is not in the local HF cache and there is no directory of that name; "
            f"download: {download_command(ref, revision=spec.revision if _is_commit(spec.revision) else None)} "
            f"and set paths.weights_dir=weights (preset=local_weights)"
        )
    hub_id = _hub_id_under(ref, weights_dir)
    if hub_id is not None:
        return None, (
            f"no directory at {ref}: download it with "
            f"`{download_command(hub_id, str(weights_dir), _commit_or_none(spec.revision))}` (README 'Weights')"
        )
    return None, (
        f"no directory at {ref}: download the weights there (`huggingface-cli download <hub id> --include ... "
        f"--local-dir {ref}`, README 'Weights') or fix components.<name>.pretrained / paths.weights_dir"
    )


def _hub_id_under(ref: str, weights_dir: Optional[str]) -> Optional[str]:
    """The hub id whose paths.weights_dir folder `ref` is, or None."""
    if not weights_dir:
        return None
    try:
        relative = Path(ref).relative_to(Path(os.path.expanduser(str(weights_dir))))
    except ValueError:
        return None
    return str(relative) if len(relative.parts) == 2 else None


def _commit_or_none(revision: Optional[str]) -> Optional[str]:
    return revision if _is_commit(revision) else None


def _is_commit(revision: Optional[str]) -> bool:
    return bool(revision) and bool(re.fullmatch(r"[0-9a-f]{40}", str(revision)))


def weight_files(directory: Path) -> tuple[list[str], list[str], int]:
    """(weight files present, weight files an index lists but are absent, total bytes)."""
    present, absent = [], []
    for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        index = directory / index_name
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
            present += [s for s in shards if (directory / s).is_file()]
            absent += [s for s in shards if not (directory / s).is_file()]
            break
    else:
        present = [p.name for p in sorted(directory.glob("*.safetensors"))] or [
            p.name for p in sorted(directory.glob("pytorch_model*.bin"))
        ]
    size = sum((directory / p).stat().st_size for p in present)
    return present, absent, size


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _tokenizer_check(ref: str, kind: str) -> Optional[str]:
    """None when a tokenizer is found at `ref` (a directory, or a cached hub id), else the problem."""
    path = os.path.expanduser(ref)
    if os.path.isdir(path):
        return (
            None
            if any((Path(path) / f).is_file() for f in TOKENIZER_FILES)
            else f"tokenizer directory {path} holds none of {', '.join(TOKENIZER_FILES)}"
        )
    if is_hub_id(ref):
        from huggingface_hub import try_to_load_from_cache

        for name in ("tokenizer_config.json", "vocab.txt", "vocab.json"):
            if isinstance(try_to_load_from_cache(ref, name), str):
                return None
        return f"tokenizer {ref} is not in the local HF cache: {download_command(ref)}"
    return f"no tokenizer directory at {path}"


def _kind(spec: Any):
    """The ComponentKind of `spec` (None for a kind nobody registered: the config check names it)."""
    from qkvqa.components.registry import component_kind
    from qkvqa.errors import ConfigError

    try:
        return component_kind(spec.kind)
    except ConfigError:
        return None


def describe_directory(name: str, spec: Any, directory: Path) -> Check:
    """The config.json of one model directory: architecture (against the kind's), dtype, revision (against the pinned
    one), weight files (every shard an index lists), tokenizer and remote code files."""
    item = f"components.{name}"
    config_path = directory / "config.json"
    if not config_path.is_file():
        return Check("models", item, "fail", f"{directory} has no config.json: not a downloaded model directory")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except ValueError as e:
        return Check("models", item, "fail", f"{config_path}: malformed JSON ({e})")
    problems, notes = [], []
    arch = (config.get("architectures") or [config.get("model_type", "?")])[0]
    expected = ARCHITECTURES.get(spec.kind)
    if expected and arch not in expected:
        problems.append(f"architecture {arch}, but kind {spec.kind} loads {' or '.join(expected)}")
    dtype = config.get("torch_dtype") or config.get("dtype") or "?"
    present, absent, size = weight_files(directory)
    if absent:
        problems.append(f"{len(absent)} weight shard(s) its index lists are missing, e.g. {absent[0]}")
    elif not present:
        problems.append("no weight files (*.safetensors or pytorch_model*.bin)")
    revision = downloaded_revision(directory)
    if _is_commit(spec.revision) and revision is not None and revision != spec.revision:
        problems.append(
            f"revision {revision[:12]} downloaded, {spec.revision[:12]} pinned (components.{name}.revision)"
        )
    elif _is_commit(spec.revision) and revision is None:
        notes.append(f"pinned {spec.revision[:12]}, the download recorded none")
    kind = _kind(spec)
    if kind is not None and kind.remote_code:
        auto_map = config.get("auto_map") or {}
        modules = sorted({str(v).split(".")[0] for v in auto_map.values() if isinstance(v, str) and "--" not in v})
        lacking = [m for m in modules if not (directory / f"{m}.py").is_file()]
        if not auto_map:
            problems.append("config.json has no auto_map (trust_remote_code has no model code to load)")
        elif lacking:
            problems.append(f"remote code missing: {', '.join(m + '.py' for m in lacking)}")
    tokenizer_ref = (
        kind.doctor_tokenizer_ref(spec, directory)
        if kind is not None
        else (spec.options or {}).get("tokenizer") or str(directory)
    )
    if tokenizer_ref is not None:
        problem = _tokenizer_check(str(tokenizer_ref), spec.kind)
        fix = kind.tokenizer_fix(spec, name) if problem and kind is not None else ""
        if problem:
            problems.append(f"{problem}; {fix}" if fix else problem)
    status = "fail" if problems else "warn" if not _is_commit(spec.revision) and revision is None else "ok"
    rev_text = revision[:12] if revision else "unrecorded"
    if not _is_commit(spec.revision):
        rev_text += f" (components.{name}.revision={spec.revision or 'null'}: not pinned)"
    detail = (
        f"{spec.kind} {directory}: {arch}, checkpoint dtype {dtype} (loaded as {spec.dtype}), revision {rev_text}, "
        f"{len(present)} weight file(s) {_gib(size)}"
    )
    if notes:
        detail += "; " + "; ".join(notes)
    if problems:
        detail += "; " + "; ".join(problems)
    return Check("models", item, status, detail)


def describe_lavis(name: str, spec: Any) -> Check:
    """A LAVIS `.pth` Q-Former: the file, EVA's eva_vit_g.pth (options.vision_checkpoint) and the BERT tokenizer."""
    item = f"components.{name}"
    options = spec.options or {}
    path = Path(os.path.expanduser(str(spec.pretrained)))
    problems = [] if path.is_file() else [f"{path}: not found"]
    vision = options.get("vision_checkpoint")
    if not vision:
        problems.append(
            "options.vision_checkpoint is not set: LAVIS saves no ViT weights in blip2_pretrained.pth; "
            "point it at EVA's eva_vit_g.pth"
        )
    elif not Path(os.path.expanduser(str(vision))).is_file():
        problems.append(f"options.vision_checkpoint {vision}: not found")
    problem = _tokenizer_check(str(options.get("tokenizer") or "bert-base-uncased"), spec.kind)
    if problem:
        problems.append(problem)
    size = path.stat().st_size if path.is_file() else 0
    return Check(
        "models",
        item,
        "fail" if problems else "ok",
        f"LAVIS checkpoint {path} ({_gib(size)}), ViT {vision}, tokenizer "
        f"{options.get('tokenizer') or 'bert-base-uncased'}" + ("; " + "; ".join(problems) if problems else ""),
    )


def model_checks(cfg: Any, names: list[str]) -> list[Check]:
    """One row per used component (and the trained QFF of an evaluation)."""
    from qkvqa.components.registry import spec_from_mapping

    checks = []
    for name in names:
        try:
            spec = spec_from_mapping(OmegaConf.to_container(cfg.components[name], resolve=True))
        except QkvqaError as e:
            checks.append(Check("models", f"components.{name}", "fail", str(e)))
            continue
        if spec.tiny:
            checks.append(Check("models", f"components.{name}", "ok", f"{spec.kind}: tiny random model (tiny: true)"))
            continue
        if not spec.pretrained:
            checks.append(
                Check("models", f"components.{name}", "fail", f"{spec.kind}: neither pretrained nor tiny set")
            )
            continue
        if str(spec.pretrained).endswith((".pth", ".pt")):
            checks.append(describe_lavis(name, spec))
            continue
        directory, how = model_directory(spec, cfg.paths.weights_dir)
        if directory is None:
            checks.append(Check("models", f"components.{name}", "fail", f"{spec.kind}: {how}"))
            continue
        from qkvqa.qff.model import CHECKPOINT_CONFIG

        if (directory / CHECKPOINT_CONFIG).is_file():
            checks.append(
                Check("models", f"components.{name}", "ok", f"{spec.kind}: a trained qkvqa QFF at {directory}")
            )
            continue
        checks.append(describe_directory(name, spec, directory))
    return checks


def load_checks(cfg: Any, names: list[str], device: str = "meta") -> list[Check]:
    """`--load`: each used model instantiated on the meta device from its config (no weights read), its parameter names
    compared with the checkpoint's; tiny models are built for real. With `device` cuda: built on the GPU, one forward
    on a fixed example (the BEM model card's example must come out not equivalent)."""
    from qkvqa.components.registry import spec_from_mapping

    checks = []
    for name in names:
        item = f"load {name}"
        try:
            spec = spec_from_mapping(OmegaConf.to_container(cfg.components[name], resolve=True))
            if device != "meta" or spec.tiny:
                if device != "meta":
                    spec.device = device
                checks.append(_forward(item, spec, real=device != "meta"))
            elif str(spec.pretrained).endswith((".pth", ".pt")):
                checks.append(Check("models", item, "ok", "LAVIS checkpoint: loaded only with --device cuda"))
            else:
                directory, how = model_directory(spec, cfg.paths.weights_dir)
                checks.append(Check("models", item, "fail", how) if directory is None else _meta(item, spec, directory))
        except Exception as e:
            checks.append(Check("models", item, "fail", f"{type(e).__name__}: {e}"))
    return checks


def _meta(item: str, spec: Any, directory: Path) -> Check:
    """Instantiate the directory's architecture on the meta device and compare parameter names with the checkpoint."""
    import time

    import torch
    import transformers
    from transformers import AutoConfig, AutoModel

    start = time.perf_counter()
    remote = bool(getattr(_kind(spec), "remote_code", False))
    config = AutoConfig.from_pretrained(str(directory), trust_remote_code=remote, local_files_only=True)
    arch = (getattr(config, "architectures", None) or [None])[0]
    cls = getattr(transformers, arch, None) if arch else None
    with torch.device("meta"):
        model = (
            cls._from_config(config)
            if cls is not None and not remote
            else AutoModel.from_config(config, trust_remote_code=remote)
        )
    params = sum(p.numel() for p in model.parameters())
    wanted = set(model.state_dict())
    stored = _checkpoint_keys(directory)
    count = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params:,}"
    detail = f"{type(model).__name__} on the meta device, {count} parameters ({time.perf_counter() - start:.1f}s)"
    if stored is None:
        return Check("models", item, "ok", detail + "; checkpoint parameter names not read (.bin)")
    prefix = getattr(model, "base_model_prefix", "") or ""
    normal = {k[len(prefix) + 1 :] if prefix and k.startswith(prefix + ".") else k for k in stored}
    lacking = [
        k for k in wanted if k not in stored and k not in normal and (not prefix or f"{prefix}.{k}" not in stored)
    ]
    if lacking:
        return Check(
            "models",
            item,
            "warn",
            detail + f"; {len(lacking)} of {len(wanted)} parameters not in the "
            f"checkpoint (tied or newly initialised?), e.g. {sorted(lacking)[0]}",
        )
    return Check("models", item, "ok", detail + f"; all {len(wanted)} parameters in the checkpoint")


def _checkpoint_keys(directory: Path) -> Optional[set[str]]:
    """The tensor names of a safetensors checkpoint (headers only), or None for another format."""
    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    keys: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            keys |= set(f.keys())
    return keys


def card_diagram():
    """A diagram as EVA-CLIP's model card example is one: three labelled boxes joined by arrows, black on white."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (336, 224), "white")
    draw = ImageDraw.Draw(image)
    boxes = [(16, 80, 96, 140), (128, 20, 208, 80), (128, 144, 208, 204), (240, 80, 320, 140)]
    for (x0, y0, x1, y1), label in zip(boxes, ("Input", "Encoder", "Decoder", "Output")):
        draw.rectangle((x0, y0, x1, y1), outline="black", width=3)
        draw.text((x0 + 10, (y0 + y1) // 2 - 5), label, fill="black")
    for (ax, ay), (bx, by) in (
        ((96, 110), (128, 50)),
        ((96, 110), (128, 174)),
        ((208, 50), (240, 110)),
        ((208, 174), (240, 110)),
    ):
        draw.line((ax, ay, bx, by), fill="black", width=3)
        draw.polygon([(bx, by), (bx - 10, by - 5), (bx - 10, by + 5)], fill="black")
    return image


def _forward(item: str, spec: Any, real: bool) -> Check:
    """Build the component (its real loading path) and run one forward on a fixed example."""
    import math
    import time

    from qkvqa.components.registry import build_component

    start = time.perf_counter()
    component = build_component(spec)
    built = time.perf_counter() - start
    what = "built"
    if hasattr(component, "equivalent"):
        score = float(component.equivalent(*BEM_CARD_EXAMPLE))
        what = f"BEM card example scores {score:.3f}"
        if not math.isfinite(score):
            return Check("models", item, "fail", f"{spec.kind}: {what} (not finite)")
        if real and not spec.tiny and score >= 0.5:
            return Check("models", item, "fail", f"{spec.kind}: {what}; its model card says ~0 (not equivalent)")
    elif hasattr(component, "embed_images"):
        vectors = component.embed_images([card_diagram()])
        norm = float((vectors[0] ** 2).sum()) ** 0.5
        what = f"one image embedded, {vectors.shape[1]}-d, norm {norm:.3f}"
        if not math.isfinite(norm):
            return Check("models", item, "fail", f"{spec.kind}: {what} (not finite)")
        if getattr(component, "has_text", False):  # a CLIP: the model card's zero-shot example
            sims = [float(x) for x in component.embed_texts(list(EVACLIP_CARD_CAPTIONS)) @ vectors[0]]
            best = EVACLIP_CARD_CAPTIONS[max(range(len(sims)), key=sims.__getitem__)]
            what += "; a drawn diagram against " + ", ".join(
                f"'{c}' {s:.3f}" for c, s in zip(EVACLIP_CARD_CAPTIONS, sims)
            )
            if real and not spec.tiny and best != EVACLIP_CARD_CAPTIONS[0]:
                return Check(
                    "models", item, "fail", f"{spec.kind}: {what}; its model card picks '{EVACLIP_CARD_CAPTIONS[0]}'"
                )
    elif hasattr(component, "score"):
        low, high = (float(x) for x in component.score(RERANKER_CARD_PAIRS))
        what = f"model card pairs scored {low:.3f} (greeting) and {high:.3f} (panda passage)"
        if not (math.isfinite(low) and math.isfinite(high)):
            return Check("models", item, "fail", f"{spec.kind}: {what} (not finite)")
        if real and not spec.tiny and high <= low:
            return Check("models", item, "fail", f"{spec.kind}: {what}; its model card ranks the passage first")
    return Check("models", item, "ok", f"{spec.kind} on {spec.device}: built in {built:.1f}s, {what}")


__all__ = ["HUB_FILES", "load_checks", "model_checks", "used_models"]
