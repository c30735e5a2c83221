"""Python logging for qkvqa, filtered so that only global rank zero prints info messages."""
from __future__ import annotations

import logging
import os
import sys

_CONFIGURED = False


def global_rank() -> int:
    """The global rank of this process, from the launcher's environment (0 when not distributed)."""
    for key in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


class _RankZeroFilter(logging.Filter):
    """Lets every record through on rank 0, and only warnings and errors on other ranks."""

    def filter(self, record: logging.LogRecord) -> bool:
        return global_rank() == 0 or record.levelno >= logging.WARNING


def get_logger(name: str) -> logging.Logger:
    """A logger under the `qkvqa` namespace, configured once with a rank-zero filter."""
    global _CONFIGURED
    if not _CONFIGURED:
        root = logging.getLogger("qkvqa")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(asctime)s %(levelname)s %(name)s] %(message)s", "%H:%M:%S"))
        handler.addFilter(_RankZeroFilter())
        root.addHandler(handler)
        root.setLevel(os.environ.get("QKVQA_LOG_LEVEL", "INFO").upper())
        root.propagate = False
        _CONFIGURED = True
    return logging.getLogger(name if name.startswith("qkvqa") else f"qkvqa.{name}")
