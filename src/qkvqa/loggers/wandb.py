"""Build the W&B logger of a run: id = run id, files under `<run_dir>/wandb/`, resume allowed."""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from qkvqa.run.rundir import RunContext
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)


def wandb_mode(cfg: DictConfig) -> str:
    """online, offline or disabled: the config's choice, else WANDB_MODE, else offline without a login."""
    mode = cfg.logger.wandb.mode or os.environ.get("WANDB_MODE")
    if mode:
        return "online" if mode == "run" else mode
    if os.environ.get("WANDB_API_KEY") or os.path.exists(os.path.expanduser("~/.netrc")):
        return "online"
    log.info("W&B: no login found, logging offline (sync later with `wandb sync %s`)", "<run_dir>/wandb")
    return "offline"


def make_wandb_logger(cfg: DictConfig, run: RunContext, plain_config: dict):
    """A WandbLogger for this run, or None when W&B is disabled."""
    wcfg = cfg.logger.wandb
    mode = wandb_mode(cfg)
    if not wcfg.enabled or mode == "disabled":
        return None
    from lightning.pytorch.loggers import WandbLogger

    finish_active_run()
    if run.is_rank_zero:                # other ranks only join the record rank zero writes
        run.run_dir.mkdir(parents=True, exist_ok=True)
    kwargs: dict = dict(project=wcfg.project, entity=wcfg.entity, group=wcfg.group, tags=list(wcfg.tags) or None,
                        save_dir=str(run.run_dir), name=run.run_id, mode=mode, config=plain_config,
                        resume="allow", log_model=False)
    if not run.launched_by_sweep:
        kwargs["id"] = run.run_id      # under a sweep the agent's run id is used (and equals run_id)
    return _tolerant(WandbLogger)(**{k: v for k, v in kwargs.items() if v is not None})


_TOLERANT: dict = {}


def _tolerant(base: type) -> type:
    """WandbLogger whose calls cannot fail the run: when the W&B service is gone (SLURM signals every process of
    the job step, and wandb-core exits on SIGTERM), rank zero's next W&B call raised ConnectionResetError, and the
    exception path then waited in a DDP barrier the other ranks never reached, until SIGKILL. Here the first
    failure logs one warning and W&B stops; the local run record goes on (sync the offline files later)."""
    if base in _TOLERANT:
        return _TOLERANT[base]

    class TolerantWandbLogger(base):
        _broken = False

        def _guard(self, name: str, *args, **kwargs):
            if self._broken:
                return None
            try:
                return getattr(super(), name)(*args, **kwargs)
            except Exception as e:                   # the service died or the network went: never fail the run
                self._broken = True
                log.warning("W&B stopped (%s: %s); the local run record in %s goes on", type(e).__name__, e,
                            self.save_dir)
                return None

        def log_metrics(self, *args, **kwargs):
            return self._guard("log_metrics", *args, **kwargs)

        def log_hyperparams(self, *args, **kwargs):
            return self._guard("log_hyperparams", *args, **kwargs)

        def after_save_checkpoint(self, *args, **kwargs):
            return self._guard("after_save_checkpoint", *args, **kwargs)

        def finalize(self, *args, **kwargs):
            return self._guard("finalize", *args, **kwargs)

    _TOLERANT[base] = TolerantWandbLogger
    return TolerantWandbLogger


def wandb_run_id(logger: Optional[object]) -> Optional[str]:
    """The W&B run id of a WandbLogger (without starting a run), or None."""
    if logger is None:
        return None
    return getattr(logger, "version", None)


def finish_active_run() -> None:
    """Finish a W&B run an earlier job left open in this process; WandbLogger would log into it otherwise."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        log.info("W&B: finishing run %s left open by an earlier job in this process", wandb.run.id)
        wandb.finish()


RUN_FILES = ("summary.json", "report.md")


def log_run_files(run_dir: str | os.PathLike) -> list[str]:
    """Copy summary.json into the active W&B run's summary and save summary.json and report.md with it.

    Call it after a job wrote its record (rank zero); without an active run it does nothing. Returns
    the names of the files saved.
    """
    wandb = sys.modules.get("wandb")
    run = wandb.run if wandb is not None else None
    if run is None:
        return []
    from qkvqa.run.record import RunRecord

    run_dir = Path(run_dir)
    saved = []
    try:
        run.summary.update(RunRecord(run_dir).summary())
        for name in RUN_FILES:
            if (run_dir / name).is_file():
                run.save(str(run_dir / name), base_path=str(run_dir), policy="now")
                saved.append(name)
    except Exception as e:                           # a dead W&B service must not fail a finished job
        log.warning("W&B: could not save the run files (%s: %s); they are in %s", type(e).__name__, e, run_dir)
    return saved
