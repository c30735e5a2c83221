"""Render a sweep `command:` into argv exactly as W&B's agent does (`${args_no_hyphens}` -> `key=value`).

The agent formats every parameter as Python's `f"{param}={value}"` (so `True`, `None`, `1e-05`,
`[0.9, 0.98]`), replaces `${envvar:NAME}` inside tokens, and expands whole-token macros. We do the
same, except that `${interpreter}` becomes the Python running the sweep (the agent writes `python`).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping, Optional, Sequence

from qkvqa.errors import ConfigError

ENVVAR_MACRO = re.compile(r"\$\{envvar:([A-Z0-9_]*)\}")
ARG_MACROS = (
    "args",
    "args_no_equals",
    "args_no_hyphens",
    "args_no_boolean_flags",
    "args_json",
    "args_append_hydra",
    "args_override_hydra",
)
OTHER_MACROS = ("env", "interpreter", "program", "args_json_file")


def macro_name(token: str) -> Optional[str]:
    """`args_no_hyphens` for the token `${args_no_hyphens}`, else None (the agent's whole-token rule)."""
    return token[2:-1] if token.startswith("${") and token.endswith("}") else None


def check_command(command: Sequence[Any], program: Optional[str]) -> list[str]:
    """Validate a sweep command: known macros only, `${args_no_hyphens}` present, `program` when used."""
    tokens = [str(t) for t in command]
    for token in tokens:
        name = macro_name(token)
        if name is not None and not token.startswith("${envvar:") and name not in ARG_MACROS + OTHER_MACROS:
            raise ConfigError(
                f"sweep command: unknown macro {token}; W&B's agent would silently drop it. "
                f"Known: {', '.join('${%s}' % m for m in ARG_MACROS + OTHER_MACROS)}"
            )
    if "${args_no_hyphens}" not in tokens:
        raise ConfigError(
            "sweep command: pass the parameters with ${args_no_hyphens}; qkvqa commands take "
            "key=value overrides, not --key=value (W&B's default command uses ${args})"
        )
    if "${program}" in tokens and not program:
        raise ConfigError("sweep command uses ${program} but the sweep file has no `program:`")
    return tokens


def render_args(params: Mapping[str, Any]) -> dict[str, list[str]]:
    """Every argument macro for one trial's parameters, formatted as W&B's agent formats them."""
    flags = [f"{name}={value}" for name, value in params.items()]
    no_equals: list[str] = []
    no_booleans: list[str] = []
    for name, value in params.items():
        no_equals += [f"--{name}", str(value)]
        if isinstance(value, bool):
            no_booleans += [f"--{name}"] if value else []
        else:
            no_booleans.append(f"--{name}={value}")
    return {
        "args": ["--" + f for f in flags],
        "args_no_equals": no_equals,
        "args_no_hyphens": flags,
        "args_no_boolean_flags": no_booleans,
        "args_json": [json.dumps(dict(params))],
        "args_append_hydra": ["+" + f for f in flags],
        "args_override_hydra": ["++" + f for f in flags],
    }


def render_command(
    command: Sequence[Any],
    params: Mapping[str, Any],
    *,
    program: Optional[str],
    interpreter: str,
    args_json_file: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> list[str]:
    """The argv of one trial: `${envvar:X}` substituted in every token, then whole-token macros expanded."""
    environ = os.environ if environ is None else environ
    expansions: dict[str, list[str]] = dict(render_args(params))
    expansions["interpreter"] = [interpreter]
    expansions["env"] = ["/usr/bin/env"] if os.name != "nt" else []
    expansions["program"] = [program] if program else []
    expansions["args_json_file"] = [args_json_file] if args_json_file else []
    argv: list[str] = []
    for raw in command:
        token = ENVVAR_MACRO.sub(lambda m: environ.get(m.group(1), m.group(1)), str(raw))
        name = macro_name(token)
        argv += expansions.get(name, []) if name is not None else [token]
    return argv
