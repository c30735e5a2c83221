"""Compose a run config: schema defaults, experiments/base/*.yaml, presets, the experiment, overrides."""
from __future__ import annotations

import difflib
import os
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from qkvqa.config.schema import Config, check_values
from qkvqa.errors import ConfigError

_NULL_WORDS = {"None"}          # Python None as a W&B sweep renders it; YAML null words parse already


def experiments_dir() -> Path:
    """The experiments/ directory: $QKVQA_EXPERIMENTS, else ./experiments, else the repository's."""
    env = os.environ.get("QKVQA_EXPERIMENTS")
    if env:
        return Path(env)
    cwd = Path.cwd() / "experiments"
    if (cwd / "base").is_dir():
        return cwd
    return Path(__file__).resolve().parents[3] / "experiments"


def list_experiments(root: Optional[Path] = None) -> list[str]:
    """Names of every experiment YAML (relative, without .yaml), excluding base/, presets/ and sweeps/."""
    root = root or experiments_dir()
    names = []
    for path in sorted(root.rglob("*.yaml")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("base", "presets", "sweeps"):
            continue
        names.append(str(rel.with_suffix("")))
    return names


def schema_keys(node: Any = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (used for 'did you mean' suggestions)."""
    keys = []
    for f in fields(node):
        key = f"{prefix}{f.name}"
        keys.append(key)
        default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        if is_dataclass(default):
            keys.extend(schema_keys(type(default), key + "."))
    return keys


def _suggest(key: str) -> str:
    """' ; did you mean a, b?' with the schema keys nearest to `key` (whole key or last part)."""
    candidates = schema_keys()
    near = difflib.get_close_matches(key, candidates, n=3, cutoff=0.6)
    by_leaf: dict[str, list[str]] = {}
    for cand in candidates:
        by_leaf.setdefault(cand.rsplit(".", 1)[-1], []).append(cand)
    for leaf in difflib.get_close_matches(key.rsplit(".", 1)[-1], list(by_leaf), n=3, cutoff=0.75):
        near += by_leaf[leaf]
    near = list(dict.fromkeys(near))[:4]
    return f"; did you mean {', '.join(near)}?" if near else ""


def _explain(err: OmegaConfBaseException, source: str) -> ConfigError:
    """Turn an OmegaConf error into one line naming the key, the source and the fix."""
    key = getattr(err, "full_key", None) or ""
    msg = (getattr(err, "msg", None) or str(err)).splitlines()[0]
    if isinstance(err, (ConfigKeyError, ConfigAttributeError)):
        m = re.search(r"Key '([^']+)'", msg)
        name = key or (m.group(1) if m else "?")
        return ConfigError(f"{source}: unknown config key '{name}'{_suggest(name)}")
    if isinstance(err, ValidationError):
        expected = ""
        m = re.search(r"could not be converted to (\w+)", msg)
        if m:
            expected = f"; expected {m.group(1).lower()}"
        return ConfigError(f"{source}: bad value for '{key}': {msg}{expected}")
    return ConfigError(f"{source}: {msg}" + (f" (key '{key}')" if key else ""))


def _merge(cfg: DictConfig, other: Any, source: str) -> DictConfig:
    try:
        return OmegaConf.merge(cfg, other)
    except OmegaConfBaseException as e:
        raise _explain(e, source) from None


def _load_yaml(path: Path) -> DictConfig:
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml errors carry the line
        raise ConfigError(f"{path}: cannot parse YAML: {e}") from None
    if loaded is None:
        return OmegaConf.create({})
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{path}: the top level must be a mapping of config keys")
    return loaded


def parse_override(token: str) -> tuple[str, Optional[str]]:
    """Split `key=value` (value kept as text) or `~key` (value None); anything else is an error."""
    if token.startswith("~"):
        key = token[1:]
        if not key or "=" in key:
            raise ConfigError(f"bad override {token!r}: use ~key to restore a key's default")
        return key, None
    if "=" not in token or token.startswith("="):
        raise ConfigError(f"bad argument {token!r}: overrides are key=value (or ~key); "
                          "see `qkvqa config show --help`")
    key, value = token.split("=", 1)
    return key.strip(), value


def _apply_override(cfg: DictConfig, key: str, value: Optional[str]) -> DictConfig:
    source = f"override {key}={value}" if value is not None else f"override ~{key}"
    if value is None:
        return _restore_default(cfg, key)
    if value.strip() in _NULL_WORDS:
        value = "null"                    # a W&B sweep renders Python None as the string 'None'
    try:
        parsed = OmegaConf.from_dotlist([f"{key}={value}"])
    except OmegaConfBaseException as e:
        raise _explain(e, source) from None
    return _merge(cfg, parsed, source)


def _restore_default(cfg: DictConfig, key: str) -> DictConfig:
    """`~key`: drop a key from a free-form mapping, or restore a schema key's default."""
    default = OmegaConf.structured(Config)
    parent_key, _, leaf = key.rpartition(".")
    try:
        parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    except OmegaConfBaseException as e:
        raise _explain(e, f"override ~{key}") from None
    if parent is None or not isinstance(parent, DictConfig) or leaf not in parent:
        raise ConfigError(f"override ~{key}: unknown config key '{key}'{_suggest(key)}")
    schema_value = OmegaConf.select(default, key, default="__absent__")
    if isinstance(schema_value, str) and schema_value == "__absent__":
        with _unlocked(parent):
            del parent[leaf]
    else:
        OmegaConf.update(cfg, key, schema_value, merge=False)
    return cfg


class _unlocked:
    def __init__(self, node: DictConfig):
        self.node = node

    def __enter__(self):
        self.flag = self.node._get_node_flag("struct")
        OmegaConf.set_struct(self.node, False)

    def __exit__(self, *exc):
        OmegaConf.set_struct(self.node, self.flag)


def compose(experiment: Optional[str] = None, presets: Sequence[str] = (), overrides: Iterable[str] = (),
            root: Optional[Path] = None) -> DictConfig:
    """Build the resolved, validated config of a run (merge order documented in the module docstring)."""
    root = Path(root) if root else experiments_dir()
    cfg = OmegaConf.structured(Config)
    base_dir = root / "base"
    for path in sorted(base_dir.glob("*.yaml")) if base_dir.is_dir() else []:
        cfg = _merge(cfg, _load_yaml(path), str(path))
    exp_cfg = None
    if experiment:
        exp_path = root / f"{experiment}.yaml"
        if not exp_path.is_file():
            near = difflib.get_close_matches(experiment, list_experiments(root), n=3)
            raise ConfigError(f"no experiment {experiment!r} in {root}" + (f"; did you mean {near}?" if near else
                              f". Available: {', '.join(list_experiments(root))}"))
        exp_cfg = _load_yaml(exp_path)
        # An experiment may name presets it needs; command-line presets come after them, in the order typed
        # (one the experiment also names moves to its typed place, so that it wins over the ones before it).
        exp_presets = list(exp_cfg.pop("presets", []) or [])
        presets = [p for p in exp_presets if p not in presets] + list(presets)
    for name in presets:
        path = root / "presets" / f"{name}.yaml"
        if not path.is_file():
            available = sorted(p.stem for p in (root / "presets").glob("*.yaml"))
            raise ConfigError(f"no preset {name!r} in {root / 'presets'}; available: {available}")
        cfg = _merge(cfg, _load_yaml(path), str(path))
    if exp_cfg is not None:
        cfg = _merge(cfg, exp_cfg, str(root / f"{experiment}.yaml"))
        cfg.experiment = experiment
    cfg.presets = list(presets)
    for token in overrides:
        key, value = parse_override(token)
        cfg = _apply_override(cfg, key, value)
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as e:
        raise _explain(e, "interpolation") from None
    check_values(cfg)
    return cfg


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain Python containers (safe for torch.save with weights_only)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def to_yaml(cfg: DictConfig) -> str:
    """The resolved config as YAML text."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def from_saved(path: str | Path, overrides: Iterable[str] = ()) -> DictConfig:
    """Reload a saved config.yaml under the schema, then apply overrides."""
    cfg = _merge(OmegaConf.structured(Config), _load_yaml(Path(path)), str(path))
    for token in overrides:
        key, value = parse_override(token)
        cfg = _apply_override(cfg, key, value)
    return cfg
