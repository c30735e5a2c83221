"""Compose a run config: schema defaults, experiments/base/*.yaml, presets, the experiment, overrides.

Where configs are found. The main experiments directory (`experiments_dir`) holds `base/`, which is always
merged: $QKVQA_EXPERIMENTS, else ./experiments when it has base/, else the checkout's top-level experiments/, else
the copy an installed wheel carries (`qkvqa/experiments/`). Experiments and presets are looked up first in the
search path, `--config-dir DIR` (repeatable) then $QKVQA_CONFIG_PATH (directories separated by `:`), each laid out
like experiments/ (NAME.yaml, presets/NAME.yaml), then in the main directory; the first match wins.
`experiment=path/to/file.yaml` (any value ending in .yaml or .yml) reads that file wherever it is.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from qkvqa.config.schema import Config, check_values
from qkvqa.errors import ConfigError

_NULL_WORDS = {"None"}  # Python None as a W&B sweep renders it; YAML null words parse already
# run_id values that mean "no run id" (a new one, or a sweep agent's), as `run_id=none` reads to a user; a run is
# never named "none"
NO_RUN_ID = ("", "none", "null", "~")


CONFIG_PATH_ENV = "QKVQA_CONFIG_PATH"
EXPERIMENT_SUFFIXES = (".yaml", ".yml")
_NOT_EXPERIMENTS = ("base", "presets", "sweeps")


def checkout_experiments() -> Path:
    """The top-level experiments/ of the checkout this module runs from (absent in an installed wheel)."""
    return Path(__file__).resolve().parents[3] / "experiments"


def packaged_experiments() -> Path:
    """The copy of experiments/ that `pip install .` puts inside the package (setup.py), `qkvqa/experiments/`."""
    return Path(__file__).resolve().parents[1] / "experiments"


def experiments_dir() -> Path:
    """The main experiments directory: $QKVQA_EXPERIMENTS, else ./experiments (with base/), else the checkout's,
    else the installed package's (see the module docstring)."""
    env = os.environ.get("QKVQA_EXPERIMENTS")
    if env:
        return Path(env).expanduser()
    for candidate in (Path.cwd() / "experiments", checkout_experiments(), packaged_experiments()):
        if (candidate / "base").is_dir():
            return candidate
    return checkout_experiments()


def config_search_path(config_dirs: Sequence[str | os.PathLike] = ()) -> list[Path]:
    """The directories searched before the main one: `config_dirs` (--config-dir), then $QKVQA_CONFIG_PATH; each
    must exist."""
    env = [part for part in os.environ.get(CONFIG_PATH_ENV, "").split(os.pathsep) if part.strip()]
    dirs = []
    for source, entries in (("--config-dir", config_dirs), (f"${CONFIG_PATH_ENV}", env)):
        for entry in entries:
            path = Path(entry).expanduser()
            if not path.is_dir():
                raise ConfigError(
                    f"{source} {entry}: no such directory; give a directory laid out like experiments/ "
                    "(NAME.yaml, presets/NAME.yaml)"
                )
            if path not in dirs:
                dirs.append(path)
    return dirs


def _roots(root: Optional[Path], search: Optional[Sequence[str | os.PathLike]]) -> list[Path]:
    """Search path then main directory; `search` None reads $QKVQA_CONFIG_PATH only."""
    main = Path(root) if root else experiments_dir()
    return [d for d in config_search_path(search or ()) if d != main] + [main]


def is_experiment_file(experiment: str) -> bool:
    """`experiment=` names a file (it ends in .yaml / .yml) rather than an experiment of the search path."""
    return str(experiment).endswith(EXPERIMENT_SUFFIXES)


def _names_in(root: Path) -> list[str]:
    names = []
    for path in sorted(root.rglob("*.yaml")) if root.is_dir() else []:
        rel = path.relative_to(root)
        if rel.parts[0] not in _NOT_EXPERIMENTS:
            names.append(str(rel.with_suffix("")))
    return names


def experiment_sources(
    root: Optional[Path] = None, search: Optional[Sequence[str | os.PathLike]] = None
) -> dict[str, Path]:
    """Every experiment name (relative, without .yaml) -> the directory it is read from (first match wins)."""
    found: dict[str, Path] = {}
    for directory in _roots(root, search):
        for name in _names_in(directory):
            found.setdefault(name, directory)
    return dict(sorted(found.items()))


