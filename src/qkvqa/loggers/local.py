"""A Lightning logger that appends every logged metric to the run record's metrics.csv."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from qkvqa.utils.logging import get_logger

log = get_logger(__name__)


class RunRecordLogger(Logger):
    """Writes metrics to `<run_dir>/metrics.csv` (append-only) and final values to summary.json, through the run's
    record (a `qkvqa.run.record.RunRecord`, which the trainer of `qkvqa.run` passes in)."""

    def __init__(self, record: Any, run_id: str, resumed: bool = False):
        super().__init__()
        self.record = record
        self._run_id = run_id
        # A resumed run logs again what the stopped one logged after its last save (the replayed steps), with the same
        # values; it keeps everything else the stopped run logged, also after that save (a validation the resume does
        # not replay). The replayed rows are written again and the older copies dropped: at the first row and at the
        # end (`RunRecord.compact_metrics`), so (step, name) stays unique in the finished file.
        self._compact_pending = resumed
        self._resumed = False  # set once the resumed run logged (and compacted) its first row
        self._last: dict[str, float] = {}
        self._step: Optional[int] = None
        self._written: dict[str, float] = {}  # what this step already wrote: (step, name) stays unique

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
        if self._compact_pending:
            self._compact_pending = False
            self.record.compact_metrics()
            self._resumed = True
        step = step if step is not None else -1
        if step != self._step:  # Lightning repeats e.g. `epoch` in each call of one step
            self._step, self._written = step, {}
        clean = {k: v for k, v in clean.items() if self._written.get(k) != v}
        self._written.update(clean)
        self._last.update(clean)
        if clean:
            self.record.append_metrics(clean, step)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Write the last value of every metric into summary.json (a resumed run: after dropping the older copies of
        the rows it logged again)."""
        if self._resumed:
            dropped = self.record.compact_metrics()
            if dropped:
                log.info(
                    "%s: %d rows the stopped run had logged after its last save were logged again (the same "
                    "steps, replayed); the older copies are dropped",
                    self.record.metrics_path,
                    dropped,
                )
        if self._last:
            self.record.update_summary(self._last)
