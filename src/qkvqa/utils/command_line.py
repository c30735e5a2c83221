"""The command line a user ran, so that the commands qkvqa suggests (resume a run, rebuild an index) work when copied.

A suggested command used to name only `experiment=...`: the user's own overrides (`paths.world_dir=...`,
`paths.checkpoints_root=...`, a preset) were dropped, and the copied command failed or built into another folder.
`remember` records the overrides of the running command (the CLI handlers call it; a `qkvqa` process started from a
shell is also read from `sys.argv`), and `suggest` writes a command with those that matter for it.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Iterable, Optional, Sequence

_remembered: dict = {}


def remember(command: str, tokens: Sequence[str]) -> None:
    """Record the command (`train`, `index build`, ...) and its key=value / ~key tokens as the user typed them."""
    _remembered.clear()
    _remembered.update(command=command, tokens=[str(t) for t in tokens])


def _from_argv() -> Optional[tuple[str, list[str]]]:
    """(command, override tokens) of a `qkvqa` process started from a shell, else None (a test, a notebook)."""
    argv = sys.argv
    name = os.path.basename(argv[0]) if argv else ""
    if not argv or not (
        name == "qkvqa" or argv[0].replace(os.sep, "/").endswith(("qkvqa/cli/__main__.py", "qkvqa/__main__.py"))
    ):
        return None
    words = [a for a in argv[1:] if not a.startswith("-") and "=" not in a and not a.startswith("~")]
    tokens = [a for a in argv[1:] if "=" in a or a.startswith("~")]
    return " ".join(words[:2] if words[:1] == ["index"] or words[:1] == ["kb"] else words[:1]), tokens


def invocation() -> tuple[Optional[str], list[str]]:
    """(command, override tokens) of this process: what `remember` recorded, else what `sys.argv` says."""
    if _remembered:
        return _remembered["command"], list(_remembered["tokens"])
    found = _from_argv()
    return found if found is not None else (None, [])


def _key(token: str) -> str:
    return token.lstrip("~+").split("=", 1)[0]


def suggest(
    command: str,
    keep: Optional[Iterable[str]] = None,
    drop: Iterable[str] = (),
    extra: Sequence[str] = (),
    fallback: Sequence[str] = (),
) -> str:
    """`qkvqa COMMAND ...`: the remembered overrides (only keys under one of the `keep` prefixes, when given; the
    `drop` keys left out), then `extra`. With nothing remembered, `fallback` stands for the user's overrides."""
    _, tokens = invocation()
    if not tokens:
        tokens = list(fallback)
    keep = tuple(keep) if keep is not None else None
    drop = set(drop) | {_key(t) for t in extra}

    def wanted(token: str) -> bool:
        key = _key(token)
        if key in drop:
            return False
        return keep is None or key in ("experiment", "preset") or any(key == k or key.startswith(k + ".") for k in keep)

    return " ".join(
        ["qkvqa", command, *(shlex.quote(t) for t in tokens if wanted(t)), *(shlex.quote(t) for t in extra)]
    )


def resume_command(command: str, run_id: str, experiment: Optional[str] = None) -> str:
    """The command that continues run `run_id`: the user's own command with run_id=RUN resume=auto (the remembered
    command's name first, `command` otherwise)."""
    remembered, _ = invocation()
    return suggest(
        remembered or command,
        drop=("run_id", "resume"),
        extra=(f"run_id={run_id}", "resume=auto"),
        fallback=(f"experiment={experiment}",) if experiment and experiment != "base" else (),
    )
