"""Store the run's identity, plain-dict config and RNG states in every checkpoint; check them on resume."""
from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np
import torch

import lightning.pytorch as pl

from qkvqa.errors import ConfigError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)
CHECKPOINT_KEY = "qkvqa"
CHECKPOINT_FORMAT = 2


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
            "mid_epoch": _epoch_position(trainer) == "mid",
            "epoch_position": _epoch_position(trainer),
            "rng": rng_state(),
            # 2: saved by LastCheckpoint after a training batch or a validation, whose restart Lightning gets right
            # itself; 1 (older runs): saved at an epoch end, whose loop counters need the patches below.
            "format": CHECKPOINT_FORMAT,
        }

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After a restart from an epoch's last batch, Lightning (2.6.6) closes that epoch but still treats the restart
        as mid-epoch, so the next epoch would start uncounted and without `on_train_epoch_start` (a later resume then
        read a half-done epoch as finished): start it as a new epoch."""
        loop = trainer.fit_loop
        if loop.restarted_mid_epoch and loop.epoch_progress.total.processed == loop.epoch_progress.total.started:
            loop.reset_restart_stage()
        if trainer.world_size > 1:
            # Every rank must continue from the same checkpoint; a mismatch would otherwise surface as a gloo/NCCL
            # collective mismatch or a hang, or train on with wrongly combined gradients.
            steps = trainer.strategy.all_gather(torch.tensor([trainer.global_step], device=pl_module.device))
            steps = sorted({int(v) for v in steps.flatten().tolist()})
            if len(steps) > 1:
                raise RuntimeError(f"the ranks start training at different steps {steps}: they resumed from different "
                                   "checkpoints; resume every rank from the same last.ckpt (run_id=... resume=auto)")

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        state = checkpoint.get(CHECKPOINT_KEY, {})
        if "rng" in state:
            set_rng_state(state["rng"])
        if state.get("epoch_position") == "mid" and state.get("format", 1) < 2:
            _reopen_epoch(checkpoint)
        elif state.get("epoch_position") == "end" and state.get("format", 1) < 2:
            _close_epoch(checkpoint)
        saved = state.get("world_size")
        if saved is not None and saved != trainer.world_size:
            if state.get("mid_epoch"):
                raise ConfigError(
                    f"this checkpoint was saved mid-epoch with world_size={saved}; resuming it with "
                    f"world_size={trainer.world_size} would skip or repeat samples. Resume with "
                    f"{saved} processes, or from an end-of-epoch checkpoint.")
            log.warning("resuming an end-of-epoch checkpoint saved with world_size=%s on world_size=%s: "
                        "the global batch size changes", saved, trainer.world_size)


def _epoch_position(trainer: pl.Trainer) -> str:
    """'start' (no batch of the epoch processed), 'end' (all of them) or 'mid'."""
    processed = trainer.fit_loop.epoch_loop.batch_progress.current.processed
    total = trainer.num_training_batches
    if processed == 0:
        return "start"
    return "end" if total != float("inf") and processed >= total else "mid"


def _epoch_progress(checkpoint: dict) -> Optional[dict]:
    return checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress")


def _close_epoch(checkpoint: dict) -> None:
    """Mark an epoch that `max_steps` stopped on its last batch as completed.

    Lightning leaves such an epoch 'processed but not completed' with every batch counted, and on
    resume it replays one extra batch of the next epoch's order as part of the old epoch.
    """
    progress = _epoch_progress(checkpoint)
    if progress and progress["total"]["completed"] == progress["total"]["processed"] - 1:
        for part in ("total", "current"):
            progress[part]["completed"] += 1
        batches = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
        for key in batches:
            batches[key] = 0


def _reopen_epoch(checkpoint: dict) -> None:
    """Undo Lightning's 'epoch processed' mark on a checkpoint saved mid-epoch by max_steps.

    When `max_steps` stops training mid-epoch, Lightning records the epoch as processed, so a
    resumed run would start the next epoch and skip the rest of this one. Marking it unprocessed
    makes Lightning restart mid-epoch, and the resumable loader continues at the right sample.
    """
    progress = _epoch_progress(checkpoint)
    if not progress:
        return
    total = progress["total"]
    if total["processed"] == total["started"] and total["completed"] == total["processed"] - 1:
        for part in ("total", "current"):
            progress[part]["processed"] -= 1


def rng_state() -> dict:
    """Python, NumPy and torch RNG states as plain lists and tensors (loadable with weights_only)."""
    np_state = np.random.get_state()
    state = {"python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
             "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                       int(np_state[3]), float(np_state[4])],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore the states saved by `rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
