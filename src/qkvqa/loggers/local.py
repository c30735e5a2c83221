"""A Lightning logger that appends every logged metric to the run record's metrics.csv."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from qkvqa.run.record import RunRecord


class RunRecordLogger(Logger):
    """Writes metrics to `<run_dir>/metrics.csv` (append-only) and final values to summary.json."""

    def __init__(self, record: RunRecord, run_id: str):
        super().__init__()
        self.record = record
        self._run_id = run_id
        self._last: dict[str, float] = {}

    @property
    def name(self) -> str:
        return "qkvqa"

    @property
    def version(self) -> str:
        return self._run_id

    @property
    def root_dir(self) -> str:
        return str(self.record.run_dir)

    @property
    def log_dir(self) -> str:
        return str(self.record.run_dir)

    @property
    def save_dir(self) -> str:
        return str(self.record.run_dir)

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The resolved config is already in config.yaml; nothing else to record."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: Optional[int] = None) -> None:
        """Append the metrics of one step."""
        clean = {k: float(v) for k, v in metrics.items()}
        self._last.update(clean)
        self.record.append_metrics(clean, step if step is not None else -1)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Write the last value of every metric into summary.json."""
        if self._last:
            self.record.update_summary(self._last)
