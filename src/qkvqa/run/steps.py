"""The optimizer steps a fit will take, counted without building the train loader (Lightning issue #20550).

`trainer.estimated_stepping_batches` builds the train DataLoader; called from `configure_optimizers`,
it runs before a checkpoint is restored, so Lightning never hands the loader its saved position and a
mid-epoch resume repeated the epoch's first batches and skipped its last ones. A DataModule that knows
its batch count per epoch (`train_batches_per_epoch(world_size)`) is counted here instead, with
Lightning's own rule.
"""

from __future__ import annotations

import math
from typing import Any


def planned_optimizer_steps(trainer: Any, train_batches: int) -> int:
    """Lightning's `estimated_stepping_batches` for an epoch of `train_batches` batches (limit_train_batches,
    accumulation, max_epochs and max_steps applied), computed from the count alone."""
    limit = trainer.limit_train_batches
    if isinstance(limit, int):
        batches = min(train_batches, limit)
    else:
        batches = train_batches if limit == 1.0 else int(train_batches * limit)
    per_epoch = math.ceil(batches / trainer.accumulate_grad_batches)
    epochs = trainer.max_epochs
    max_steps = trainer.max_steps
    if epochs is None or epochs == -1:
        if max_steps == -1:
            raise ValueError("an endless fit (max_epochs=-1, max_steps=-1) has no step count: set qff.schedule_steps")
        return max(int(max_steps), 1)
    total = per_epoch * max(int(epochs), 1)
    return max(min(total, int(max_steps)) if max_steps != -1 else total, 1)


def optimizer_steps(trainer: Any) -> int:
    """The planned steps of the attached fit: from the DataModule's count when it gives one, else Lightning's estimate."""
    datamodule = getattr(trainer, "datamodule", None)
    count = getattr(datamodule, "train_batches_per_epoch", None)
    if count is None:
        return max(int(trainer.estimated_stepping_batches), 1)
    return planned_optimizer_steps(trainer, int(count(int(trainer.world_size))))
