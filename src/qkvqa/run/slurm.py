"""SLURM: Lightning's own requeue switched off, and the requeue of a job our preemption save stopped (SIGUSR1)."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Optional

from qkvqa.utils.logging import get_logger

log = get_logger(__name__)


def slurm_plugins() -> list:
    """Under SLURM, Lightning's SLURMEnvironment without auto-requeue: no hpc_ckpt_N files, no second save."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)] if SLURMEnvironment.detect() else []


def requeue_command(received: Optional[int], env: Mapping[str, str] = os.environ) -> Optional[list[str]]:
    """`scontrol requeue JOB` after a SIGUSR1 save inside a SLURM job (`--signal=USR1@N` before the time limit),
    else None: on SIGTERM (preemption, scancel) SLURM requeues a `--requeue` job itself."""
    job = env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID")
    job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}" if job else env.get("SLURM_JOB_ID")
    if received != signal.SIGUSR1 or not job:
        return None
    return ["scontrol", "requeue", job]


def requeue(received: Optional[int], timeout_s: float = 60.0) -> bool:
    """Run `requeue_command`; True when the job was requeued. A failure is one warning (the run is saved)."""
    cmd = requeue_command(received)
    if cmd is None:
        return False
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("could not requeue the job (%s): resubmit it; the run resumes with resume=auto", e)
        return False
    if done.returncode != 0:
        log.warning(
            "`%s` failed: %s; resubmit the job, the run resumes with resume=auto",
            " ".join(cmd),
            done.stderr.strip()[:300],
        )
        return False
    log.info("requeued SLURM job %s", cmd[-1])
    return True
