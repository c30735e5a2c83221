"""Own `last.ckpt`: saved every N steps, after each validation in training, at epoch ends and the last step, on a signal.

Why not Lightning's `ModelCheckpoint(save_last=True)` (Lightning 2.6.6, pinned; issue 15):
- a monitored ModelCheckpoint writes last.ckpt only in a hook where it also saved a top-k checkpoint,
  so with `checkpoint.monitor` set no last.ckpt existed until training ended, and a kill lost everything;
- after a preemption save, Lightning's epoch end overwrote last.ckpt with an "epoch completed" state,
  and the resumed run ended at once, its remaining steps never trained;
- with `every_n_train_steps` not dividing the total, the finished run's last.ckpt was stale.
So this callback is the only writer of last.ckpt; ModelCheckpoint keeps the top-k files only.

Saves happen only where Lightning's own restart logic (2.6.6) resumes exactly: after a training batch
(an epoch's last one included, never in `on_train_epoch_end`, whose restart counted an epoch twice),
or, when a validation follows the batch, at that validation's end: a kill during the validation
then replays it from the previous save, and a resume from the saved state skips it, so each
validation is logged once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Optional

import lightning.pytorch as pl

from qkvqa.utils.logging import get_logger
from qkvqa.utils.stop_signals import STOP_SIGNALS, disarm_stop_deadline, note_stop_signal, stop_signal_received

log = get_logger(__name__)
# Ctrl-C (SIGINT) stops as SIGTERM does: save, record `interrupted`, exit 130; a second Ctrl-C stops at once (Lightning
# turned a first one into SystemExit(1): the run was recorded `failed`, with no last.ckpt to resume from).
SIGNALS = STOP_SIGNALS  # SIGHUP too: a closed terminal saves as SIGTERM does
CTRL_C_NOTE = (
    "\nCtrl-C: finishing this batch, then saving and stopping (the run can be resumed); "
    "press Ctrl-C again to stop at once\n"
)


PENDING_VALIDATION = "qkvqa_validation_pending"
IN_VALIDATION = "qkvqa_saved_in_validation"


def mark_validation_pending(checkpoint: dict) -> None:
    """Make a checkpoint saved after a training batch that a validation follows restart before that validation.

    Lightning (2.6.6) restarts a batch-end save whose batch a validation follows as if the validation had run (it
    fast-forwards the validation counters), so a signal save there lost that validation. Marked here as Lightning
    marks a save made during a validation: the batch completed, the validation started with no batch processed;
    the restart then runs the validation before the next batch, and counts the step once."""
    loops = checkpoint["loops"]["fit_loop"]
    train = loops["epoch_loop.batch_progress"]
    for part in ("total", "current"):
        train[part]["completed"] = train[part]["processed"]
    val = loops["epoch_loop.val_loop.batch_progress"]
    # before this validation: during one (a stop at its batch), its own batches are counted in `current` too
    done = val["total"]["completed"] - (val["current"]["completed"] if checkpoint.get(IN_VALIDATION) else 0)
    checkpoint.pop(IN_VALIDATION, None)
    val["total"].update(ready=done + 1, started=done + 1, processed=done, completed=done)
    val["current"].update(ready=1, started=1, processed=0, completed=0)
    checkpoint[PENDING_VALIDATION] = True


def _validation_follows(trainer: pl.Trainer) -> bool:
    """Whether Lightning runs validation right after the current training batch (its own decision, asked early)."""
    loop = trainer.fit_loop.epoch_loop
    if loop._skip_next_val or not trainer.enable_validation or not sum(trainer.num_val_batches):
        return False
    return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


class LastCheckpoint(pl.Callback):
    """Writes `<run_dir>/last.ckpt` (and nothing else writes it); on SIGTERM/SIGUSR1/SIGINT/SIGHUP it finishes the batch,
    saves on every rank's agreement and stops training; `preempted` tells the caller to mark the run interrupted."""

    def __init__(
        self,
        run_dir: str | Path,
        every_n_train_steps: Optional[int] = None,
        save_on_exception: bool = True,
        stop_in_validation: bool = True,
    ):
        self.path = Path(run_dir) / "last.ckpt"
        self.stop_in_validation = stop_in_validation  # checkpoint.stop_within_s set: a signal stops a validation
        self.every_n_train_steps = every_n_train_steps
        self.save_on_exception = save_on_exception
        self.received: Optional[int] = None
        self.preempted = False
        self._after_validation = False
        self._saved_step: Optional[int] = None
        self._started = False
        self._previous: dict[int, Any] = {}
        self._pending_validation_save = False
        self._val_batches_everywhere = 0  # validation batches every rank runs (a stop decision is a collective)

    # ------------------------------------------------------------------ saving
    def _save(self, trainer: pl.Trainer, why: str) -> None:
        trainer.save_checkpoint(
            str(self.path), weights_only=False
        )  # the full state (explicit: Lightning logs a default)
        self._saved_step = trainer.global_step
        log.debug("saved %s at step %d (%s)", self.path, trainer.global_step, why)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        if self.preempted:
            return
        if trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            self.preempted = True
            log.warning(
                "received %s: saving %s at step %d and stopping",
                signal.Signals(self.received or signal.SIGTERM).name,
                self.path,
                trainer.global_step,
            )
            # A validation due after this batch is not run under the deadline; the save says it is still to come, so
            # the resumed run runs it first (its metric rows and any best checkpoint it makes are not lost).
            self._pending_validation_save = _validation_follows(trainer)
            disarm_stop_deadline()  # a deferred stop is being carried out (run.job)
            try:
                self._save(trainer, "signal")
            finally:
                self._pending_validation_save = False
            trainer.should_stop = True
            # Lightning would validate before stopping; under a preemption deadline that is time the job may not have.
            trainer.fit_loop.epoch_loop._skip_next_val = True
            return
        if _validation_follows(trainer):
            self._after_validation = True
            return
        step, every = trainer.global_step, self.every_n_train_steps
        if step == self._saved_step:
            return  # accumulating: no optimizer step since the last save
        if every and step % every == 0:
            self._save(trainer, f"every {every} steps")
        elif trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._save(trainer, "epoch end")
        elif trainer.max_steps != -1 and step >= trainer.max_steps:
            self._save(trainer, "last step")

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if self._pending_validation_save:
            if trainer.validating:
                checkpoint[IN_VALIDATION] = True
            mark_validation_pending(checkpoint)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if checkpoint.get(PENDING_VALIDATION):
            # the validation the stopped run did not run comes first; then save, as the uninterrupted run did
            self._after_validation = True
            log.info("resuming before a validation the stopped run did not run: it runs first")

    # ------------------------------------------------------------------ a stop during a validation
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self._started or not self.stop_in_validation:
            return
        import torch

        batches = int(sum(trainer.num_val_batches)) if trainer.num_val_batches else 0
        if trainer.world_size > 1:  # ranks may hold one batch more or less (unpadded validation)
            batches = int(
                trainer.strategy.reduce(torch.tensor(float(batches), device=pl_module.device), reduce_op="min").item()
            )
        self._val_batches_everywhere = batches

    def on_validation_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx, dataloader_idx: int = 0
    ) -> None:
        """A signal during a long validation is honoured at its next batch (SLURM's lead would not outlast the
        validation): the state before the validation is saved, marked so that the resumed run runs it first, and
        the run stops. Every rank decides together, within the batches every rank runs."""
        if (
            trainer.sanity_checking
            or not self._started
            or self.preempted
            or not self.stop_in_validation
            or batch_idx >= self._val_batches_everywhere
        ):
            return
        if not trainer.strategy.reduce_boolean_decision(self.received is not None, all=False):
            return
        from qkvqa.errors import RunInterrupted

        received = self.received or stop_signal_received() or signal.SIGTERM
        self.preempted = True
        disarm_stop_deadline()
        log.warning(
            "received %s during a validation: saving %s as of before it (the resumed run runs it first) and stopping",
            signal.Signals(received).name,
            self.path,
        )
        self._pending_validation_save = True
        try:
            self._save(trainer, "signal during validation")
        finally:
            self._pending_validation_save = False
        raise RunInterrupted(
            f"stopped on {signal.Signals(received).name} during a validation, after saving", signum=received
        )

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._after_validation and not trainer.sanity_checking and not self.preempted:
            self._after_validation = False
            self._save(trainer, "after validation")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Keep the work of a failed run: save unless nothing changed since the last save (or a signal saved it)."""
        self._restore_signals()
        if (
            not self.save_on_exception
            or not self._started
            or self.preempted
            or trainer.sanity_checking
            or trainer.global_step == self._saved_step
            or isinstance(exception, KeyboardInterrupt)
        ):
            return
        if trainer.world_size > 1:
            # A save waits in a barrier for every rank, and the other ranks may not be on this exception path: the
            # run would hang until SIGKILL. The last regular save stays the one to resume from.
            log.warning(
                "not saving %s after %s on %d ranks (a save would wait for ranks that are not failing); "
                "resume continues from step %s",
                self.path,
                type(exception).__name__,
                trainer.world_size,
                self._saved_step,
            )
            return
        try:
            self._save(trainer, f"{type(exception).__name__}")
        except Exception as e:  # e.g. the disk that failed the run: keep the previous save
            log.warning("could not save %s after %s: %s", self.path, type(exception).__name__, e)

    # ------------------------------------------------------------------ signals
    def _handler(self, signum, frame) -> None:
        # The one preemption mechanism: Lightning's SIGTERM handler would raise mid-step, and its SLURM handler
        # (SIGUSR1) saved hpc_ckpt_N inside the signal handler and requeued the job while this callback saved
        # last.ckpt a step later. Lightning's is switched off (run.trainer: SLURMEnvironment(auto_requeue=False));
        # the requeue after a SIGUSR1 save is `qkvqa.run.slurm.requeue`.
        if signum == signal.SIGINT and self.received is not None:
            note_stop_signal(signum)
            raise KeyboardInterrupt  # a second Ctrl-C: stop at once (recorded `interrupted`, exit 130)
        self.received = signum
        note_stop_signal(signum)  # the run record says `interrupted` whatever fails next (run.job)
        if signum == signal.SIGINT:
            os.write(2, CTRL_C_NOTE.encode())  # (no logging inside a signal handler: it takes locks)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # From here on the state is the restored one (or a fresh start): nothing before it may be saved over last.ckpt.
        self._saved_step = trainer.global_step
        self._started = True
        for sig in SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handler)
        if self.received is None:  # a signal before training (run.job.interrupt_on_signals, defer),
            self.received = stop_signal_received()  # read once this callback's handlers catch any later one

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.preempted and trainer.global_step != self._saved_step:
            self._save(trainer, "training end")  # a stop no batch-end rule foresaw (early stopping, max_time)
        self._restore_signals()

    def _restore_signals(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    # ------------------------------------------------------------------ prediction (`qkvqa evaluate`)
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Lightning's own SIGTERM handler only sets a flag that prediction never reads, so a preempted evaluation
        ran on and exited 0: here a signal stops it after the batch whose answers are stored."""
        for sig in SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handler)

    def on_predict_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx, dataloader_idx: int = 0
    ) -> None:
        if self.received is not None:
            from qkvqa.errors import RunInterrupted
            from qkvqa.utils.command_line import resume_command

            received, self.received = self.received, None
            raise RunInterrupted(
                f"evaluation stopped on {signal.Signals(received).name} after batch {batch_idx} (its "
                f"answers are stored); continue it with: "
                f"{resume_command('evaluate', self.path.parent.name)}",
                signum=received,
            )

    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore_signals()
