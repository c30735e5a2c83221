"""Python logging for qkvqa, filtered so that only global rank zero prints info messages."""

from __future__ import annotations

import logging
import os
import sys

_CONFIGURED = False


def global_rank() -> int:
    """The global rank of this process, from the launcher's environment (0 when not distributed).

    SLURM_PROCID counts only when SLURM started several tasks: under `salloc` + `srun -n1`, Lightning spawns
    its own children, which inherit SLURM_PROCID=0 and carry their rank in LOCAL_RANK (with NODE_RANK and
    LOCAL_WORLD_SIZE on several nodes; without LOCAL_WORLD_SIZE the value is non-zero exactly when the true rank
    is); reading SLURM_PROCID first made every child write the run record."""
    env = os.environ
    if env.get("RANK", "").isdigit():
        return int(env["RANK"])
    if env.get("SLURM_PROCID", "").isdigit() and int(env.get("SLURM_NTASKS", "1") or 1) > 1:
        return int(env["SLURM_PROCID"])
    if env.get("LOCAL_RANK", "").isdigit():
        per_node = int(env["LOCAL_WORLD_SIZE"]) if env.get("LOCAL_WORLD_SIZE", "").isdigit() else 0
        node = int(env["NODE_RANK"]) if env.get("NODE_RANK", "").isdigit() else 0
        return node * per_node + int(env["LOCAL_RANK"]) if per_node else (int(env["LOCAL_RANK"]) or (1 if node else 0))
    if env.get("SLURM_PROCID", "").isdigit():
        return int(env["SLURM_PROCID"])
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
