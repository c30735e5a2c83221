"""Sweep files (W&B sweep format): load and validate them, and check that swept values keep their type."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from qkvqa.errors import ConfigError
from qkvqa.sweep.command import check_command
from qkvqa.sweep.params import Parameter, grid_points, parse_parameter, random_point

METHODS = ("grid", "random", "bayes")
GOALS = ("minimize", "maximize")
# Keys the runner sets on every trial; a sweep may not sweep them.
RESERVED_KEYS = ("run_id", "resume", "paths.checkpoints_root")


@dataclass
class SweepSpec:
    """A validated sweep file."""

    name: str
    method: str
    parameters: dict[str, Parameter]
    command: list[str]
    program: Optional[str] = None
    metric: Optional[str] = None
    goal: str = "minimize"
    run_cap: Optional[int] = None
    raw: dict = field(default_factory=dict)  # the file as W&B would receive it
    path: Optional[Path] = None

    def controller_only_keys(self) -> list[str]:
        """Keys of the file only W&B's controller acts on (the local runner runs every trial)."""
        keys = ["early_terminate"] if "early_terminate" in self.raw else []
        return keys + (["metric.target"] if "target" in (self.raw.get("metric") or {}) else [])

    def trial_params(self, count: Optional[int], seed: int) -> list[dict[str, Any]]:
        """The parameters of every trial, in trial order (grid order, or seeded random draws)."""
        if self.method == "grid":
            points = grid_points(self.parameters)
            return points[:count] if count is not None else points
        if self.method == "random":
            n = count if count is not None else self.run_cap
            if n is None:
                raise ConfigError(f"sweep {self.name}: random search needs --count N (or `run_cap:` in the file)")
            return [random_point(self.parameters, seed, i) for i in range(n)]
        raise ConfigError(
            f"sweep {self.name}: method {self.method!r} needs the W&B controller; "
            "run it with --backend wandb, or use method: grid or random locally"
        )


def _sweep_name(raw: Mapping, path: Optional[Path]) -> str:
    name = str(raw.get("name") or (path.stem if path else "sweep"))
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "sweep"


def parse_sweep(raw: Any, path: Optional[Path] = None) -> SweepSpec:
    """Validate a sweep mapping (what `yaml.safe_load` gives for a sweep file)."""
    where = str(path) if path else "sweep"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a sweep file is a mapping with method, parameters and command")
    method = raw.get("method")
    if method not in METHODS:
        raise ConfigError(f"{where}: method must be one of {', '.join(METHODS)}, got {method!r}")
    params_raw = raw.get("parameters")
    if not isinstance(params_raw, dict) or not params_raw:
        raise ConfigError(f"{where}: `parameters:` must map dotted config keys to their values")
    reserved = [k for k in params_raw if k in RESERVED_KEYS]
    if reserved:
        raise ConfigError(
            f"{where}: {', '.join(reserved)} may not be swept; the runner sets "
            f"{', '.join(RESERVED_KEYS)} for every trial"
        )
    parameters = {str(k): parse_parameter(str(k), v) for k, v in params_raw.items()}
    metric = raw.get("metric") or {}
    if not isinstance(metric, dict):
        raise ConfigError(f"{where}: `metric:` must be a mapping with name and goal")
    goal = metric.get("goal", "minimize")
    if goal not in GOALS:
        raise ConfigError(f"{where}: metric.goal must be minimize or maximize, got {goal!r}")
    if "command" not in raw:
        raise ConfigError(
            f'{where}: give a `command:`, e.g. ["${{env}}", "${{interpreter}}", -m, qkvqa.cli, '
            'train, experiment=NAME, "${args_no_hyphens}"] (W&B\'s default passes --key=value, which '
            "qkvqa rejects)"
        )
    if not isinstance(raw["command"], list):
        raise ConfigError(f"{where}: `command:` must be a list of tokens")
    program = raw.get("program")
    command = check_command(raw["command"], program)
    run_cap = raw.get("run_cap")
    return SweepSpec(
        name=_sweep_name(raw, path),
        method=method,
        parameters=parameters,
        command=command,
        program=str(program) if program else None,
        metric=metric.get("name"),
        goal=goal,
        run_cap=int(run_cap) if run_cap is not None else None,
        raw=raw,
        path=path,
    )


def read_sweep_yaml(text: str) -> Any:
    """Parse sweep YAML as `wandb sweep` does: PyYAML's safe loader (YAML 1.1); yaml.YAMLError when it is not YAML."""
    return yaml.safe_load(text)


def load_sweep(path: str | Path) -> SweepSpec:
    """Read a sweep YAML with PyYAML's safe loader, as `wandb sweep` does, and validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no sweep file {path}")
    try:
        raw = read_sweep_yaml(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: cannot parse YAML: {e}") from None
    return parse_sweep(raw, path)


def _same(a: Any, b: Any) -> bool:
    """Equal value and equal type, recursively (1 != 1.0 and 'None' != None here)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _candidates(spec: SweepSpec, seed: int) -> dict[str, list[Any]]:
    """Values to check per parameter: every grid/categorical value, else a few seeded draws."""
    out: dict[str, list[Any]] = {}
    for name, p in spec.parameters.items():
        if p.distribution in ("constant", "categorical", "categorical_w"):
            out[name] = list(p.config["values"]) if "values" in p.config else [p.config["value"]]
        elif spec.method == "grid":
            out[name] = p.grid_values()
        else:
            out[name] = [random_point({name: p}, seed, i)[name] for i in range(3)]
    return out


def check_value_types(spec: SweepSpec, seed: int = 0) -> None:
    """Refuse swept values that our override parser would turn into another value or type.

    The run would log the parsed value while W&B holds the sweep's, so a grid sweep can repeat a
    config forever (wandb #1379). Typical causes: `1e-5` (YAML 1.1 reads it as text; write 1.0e-5),
    `None` (text; write null), `1` for a float key (write 1.0).
    """
    from omegaconf import OmegaConf

    from qkvqa.config.load import compose
    from qkvqa.sweep.command import render_args

    candidates = _candidates(spec, seed)
    problems = []
    for i in range(max(len(v) for v in candidates.values())):
        point = {name: values[i] for name, values in candidates.items() if i < len(values)}
        cfg = compose(None, [], render_args(point)["args_no_hyphens"])
        for name, value in point.items():
            parsed = OmegaConf.select(cfg, name)
            if OmegaConf.is_config(parsed):
                parsed = OmegaConf.to_container(parsed)
            if not _same(parsed, value):
                problems.append(
                    f"{name}: sweep value {value!r} ({type(value).__name__}) reaches the run as "
                    f"{parsed!r} ({type(parsed).__name__})"
                )
    if problems:
        raise ConfigError(
            f"sweep {spec.name}: swept values would be logged differently from the sweep's values "
            f"(a W&B grid could repeat them forever): {'; '.join(problems)}. Write floats with a dot "
            "and an exponent sign or digits (1.0e-5), null for None, 1.0 for a float key"
        )
