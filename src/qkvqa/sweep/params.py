"""Sweep parameters: W&B's distributions, grid enumeration and seeded random sampling."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from qkvqa.errors import ConfigError


def _quantize(x: float, q: float) -> float | int:
    """round(x / q) * q, an int when q is an int (W&B's rule)."""
    value = round(x / q) * q
    return int(value) if isinstance(q, int) else float(value)


def _log_uniform_values(rng: random.Random, c: Mapping) -> float:
    return math.exp(rng.uniform(math.log(c["min"]), math.log(c["max"])))


# distribution -> (required keys, defaults, sampler(rng, config))
DISTRIBUTIONS: dict[str, tuple[tuple[str, ...], dict, Callable[[random.Random, Mapping], Any]]] = {
    "constant": (("value",), {}, lambda rng, c: c["value"]),
    "categorical": (("values",), {}, lambda rng, c: rng.choice(c["values"])),
    "categorical_w": (
        ("values", "probabilities"),
        {},
        lambda rng, c: rng.choices(c["values"], weights=c["probabilities"])[0],
    ),
    "int_uniform": (("min", "max"), {}, lambda rng, c: rng.randint(c["min"], c["max"])),
    "uniform": (("min", "max"), {}, lambda rng, c: rng.uniform(c["min"], c["max"])),
    "q_uniform": (("min", "max"), {"q": 1}, lambda rng, c: _quantize(rng.uniform(c["min"], c["max"]), c["q"])),
    "log_uniform": (("min", "max"), {}, lambda rng, c: math.exp(rng.uniform(c["min"], c["max"]))),
    "log_uniform_values": (("min", "max"), {}, _log_uniform_values),
    "q_log_uniform": (
        ("min", "max"),
        {"q": 1},
        lambda rng, c: _quantize(math.exp(rng.uniform(c["min"], c["max"])), c["q"]),
    ),
    "q_log_uniform_values": (("min", "max"), {"q": 1}, lambda rng, c: _quantize(_log_uniform_values(rng, c), c["q"])),
    "inv_log_uniform": (("min", "max"), {}, lambda rng, c: math.exp(-rng.uniform(c["min"], c["max"]))),
    "inv_log_uniform_values": (
        ("min", "max"),
        {},
        lambda rng, c: 1.0 / _log_uniform_values(rng, {"min": 1 / c["max"], "max": 1 / c["min"]}),
    ),
    "normal": ((), {"mu": 0.0, "sigma": 1.0}, lambda rng, c: rng.gauss(c["mu"], c["sigma"])),
    "q_normal": (
        (),
        {"mu": 0.0, "sigma": 1.0, "q": 1},
        lambda rng, c: _quantize(rng.gauss(c["mu"], c["sigma"]), c["q"]),
    ),
    "log_normal": ((), {"mu": 0.0, "sigma": 1.0}, lambda rng, c: math.exp(rng.gauss(c["mu"], c["sigma"]))),
    "q_log_normal": (
        (),
        {"mu": 0.0, "sigma": 1.0, "q": 1},
        lambda rng, c: _quantize(math.exp(rng.gauss(c["mu"], c["sigma"])), c["q"]),
    ),
    "beta": ((), {"a": 1.0, "b": 1.0}, lambda rng, c: rng.betavariate(c["a"], c["b"])),
    "q_beta": ((), {"a": 1.0, "b": 1.0, "q": 1}, lambda rng, c: _quantize(rng.betavariate(c["a"], c["b"]), c["q"])),
}


@dataclass(frozen=True)
class Parameter:
    """One swept parameter: its dotted config key, its distribution and that distribution's settings."""

    name: str
    distribution: str
    config: Mapping[str, Any]

    def sample(self, rng: random.Random) -> Any:
        """Draw one value."""
        return DISTRIBUTIONS[self.distribution][2](rng, self.config)

    def grid_values(self) -> list[Any]:
        """Every value a grid search visits, in order."""
        c = self.config
        if self.distribution == "constant":
            return [c["value"]]
        if self.distribution == "categorical":
            return list(c["values"])
        if self.distribution == "int_uniform":
            return list(range(c["min"], c["max"] + 1))
        if self.distribution == "q_uniform":
            n = int(math.floor((c["max"] - c["min"]) / c["q"] + 1e-9))
            return [_quantize(c["min"] + i * c["q"], c["q"]) for i in range(n + 1)]
        raise ConfigError(
            f"parameter {self.name!r}: grid search needs `values`, `value`, int_uniform or q_uniform, "
            f"not distribution {self.distribution!r}; use method: random (or bayes on --backend wandb)"
        )


def parse_parameter(name: str, spec: Any) -> Parameter:
    """Validate one `parameters:` entry and infer its distribution the way W&B does."""
    where = f"parameter {name!r}"
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a mapping such as {{values: [...]}}, got {spec!r}")
    if "parameters" in spec:
        raise ConfigError(
            f"{where}: nested `parameters:` blocks render as dict reprs on the command line; "
            f"use flat dotted names instead (e.g. {name}.key: {{values: [...]}})"
        )
    distribution = spec.get("distribution")
    if distribution is None:
        if "value" in spec:
            distribution = "constant"
        elif "values" in spec:
            distribution = "categorical_w" if "probabilities" in spec else "categorical"
        elif "min" in spec and "max" in spec:
            ints = all(isinstance(spec[k], int) and not isinstance(spec[k], bool) for k in ("min", "max"))
            distribution = "int_uniform" if ints else "uniform"
        else:
            raise ConfigError(f"{where}: give `value`, `values`, or `min` and `max` (with an optional `distribution`)")
    if distribution not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: unknown distribution {distribution!r}; known: {', '.join(DISTRIBUTIONS)}")
    required, defaults, _ = DISTRIBUTIONS[distribution]
    missing = [k for k in required if k not in spec]
    if missing:
        raise ConfigError(f"{where}: distribution {distribution} needs {', '.join(missing)}")
    if distribution.startswith("categorical") and (not isinstance(spec["values"], list) or not spec["values"]):
        raise ConfigError(f"{where}: `values` must be a non-empty list")
    if "min" in required and not spec["min"] <= spec["max"]:
        raise ConfigError(f"{where}: min {spec['min']!r} is greater than max {spec['max']!r}")
    config = {**defaults, **{k: v for k, v in spec.items() if k != "distribution"}}
    return Parameter(name=name, distribution=distribution, config=config)


def grid_points(parameters: Mapping[str, Parameter]) -> list[dict[str, Any]]:
    """The grid in order: the first parameter changes slowest, the last fastest."""
    names = list(parameters)
    axes = [parameters[n].grid_values() for n in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*axes)]


def random_point(parameters: Mapping[str, Parameter], seed: int, index: int) -> dict[str, Any]:
    """Trial `index` of a seeded random search; independent of how many trials are drawn."""
    rng = random.Random(f"qkvqa-sweep:{seed}:{index}")
    return {name: p.sample(rng) for name, p in parameters.items()}
