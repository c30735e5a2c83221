"""The component registry: maps a `kind` to the builder that loads real or tiny weights."""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Optional

from qkvqa.errors import ConfigError, MissingWeightsError

# Modules that register builders when imported; a kind is looked up after importing them all.
_BUILDER_MODULES = [
    "qkvqa.components.text_encoder",
    "qkvqa.metrics.bem",
    "qkvqa.retrieval.encoders",
    "qkvqa.qff.builder",
    "qkvqa.cda.reranker",
    "qkvqa.cda.splitter",
    "qkvqa.generation.backends",
]

_REGISTRY: Dict[str, Callable[["ComponentSpec"], Any]] = {}

DTYPES = {"fp32": "float32", "float32": "float32", "fp16": "float16", "float16": "float16",
          "bf16": "bfloat16", "bfloat16": "bfloat16"}


@dataclass
class ComponentSpec:
    """How to build one component: a real checkpoint (`pretrained`) or a random tiny model (`tiny`)."""

    kind: str = ""
    pretrained: Optional[str] = None     # local directory or hub id (local files only unless allow_download)
    tiny: bool = False                   # build a tiny random model through the same loading path
    dtype: str = "fp32"                  # fp32 | fp16 | bf16
    device: str = "auto"                 # auto | cpu | cuda | cuda:N
    allow_download: bool = False         # let transformers fetch a hub id that is not cached
    options: Dict[str, Any] = field(default_factory=dict)   # kind-specific settings

    def torch_dtype(self):
        """The torch dtype named by `dtype`."""
        import torch

        if self.dtype not in DTYPES:
            raise ConfigError(f"component {self.kind!r}: dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        return getattr(torch, DTYPES[self.dtype])

    def torch_device(self):
        """The torch device named by `device`: 'auto' picks CUDA when present, the process's own GPU under a
        launcher that sets LOCAL_RANK (torchrun, Lightning DDP), so that each rank does not load onto GPU 0."""
        import os

        import torch

        if self.device == "auto":
            if not torch.cuda.is_available():
                return torch.device("cpu")
            local_rank = os.environ.get("LOCAL_RANK")
            return torch.device(f"cuda:{int(local_rank) % torch.cuda.device_count()}" if local_rank else "cuda")
        return torch.device(self.device)


def register_component(kind: str) -> Callable:
    """Decorator: register `builder(spec) -> component` under `kind`."""

    def decorator(builder: Callable[[ComponentSpec], Any]) -> Callable[[ComponentSpec], Any]:
        if kind in _REGISTRY and _REGISTRY[kind] is not builder:
            raise RuntimeError(f"component kind {kind!r} registered twice")
        _REGISTRY[kind] = builder
        return builder

    return decorator


def _import_builders() -> None:
    for name in _BUILDER_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            # A stage package that is not written yet registers nothing; any other import error is real.
            if e.name is None or not name.startswith(e.name):
                raise


def registered_kinds() -> list[str]:
    """Every registered component kind."""
    _import_builders()
    return sorted(_REGISTRY)


def build_component(spec: ComponentSpec | dict) -> Any:
    """Build the component described by `spec` (a ComponentSpec, a dict or a DictConfig)."""
    if not isinstance(spec, ComponentSpec):
        spec = spec_from_mapping(spec)
    if not spec.kind:
        raise ConfigError("component spec has no `kind`")
    if not spec.tiny and not spec.pretrained:
        raise ConfigError(f"component {spec.kind!r}: set `pretrained: <local dir or hub id>` or `tiny: true`")
    if spec.kind not in _REGISTRY:
        _import_builders()
    if spec.kind not in _REGISTRY:
        import difflib

        near = difflib.get_close_matches(spec.kind, list(_REGISTRY), n=3)
        raise ConfigError(f"unknown component kind {spec.kind!r}; did you mean {near}? Known: {sorted(_REGISTRY)}")
    return _REGISTRY[spec.kind](spec)


def spec_from_mapping(mapping: Any) -> ComponentSpec:
    """A ComponentSpec from a plain dict or an OmegaConf node; unknown fields are an error."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(mapping, DictConfig):
        mapping = OmegaConf.to_container(mapping, resolve=True)
    known = set(ComponentSpec.__dataclass_fields__)
    unknown = set(mapping) - known
    if unknown:
        raise ConfigError(f"component spec: unknown field(s) {sorted(unknown)}; valid fields are {sorted(known)} "
                          "(put kind-specific settings under `options`)")
    return ComponentSpec(**mapping)


def resolve_pretrained(spec: ComponentSpec, required_files: tuple[str, ...] = ("config.json",)) -> str:
    """The path or hub id to pass to `from_pretrained`, after checking the weights are reachable.

    A local directory must hold `required_files`. A hub id must already be in the local HF cache
    unless `allow_download` is set; otherwise a MissingWeightsError says where to put the weights.
    """
    ref = os.path.expanduser(str(spec.pretrained))
    if os.path.isdir(ref):
        missing = [f for f in required_files if not (Path(ref) / f).exists()]
        if missing:
            raise MissingWeightsError(
                f"component {spec.kind!r}: {ref} exists but lacks {missing}; it should be a directory written by "
                "`save_pretrained` or downloaded from the hub (`huggingface-cli download <id> --local-dir <dir>`)")
        return ref
    looks_like_path = ref.startswith((".", "/", "~")) or os.sep in ref and ref.count("/") > 1
    if looks_like_path:
        raise MissingWeightsError(
            f"component {spec.kind!r}: no directory at {ref}. Download the weights there "
            f"(`huggingface-cli download <hub id> --local-dir {ref}`) or set "
            f"components.<name>.pretrained to a hub id or another directory.")
    if spec.allow_download:
        return ref
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(ref, required_files[0])
    if not isinstance(cached, str):
        raise MissingWeightsError(
            f"component {spec.kind!r}: weights for hub id {ref!r} are not in the local cache and downloads are off. "
            f"Run `huggingface-cli download {ref} --local-dir weights/{ref}` on a machine with internet and set "
            f"pretrained: weights/{ref}, or set allow_download: true.")
    return ref


def tiny_dir(spec: ComponentSpec) -> Path:
    """A fresh directory where a tiny component is saved and reloaded (under QKVQA_TINY_DIR or /tmp)."""
    import tempfile

    root = Path(os.environ.get("QKVQA_TINY_DIR", tempfile.gettempdir())) / "qkvqa-tiny"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"{spec.kind}-", dir=root))
