"""Save `last.ckpt` and stop cleanly when the job receives SIGTERM or SIGUSR1 (SLURM preemption)."""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from qkvqa.utils.logging import get_logger

log = get_logger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class PreemptionCheckpoint(pl.Callback):
    """On SIGTERM/SIGUSR1, finish the current batch, save `<run_dir>/last.ckpt` on every rank's
    agreement, and stop training; `preempted` tells the caller to mark the run interrupted."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.received: int | None = None
        self.preempted = False
        self._previous: dict[int, Any] = {}

    def _handler(self, signum, frame) -> None:
        self.received = signum
        # Lightning's own SIGTERM handler would raise mid-step; ours stops after the batch instead.
        # Other handlers (Lightning's SLURM auto-requeue on SIGUSR1) still run.
        previous = self._previous.get(signum)
        if signum != signal.SIGTERM and callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
            previous(signum, frame)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for sig in SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handler)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        stop = trainer.strategy.reduce_boolean_decision(self.received is not None, all=False)
        if stop and not self.preempted:
            self.preempted = True
            log.warning("received %s: saving %s and stopping", signal.Signals(self.received or signal.SIGTERM).name,
                        self.run_dir / "last.ckpt")
            trainer.save_checkpoint(str(self.run_dir / "last.ckpt"))
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()
