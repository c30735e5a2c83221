"""Store the run's identity, plain-dict config and RNG states in every checkpoint; check them on resume."""

from __future__ import annotations

import random
from typing import Any, Optional

import lightning.pytorch as pl
import numpy as np
import torch

from qkvqa.errors import ConfigError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)
CHECKPOINT_KEY = "qkvqa"
CHECKPOINT_FORMAT = 2


class RunStateCallback(pl.Callback):
    """Adds `checkpoint['qkvqa']` = {config, run_id, world_size, global_batch_size, wandb_id, mid_epoch}."""

    def __init__(
        self, plain_config: dict, run_id: str, wandb_id: Optional[str] = None, batch_size: Optional[int] = None
    ):
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
        per_rank = gather_rng_states(trainer)
        checkpoint[CHECKPOINT_KEY] = {
            "config": self.plain_config,
            "run_id": self.run_id,
            "wandb_id": self.wandb_id,
            "world_size": int(trainer.world_size),
            "global_batch_size": int(batch * trainer.world_size * trainer.accumulate_grad_batches),
            "mid_epoch": _epoch_position(trainer) == "mid",
            "epoch_position": _epoch_position(trainer),
            # every rank's own generators (rank r restores entry r); "rng" is rank zero's, as older runs saved it
            "rng": per_rank[0],
            "rng_per_rank": per_rank,
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
                raise RuntimeError(
                    f"the ranks start training at different steps {steps}: they resumed from different "
                    "checkpoints; resume every rank from the same last.ckpt (run_id=... resume=auto)"
                )

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        state = checkpoint.get(CHECKPOINT_KEY, {})
        if "rng" in state:
            set_rng_state(rng_for_rank(state, int(trainer.global_rank), int(trainer.world_size)))
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
                    f"{saved} processes, or from an end-of-epoch checkpoint."
                )
            log.warning(
                "resuming an end-of-epoch checkpoint saved with world_size=%s on world_size=%s: "
                "the global batch size changes",
                saved,
                trainer.world_size,
            )


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
    """This process's Python, NumPy and torch RNG states as plain lists and tensors (loadable with weights_only); on
    CUDA the generator of its own device only (`cuda`, with `cuda_device`): where each process sees every GPU, the
    other devices' generators belong to the other ranks."""
    np_state = np.random.get_state()
    state = {
        "python": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy": [
            np_state[0],
            torch.from_numpy(np_state[1].astype(np.int64)),
            int(np_state[2]),
            int(np_state[3]),
            float(np_state[4]),
        ],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        state["cuda"], state["cuda_device"] = torch.cuda.get_rng_state(device), device
    return state


def gather_rng_states(trainer: pl.Trainer) -> list[dict]:
    """Every rank's `rng_state()`, in rank order (all ranks save together: a collective, called on each of them)."""
    import torch.distributed as dist

    own = rng_state()
    if trainer.world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return [own]
    states: list = [None] * dist.get_world_size()
    dist.all_gather_object(states, own)
    return states


def rng_for_rank(state: dict, rank: int, world_size: int) -> dict:
    """The generator states rank `rank` resumes with: its own entry of `rng_per_rank`; rank zero's (`rng`) from a
    checkpoint that holds no per-rank states (older runs) or was saved at another world size, said in one line."""
    per_rank = state.get("rng_per_rank")
    if per_rank and len(per_rank) == world_size and rank < len(per_rank):
        return per_rank[rank]
    if rank > 0:
        log.warning(
            "rank %d resumes with rank 0's random generator states: the checkpoint holds %s",
            rank,
            "no per-rank states (saved before they were kept)"
            if not per_rank
            else f"the states of {len(per_rank)} ranks, not {world_size}",
        )
    return state["rng"]


def cuda_state_for(state: dict, device: int) -> Optional[torch.Tensor]:
    """The CUDA generator state to restore on `device` (this process's own): the saved own-device state, or from an
    older checkpoint's list of every device's states (`get_rng_state_all`) the entry of `device`; None if none."""
    saved = state.get("cuda")
    if saved is None:
        return None
    if isinstance(saved, (list, tuple)):
        return saved[device] if device < len(saved) else None
    return saved


def set_rng_state(state: dict) -> None:
    """Restore the states saved by `rng_state` (CUDA: onto this process's own device)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        cuda = cuda_state_for(state, device)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)
