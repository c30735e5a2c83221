"""Extension points: a variant named in config by a registered name or by the import path of a user's class."""

from __future__ import annotations

import hashlib
import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

from qkvqa.errors import ConfigError

# point -> {registered name: class}; filled by `register_plugin` (the component kinds register themselves here)
_NAMED: dict[str, dict[str, type]] = {}


def register_plugin(point: str, name: str, cls: type) -> None:
    """Make `cls` the class that the name `name` means at extension point `point`."""
    named = _NAMED.setdefault(point, {})
    if name in named and named[name] is not cls:
        raise RuntimeError(f"{point} {name!r} registered twice ({named[name].__qualname__}, {cls.__qualname__})")
    named[name] = cls


def is_import_path(name: Any) -> bool:
    """Whether `name` is an import path `module:Class` (a registered name holds no colon)."""
    return isinstance(name, str) and ":" in name


def resolve_plugin(point: str, name: str, base: type) -> type:
    """The class `name` means at extension point `point`: a registered name, or an import path `module:Class` (a
    class in the user's own code, imported here) that must subclass `base`. ConfigError in one line naming what is
    registered for an unknown name, a path that does not import, or a class that does not subclass `base`."""
    registered = _NAMED.get(point, {})
    choices = f"registered: {', '.join(sorted(registered)) or 'none'}; or a class by import path (module:Class)"
    if not is_import_path(name):
        if name not in registered:
            import difflib

            near = difflib.get_close_matches(str(name), list(registered), n=2)
            hint = f" (did you mean {' or '.join(near)}?)" if near else ""
            raise ConfigError(f"{point} {name!r} is not one of {', '.join(sorted(registered))}{hint}; {choices}")
        cls = registered[name]
    else:
        module_name, _, attr = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"{point} {name!r}: module {module_name!r} does not import ({e}); {choices}") from None
        cls = module
        for part in attr.split("."):
            cls = getattr(cls, part, None)
            if cls is None:
                raise ConfigError(f"{point} {name!r}: module {module_name!r} has no {attr!r}; {choices}")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ConfigError(
            f"{point} {name!r} is not a subclass of {base.__module__}.{base.__qualname__}, the {point} extension point"
        )
    return cls


def plugin_record(cls: type) -> Optional[dict]:
    """What the card and the weights record of a class from outside qkvqa: its import path and the sha256 of its
    source file (None for qkvqa's own classes: the package version names them)."""
    if cls.__module__.split(".")[0] == "qkvqa":
        return None
    source = inspect.getsourcefile(cls)
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest() if source else None
    return {"import_path": f"{cls.__module__}:{cls.__qualname__}", "source": source, "source_sha256": digest}


@dataclass(frozen=True)
class Option:
    """One option a class declares: its type, its default, and its choices or inclusive bounds."""

    type: Any = str  # a type or a tuple of types; float accepts an int, int never accepts a bool
    default: Any = None  # a None default also admits a null value
    choices: Optional[tuple] = None
    low: Optional[float] = None
    high: Optional[float] = None
    doc: str = ""
    runtime: bool = False  # changes no learned weights (a QFF option that may differ from training's)

    def check(self, key: str, value: Any) -> Any:
        """`value` (a number as this option's type: 4.0 for an int is 4), or ConfigError naming `key` when it has the
        wrong type or lies outside the bounds or choices."""
        if value is None and self.default is None:
            return value
        types, raw = (self.type if isinstance(self.type, tuple) else (self.type,)), value
        if types in ((int,), (float,)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{key}={value!r} must be a number ({types[0].__name__})")
            if types[0] is int and float(value) != int(value):
                raise ConfigError(f"{key}={value!r} must be a whole number")
            value = types[0](value)
        elif (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise ConfigError(f"{key}={value!r}: expected {' or '.join(t.__name__ for t in types)}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{key}={raw!r} is not one of {', '.join(map(str, self.choices))}")
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            span = f"at least {self.low}" if self.high is None else f"in [{self.low}, {self.high}]"
            raise ConfigError(f"{key}={raw!r} is out of range: it must be {span}")
        return value


def check_options(where: str, declared: Mapping[str, Option], given: Mapping[str, Any], kind: str = "") -> dict:
    """`given` checked against the `declared` options of `kind` (an unknown key, a wrong type, a value out of bounds:
    a ConfigError naming `where.key`), completed with the defaults."""
    unknown = sorted(set(given) - set(declared))
    if unknown:
        import difflib

        near = {k: difflib.get_close_matches(k, list(declared), n=2) for k in unknown}
        nearest = f" (nearest valid: {near})" if any(near.values()) else ""
        whose = f" for kind {kind}" if kind else ""
        raise ConfigError(f"{where}: unknown key(s) {unknown}{whose}{nearest}; valid: {sorted(declared)}")
    checked = {key: declared[key].check(f"{where}.{key}", value) for key, value in given.items()}
    return {**{k: o.default for k, o in declared.items()}, **checked}