def list_experiments(root: Optional[Path] = None, search: Optional[Sequence[str | os.PathLike]] = None) -> list[str]:
    """Names of every experiment YAML (relative, without .yaml), excluding base/, presets/ and sweeps/."""
    return list(experiment_sources(root, search))


def preset_sources(
    root: Optional[Path] = None, search: Optional[Sequence[str | os.PathLike]] = None
) -> dict[str, Path]:
    """Every preset name -> its file (first match over the search path, then the main directory)."""
    found: dict[str, Path] = {}
    for directory in _roots(root, search):
        for path in sorted((directory / "presets").glob("*.yaml")):
            found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def find_experiment(
    experiment: str, root: Optional[Path] = None, search: Optional[Sequence[str | os.PathLike]] = None
) -> Path:
    """The YAML file of `experiment=`: a file path as given, else NAME.yaml of the first directory that has it."""
    if is_experiment_file(experiment):
        path = Path(experiment).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"experiment={experiment}: no such file (a value ending in .yaml is read as a path; "
                "give an existing file, or a NAME from `qkvqa config list`)"
            )
        return path.resolve()
    roots = _roots(root, search)
    for directory in roots:
        path = directory / f"{experiment}.yaml"
        if path.is_file():
            return path
    names = list_experiments(root, search)
    near = difflib.get_close_matches(experiment, names, n=3)
    where = " or ".join(str(d) for d in roots)
    raise ConfigError(
        f"no experiment {experiment!r} in {where}"
        + (f"; did you mean {near}?" if near else f". Available: {', '.join(names)}")
    )


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
    return did_you_mean(key, schema_keys())


def did_you_mean(key: str, candidates: Iterable[str], separators: str = ".") -> str:
    """'; did you mean a, b?' with the `candidates` nearest to `key`, as a whole or by its last part (after the
    last of `separators`: "." for config keys, "/" for metric names); '' when none is near."""
    candidates = list(candidates)

    def leaf_of(name: str) -> str:
        return re.split(f"[{re.escape(separators)}]", name)[-1]

    near = difflib.get_close_matches(key, candidates, n=3, cutoff=0.6)
    by_leaf: dict[str, list[str]] = {}
    for cand in candidates:
        by_leaf.setdefault(leaf_of(cand), []).append(cand)
    for leaf in difflib.get_close_matches(leaf_of(key), list(by_leaf), n=3, cutoff=0.75):
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
    """Merge `other` into `cfg` in place (OmegaConf.merge would deep-copy the whole config at each of a run's files
    and overrides, 16 ms an override) and return it; a failed merge raises, and the config is dropped with it."""
    try:
        cfg.merge_with(other)
    except OmegaConfBaseException as e:
        raise _explain(e, source) from None
    return cfg


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
        raise ConfigError(f"bad argument {token!r}: overrides are key=value (or ~key); see `qkvqa config show --help`")
    key, value = token.split("=", 1)
    return key.strip(), value


def _apply_override(cfg: DictConfig, key: str, value: Optional[str]) -> DictConfig:
    source = f"override {key}={value}" if value is not None else f"override ~{key}"
    if value is None:
        return _restore_default(cfg, key)
    if value.strip() in _NULL_WORDS:
        value = "null"  # a W&B sweep renders Python None as the string 'None'
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


