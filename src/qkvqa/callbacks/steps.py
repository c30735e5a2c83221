"""One step convention everywhere: step N is "after N optimizer steps" (docs/training.md "Steps").

Lightning 2.6.6 (pinned) logs with `_batches_that_stepped`, read before it counts the batch in flight: the loss of the
first optimizer step went to W&B and metrics.csv at step 0, a validation after 138 steps at step 137, the last step
of a 276-step run at 275, while the checkpoint name (`step0000138`), the progress line ("validate at step 138") and
summary.json (`global_step` 276) count the optimizer steps done. Here every logged row takes `trainer.global_step`
at the time it is logged: a training row at N holds the N-th step's loss and learning rate, a validation row at N
was measured on the weights after N steps, as is the checkpoint named N. Lightning takes the step of a row from a
logged `step` metric when there is one; the rows logged with an explicit step (the learning rate) use a subclass.
A resumed run's first row is then one past its checkpoint's step, so the rows it logs again are exactly those after
the checkpoint (`RunRecordLogger`'s cut).
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import LearningRateMonitor

STEP_KEY = "step"  # Lightning reads a row's step from this metric (LoggerConnector.log_metrics)
EPOCH_KEY = "epoch"  # which Lightning then no longer adds itself


class OptimizerStepRows(pl.Callback):
    """Logs `step` = trainer.global_step (and `epoch`, which Lightning adds only to rows without a `step`) with every
    training row and every validation, so both take that step."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch, batch_idx) -> None:
        for key, value in ((STEP_KEY, trainer.global_step), (EPOCH_KEY, trainer.current_epoch)):
            pl_module.log(key, float(value), on_step=True, on_epoch=False, logger=True, prog_bar=False, batch_size=1)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the epoch's own rows (`on_epoch=True` training metrics) at the step of its last batch, not one before it
        self._log_epoch_level(trainer, pl_module)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._log_epoch_level(trainer, pl_module)

    @staticmethod
    def _log_epoch_level(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # sync_dist: every rank holds the same values (a mean of equal numbers), and Lightning warns without it
        for key, value in ((STEP_KEY, trainer.global_step), (EPOCH_KEY, trainer.current_epoch)):
            pl_module.log(
                key,
                float(value),
                on_step=False,
                on_epoch=True,
                logger=True,
                prog_bar=False,
                batch_size=1,
                sync_dist=trainer.world_size > 1,
            )


class StepLearningRateMonitor(LearningRateMonitor):
    """LearningRateMonitor logging each rate at the step it is used for (the optimizer step this batch makes, as
    the batch's loss), instead of one step before it."""

    def on_train_batch_start(self, trainer: pl.Trainer, *args, **kwargs) -> None:
        if not trainer._logger_connector.should_update_logs or self.logging_interval == "epoch":
            return
        stats = self._extract_stats(trainer, "step" if self.logging_interval is None else "any")
        if stats:
            for logger in trainer.loggers:
                logger.log_metrics(stats, step=trainer.global_step + 1)
