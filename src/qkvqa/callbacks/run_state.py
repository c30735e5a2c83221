"""Store the run's identity and plain-dict config in every checkpoint, and check them on resume."""
from __future__ import annotations

from typing import Any, Optional

import lightning.pytorch as pl

from qkvqa.errors import ConfigError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)
CHECKPOINT_KEY = "qkvqa"


class RunStateCallback(pl.Callback):
    """Adds `checkpoint['qkvqa']` = {config, run_id, world_size, global_batch_size, wandb_id, mid_epoch}."""

    def __init__(self, plain_config: dict, run_id: str, wandb_id: Optional[str] = None, batch_size: Optional[int] = None):
        self.plain_config = plain_config
        self.run_id = run_id
        self.wandb_id = wandb_id
        self.batch_size = batch_size

    def state_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("run_id") not in (None, self.run_id):
            log.warning("checkpoint belongs to run %s, resumed as %s", state_dict["run_id"], self.run_id)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        batch = self.batch_size or 0
        checkpoint[CHECKPOINT_KEY] = {
            "config": self.plain_config,
            "run_id": self.run_id,
            "wandb_id": self.wandb_id,
            "world_size": int(trainer.world_size),
            "global_batch_size": int(batch * trainer.world_size * trainer.accumulate_grad_batches),
            "mid_epoch": not _at_epoch_end(trainer),
        }

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        state = checkpoint.get(CHECKPOINT_KEY, {})
        saved = state.get("world_size")
        if saved is not None and saved != trainer.world_size:
            if state.get("mid_epoch"):
                raise ConfigError(
                    f"this checkpoint was saved mid-epoch with world_size={saved}; resuming it with "
                    f"world_size={trainer.world_size} would skip or repeat samples. Resume with "
                    f"{saved} processes, or from an end-of-epoch checkpoint.")
            log.warning("resuming an end-of-epoch checkpoint saved with world_size=%s on world_size=%s: "
                        "the global batch size changes", saved, trainer.world_size)


def _at_epoch_end(trainer: pl.Trainer) -> bool:
    loop = trainer.fit_loop.epoch_loop
    try:
        return loop.batch_progress.current.ready == 0 or loop.done
    except AttributeError:
        return True
