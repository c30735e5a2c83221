"""Content keys of derived weights trained here: plain config values, the code that makes them, their cache folder."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping


def plain(value: Any) -> Any:
    """A plain dict / list / scalar of an OmegaConf node, a dataclass or a mapping."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def code_version(files: Iterable[Path]) -> dict:
    """sha256 (16 hex) of each file whose code makes the weights, and the torch and transformers versions."""
    import torch
    import transformers

    return {
        "files": {Path(f).name: hashlib.sha256(Path(f).read_bytes()).hexdigest()[:16] for f in files},
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def cache_key(inputs: Mapping[str, Any]) -> str:
    """The sha256 of a cache's inputs, as canonical JSON."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def keyed_dir(cfg: Any, folder: str, inputs: Mapping[str, Any], what: str) -> Path:
    """{paths.cache_dir}/<folder>/<base kind>-<key16>: where the weights of `inputs` live (a folder another user owns
    is refused, naming `what`)."""
    from qkvqa.utils.own_files import check_own_dir

    root = Path(os.path.expanduser(str(cfg.paths.cache_dir))) / folder
    path = root / f"{inputs['base']['kind']}-{cache_key(inputs)[:16]}"
    check_own_dir(path, what, "remove it, or use a paths.cache_dir of your own (docs/security.md)")
    return path
