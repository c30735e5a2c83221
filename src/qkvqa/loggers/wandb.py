"""Build the W&B logger of a run: id = run id, files under `<run_dir>/wandb/`, resume allowed."""
from __future__ import annotations

import os
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

    (run.run_dir / "wandb").parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict = dict(project=wcfg.project, entity=wcfg.entity, group=wcfg.group, tags=list(wcfg.tags) or None,
                        save_dir=str(run.run_dir), name=run.run_id, mode=mode, config=plain_config,
                        resume="allow", log_model=False)
    if not run.launched_by_sweep:
        kwargs["id"] = run.run_id      # under a sweep the agent's run id is used (and equals run_id)
    return WandbLogger(**{k: v for k, v in kwargs.items() if v is not None})


def wandb_run_id(logger: Optional[object]) -> Optional[str]:
    """The W&B run id of a WandbLogger (without starting a run), or None."""
    if logger is None:
        return None
    return getattr(logger, "version", None)
