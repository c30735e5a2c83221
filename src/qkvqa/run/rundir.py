"""Run identity: one run id and one `checkpoints/<run_id>/` directory per run, on every rank."""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from qkvqa.errors import ConfigError
from qkvqa.utils.logging import global_rank

ENV_RUN_ID = "QKVQA_RUN_ID"
ENV_RUN_DIR = "QKVQA_RUN_DIR"


@dataclass
class RunContext:
    """Who this run is and where its record lives."""

    run_id: str
    run_dir: Path
    resumed: bool  # the directory already held a record of this run
    launched_by_sweep: bool  # the id came from a W&B sweep agent

    @property
    def is_rank_zero(self) -> bool:
        """Whether this process writes the run record."""
        return global_rank() == 0


def new_run_id(experiment: str) -> str:
    """A fresh, sortable, human-readable id: `<YYYYmmdd-HHMMSS>-<experiment>-<4 hex>`."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{_slug(experiment)}-{secrets.token_hex(2)}"


def _slug(text: str, limit: int = 40) -> str:
    if text.endswith((".yaml", ".yml")):  # experiment=path/to/file.yaml: the file's name, not its folders
        text = Path(text).stem
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in text.replace("/", "-"))[:limit]


def launcher_run_id(experiment: str) -> Optional[str]:
    """The run id a launcher implies when no run_id is given, the same on every rank (or None outside one):
    - SLURM: `<job name>-<job id>-<experiment>` (the job id survives a requeue, so a requeued job resumes its own
      run; two jobs with one name no longer share a directory; the experiment keeps `train && evaluate` in one job
      apart);
    - torchrun: `<experiment>-<rendezvous id>` when the launch has one, else an id rank 0 makes and hands to the
      other ranks through torchrun's own store (its agents keep it up before the process group exists)."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and os.environ.get("SLURM_PROCID") is not None:
        return f"{_slug(os.environ.get('SLURM_JOB_NAME') or 'job')}-{job}-{_slug(experiment)}"
    if os.environ.get("TORCHELASTIC_RUN_ID") is None:
        return None
    rendezvous = os.environ["TORCHELASTIC_RUN_ID"]
    if rendezvous and rendezvous != "none":
        return f"{_slug(experiment)}-{_slug(rendezvous, 36)}"
    return _agreed_through_agent_store(experiment)


def _agreed_through_agent_store(experiment: str, timeout_s: float = 300.0) -> str:
    """Rank 0 publishes a new id under a key of this launch (restart count included); the others wait for it."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout_s)
    )
    key = f"qkvqa/run_id/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    if global_rank() == 0:
        store.set(key, new_run_id(experiment))
    return store.get(key).decode()


def validate_run_id(run_id: str) -> str:
    """Refuse ids that cannot be a directory name."""
    if not run_id or "/" in run_id or run_id in (".", "..") or run_id.strip() != run_id:
        raise ConfigError(f"run_id {run_id!r} is not usable as a directory name")
    return run_id


def resolve_run(cfg: DictConfig) -> RunContext:
    """Decide the run id and directory, the same on every DDP rank, and export them for child ranks.

    Order: a DDP child reads QKVQA_RUN_ID/QKVQA_RUN_DIR exported by rank 0; else `run_id` from the
    config; else WANDB_RUN_ID when a W&B sweep agent launched us (WANDB_SWEEP_ID set); else the id the
    launcher implies (`launcher_run_id`: SLURM, torchrun); else a new id.
    """
    root = Path(cfg.paths.checkpoints_root)
    inherited = os.environ.get(ENV_RUN_ID)
    # A W&B sweep agent sets both variables; an explicit, different run_id means they leaked from an
    # earlier sweep into a manual run (wandb #4736), which must not take over this run's identity.
    sweep = bool(
        os.environ.get("WANDB_SWEEP_ID")
        and os.environ.get("WANDB_RUN_ID")
        and cfg.run_id in (None, os.environ.get("WANDB_RUN_ID"))
    )
    if inherited and os.environ.get(ENV_RUN_DIR) and (global_rank() != 0 or cfg.run_id in (None, inherited)):
        run_id, run_dir = inherited, Path(os.environ[ENV_RUN_DIR])
    else:
        if cfg.run_id:
            run_id = cfg.run_id
        elif sweep:
            run_id = os.environ["WANDB_RUN_ID"]
        else:
            run_id = launcher_run_id(cfg.experiment) or new_run_id(cfg.experiment)
        run_dir = root / validate_run_id(run_id)
        if run_dir.is_symlink():  # resolved below: a link planted in a shared root would be followed (docs/security.md)
            raise ConfigError(
                f"run directory {run_dir} is a symlink (a link planted in a shared root would send the run's files "
                "elsewhere); choose another run_id, or paths.checkpoints_root a folder of your own"
            )
    run_dir = run_dir.resolve()
    resumed = (run_dir / "config.yaml").exists()
    os.environ[ENV_RUN_ID] = run_id
    os.environ[ENV_RUN_DIR] = str(run_dir)
    return RunContext(run_id=run_id, run_dir=run_dir, resumed=resumed, launched_by_sweep=sweep)


def clear_run_env() -> None:
    """Forget an inherited run identity (used between runs in one process, e.g. tests)."""
    for key in (ENV_RUN_ID, ENV_RUN_DIR):
        os.environ.pop(key, None)


def trained_qff_dirs(root: str | os.PathLike, limit: int = 5) -> list[Path]:
    """The `RUN/qff` directories under the checkpoints `root` that hold a trained QFF (its model.safetensors), the
    most recent first, at most `limit` of them (for messages that suggest a `qff.checkpoint`)."""
    base = Path(root).expanduser()
    if not base.is_dir():
        return []
    found = [p.parent for p in base.glob("*/qff/model.safetensors") if p.is_file()]
    found.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    return [Path(root) / p.parent.name / p.name for p in found[:limit]]