def compose(
    experiment: Optional[str] = None,
    presets: Sequence[str] = (),
    overrides: Iterable[str] = (),
    root: Optional[Path] = None,
    search: Optional[Sequence[str | os.PathLike]] = None,
) -> DictConfig:
    """Build the resolved, validated config of a run (merge order and config search in the module docstring);
    `search` are --config-dir directories, searched before $QKVQA_CONFIG_PATH."""
    root = Path(root) if root else experiments_dir()
    cfg = OmegaConf.structured(Config)
    base_dir = root / "base"
    for path in sorted(base_dir.glob("*.yaml")) if base_dir.is_dir() else []:
        cfg = _merge(cfg, _load_yaml(path), str(path))
    exp_cfg = None
    if experiment:
        exp_path = find_experiment(experiment, root, search)
        if is_experiment_file(experiment):
            experiment = str(exp_path)  # absolute: the run record and rerun hints work from anywhere
        exp_cfg = _load_yaml(exp_path)
        # An experiment may name presets it needs; command-line presets come after them, in the order typed
        # (one the experiment also names moves to its typed place, so that it wins over the ones before it).
        exp_presets = list(exp_cfg.pop("presets", []) or [])
        presets = [p for p in exp_presets if p not in presets] + list(presets)
    known = preset_sources(root, search) if presets else {}
    for name in presets:
        path = known.get(name)
        if path is None:
            where = " or ".join(str(d / "presets") for d in _roots(root, search))
            raise ConfigError(f"no preset {name!r} in {where}; available: {sorted(known)}")
        cfg = _merge(cfg, _load_yaml(path), str(path))
    if exp_cfg is not None:
        cfg = _merge(cfg, exp_cfg, str(exp_path))
        cfg.experiment = experiment
    cfg.presets = list(presets)
    for token in overrides:
        key, value = parse_override(token)
        cfg = _apply_override(cfg, key, value)
    try:
        _resolve_except_environment(cfg)
    except OmegaConfBaseException as e:
        raise _explain(e, "interpolation") from None
    if isinstance(cfg.run_id, str) and cfg.run_id.strip().lower() in NO_RUN_ID:
        cfg.run_id = None
    check_values(cfg)
    return cfg


# An interpolation that reads the environment (`${oc.env:WANDB_API_KEY}`) may carry a secret: compose leaves it, and
# every value that refers to it, unresolved in the config (read, it resolves as usual), and the run records (config.yaml,
# W&B config, checkpoints) keep the interpolation's text, never the value (docs/security.md).
_READS_ENVIRONMENT = re.compile(r"\$\{\s*(?:oc\.env|env)\s*:")
_REFERENCE = re.compile(r"\$\{\s*([A-Za-z_][\w.]*)\s*\}")


def _leaves(node, prefix: str = ""):
    """(dotted key, parent container, key) of every leaf of a config."""
    keys = node.keys() if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        path = f"{prefix}{key}"
        child = node._get_node(key)
        if isinstance(child, (DictConfig, ListConfig)) and not child._is_none() and not child._is_interpolation():
            yield from _leaves(child, path + ".")
        else:
            yield path, node, key


def environment_keys(cfg: DictConfig) -> set[str]:
    """The keys whose values come from the environment: an `oc.env` interpolation, or one referring to such a key."""
    raw = {
        path: str(parent._get_node(key)._value())
        for path, parent, key in _leaves(cfg)
        if OmegaConf.is_interpolation(parent, key)
    }
    found = {path for path, text in raw.items() if _READS_ENVIRONMENT.search(text)}
    while True:
        more = {
            path
            for path, text in raw.items()
            if path not in found
            and any(ref == key or key.startswith(ref + ".") for ref in _REFERENCE.findall(text) for key in found)
        }
        if not more:
            return found
        found |= more


def _resolve_except_environment(cfg: DictConfig) -> None:
    """Resolve every interpolation in place except those of `environment_keys`."""
    keep = environment_keys(cfg)
    for path, parent, key in list(_leaves(cfg)):
        if path not in keep and OmegaConf.is_interpolation(parent, key):
            parent[key] = parent[key]  # the resolved value replaces the interpolation


def to_plain(cfg: DictConfig) -> dict:
    """The resolved config as plain Python containers (safe for torch.save with weights_only); values read from the
    environment stay as their interpolation's text."""
    return OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)


def to_yaml(cfg: DictConfig) -> str:
    """The resolved config as YAML text, values read from the environment as their interpolation's text."""
    return OmegaConf.to_yaml(cfg, resolve=False)


def from_saved(path: str | Path, overrides: Iterable[str] = ()) -> DictConfig:
    """Reload a saved config.yaml under the schema, then apply overrides."""
    cfg = _merge(OmegaConf.structured(Config), _load_yaml(Path(path)), str(path))
    for token in overrides:
        key, value = parse_override(token)
        cfg = _apply_override(cfg, key, value)
    return cfg
