"""The W&B backend: create the sweep on the server and run `wandb agent` subprocesses with a clean env."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Optional

from qkvqa.errors import ConfigError
from qkvqa.sweep.local import LEAKED_ENV
from qkvqa.sweep.spec import SweepSpec
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)
OFFLINE_MODES = ("offline", "disabled", "dryrun")


def wandb_sweep_config(spec: SweepSpec, project: Optional[str], entity: Optional[str]) -> dict:
    """The sweep file as sent to W&B (what `wandb sweep FILE` sends), with its name and project filled in."""
    config = copy.deepcopy(spec.raw)
    config.setdefault("name", spec.name)
    if project:
        config["project"] = project
    if entity:
        config["entity"] = entity
    return config


@contextmanager
def preserved_wandb_env() -> Iterator[None]:
    """Restore every WANDB_* variable afterwards: wandb.sweep() sets WANDB_PROJECT/ENTITY in our process."""
    before = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
    try:
        yield
    finally:
        for key in [k for k in os.environ if k.startswith("WANDB_") and k not in before]:
            del os.environ[key]
        os.environ.update(before)


def create_sweep(config: dict, project: Optional[str], entity: Optional[str]) -> str:
    """Create the sweep with `wandb.sweep` (needs the server and a login); returns its id."""
    import wandb

    with preserved_wandb_env():
        return wandb.sweep(config, project=project, entity=entity)


def sweep_path(entity: Optional[str], project: Optional[str], sweep_id: str) -> str:
    """`entity/project/id` (or `project/id`), the form `wandb agent` accepts."""
    return "/".join(p for p in (entity, project, sweep_id) if p)


def resolve_project(spec: SweepSpec, project: Optional[str], entity: Optional[str]) -> tuple[str, Optional[str]]:
    """The sweep's project and entity: the command line's, else the file's, else qkvqa and your default entity."""
    return project or spec.raw.get("project") or "qkvqa", entity or spec.raw.get("entity")


def agent_env(environ: Mapping[str, str], interpreter: str = sys.executable) -> dict[str, str]:
    """The agents' environment: no leaked run/sweep ids, and `python` (the agent's ${interpreter}) = ours."""
    env = {k: v for k, v in environ.items() if k not in LEAKED_ENV}
    bindir = os.path.dirname(interpreter)
    env["PATH"] = bindir + (os.pathsep + env["PATH"] if env.get("PATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def agent_commands(
    sweep_path: str, parallel: int, count: Optional[int], interpreter: str = sys.executable
) -> list[list[str]]:
    """One `wandb agent` command per parallel agent; `count` (total trials) is split between them."""
    if parallel < 1:
        raise ConfigError(f"--parallel must be at least 1, got {parallel}")
    commands = []
    for i in range(parallel):
        cmd = [interpreter, "-m", "wandb", "agent"]
        if count is not None:
            share = count // parallel + (1 if i < count % parallel else 0)
            if share == 0:
                continue
            cmd += ["--count", str(share)]
        commands.append(cmd + [sweep_path])
    return commands


def run_wandb_sweep(
    spec: SweepSpec,
    *,
    project: Optional[str],
    entity: Optional[str],
    parallel: int = 1,
    count: Optional[int] = None,
    sweep_id: Optional[str] = None,
    create: Callable[[dict, Optional[str], Optional[str]], str] = create_sweep,
    launch: Callable[..., subprocess.Popen] = subprocess.Popen,
) -> int:
    """Create the sweep (unless `sweep_id` joins an existing one), run the agents, return the worst exit code."""
    mode = os.environ.get("WANDB_MODE", "")
    if mode in OFFLINE_MODES:
        raise ConfigError(
            f"--backend wandb needs the W&B server, but WANDB_MODE={mode}; use --backend local "
            "(offline), or unset WANDB_MODE"
        )
    project, entity = resolve_project(spec, project, entity)
    if sweep_id is None:
        sweep_id = create(wandb_sweep_config(spec, project, entity), project, entity)
    path = sweep_path(entity, project, sweep_id)
    log.info("W&B sweep %s: starting %d agent(s)", path, parallel)
    procs = [launch(cmd, env=agent_env(os.environ)) for cmd in agent_commands(path, parallel, count)]
    return max((p.wait() for p in procs), default=0)
