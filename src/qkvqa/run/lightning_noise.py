"""Lightning messages that every qkvqa run printed and that tell its user nothing, filtered by their exact source."""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from typing import Iterator

# Each entry: (message regex, why it is dropped). Lightning's `rank_zero_warn` goes through `warnings.warn`, so these
# are `warnings` filters on the message; every one names a message qkvqa has replaced or made untrue.
DROPPED_WARNINGS = (
    # the frozen ViT (qff.freeze_vit) is in eval mode on purpose; FitStartNote logs which submodules are, by name
    (r"Found \d+ module\(s\) in eval mode at the start of training", "FitStartNote names them"),
    # the run directory always holds config.yaml, status.json and metrics.csv before the first checkpoint
    (r"Checkpoint directory .* exists and is not empty", "the run directory is the checkpoint directory"),
    # Lightning 2.6.6's own use of torch's pytree API (lightning/pytorch/utilities/_pytree.py), nothing a run can change
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", "inside Lightning, fixed by its next release"),
)
# Lightning's `rank_zero_info` writes to this logger; the advert for its hosted logger is dropped, the rest kept
RANK_ZERO_LOGGER = "lightning.pytorch.utilities.rank_zero"
DROPPED_INFO_PREFIXES = ("💡 Tip: For seamless cloud logging",)
SRUN_HINT = r"The `srun` command is available on your system but is not used"


class _DropPrefixes(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def quiet_lightning() -> None:
    """Install the filters before a Trainer is built (again each time: `warnings.catch_warnings` blocks, pytest's
    among them, restore the filter list when they end; an identical filter replaces itself)."""
    for pattern, _why in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    logger = logging.getLogger(RANK_ZERO_LOGGER)
    if not any(isinstance(f, _DropPrefixes) for f in logger.filters):
        logger.addFilter(_DropPrefixes(DROPPED_INFO_PREFIXES))


@contextmanager
def srun_hint_only_when_useful(world_size: int) -> Iterator[None]:
    """Lightning warns on any machine where `srun` exists and the process was not started by srun. That matters to a
    job of several processes on SLURM (without srun it hangs at 'Initializing distributed'); a single-process run
    cannot hang that way, so there the hint is dropped (inside this block only)."""
    with warnings.catch_warnings():
        if world_size <= 1:
            warnings.filterwarnings("ignore", message=SRUN_HINT)
        yield
