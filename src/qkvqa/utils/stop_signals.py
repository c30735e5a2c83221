"""The stop signal (SIGTERM, SIGUSR1) a command has received: held from its first line, read when the run ends.

SIGUSR1 kills a Python process by default. SLURM sends it before a time limit (`--signal=USR1@N`) and on
`scancel --signal=USR1`; one that lands during the seconds of imports and config before qkvqa's run installs its
handler (`qkvqa.run.job.interrupt_on_signals`) used to kill the job outright, unrequeued, with no run record. From
the first line of a command the signal is remembered instead; the run then stops at once as `interrupted` (and
requeues under SLURM). SIGTERM keeps its default until then: a command stopped that early has nothing to save.

Every stop handler (start-up, `interrupt_on_signals`, `LastCheckpoint`) notes the signal here, so the run record
says `interrupted` (and the job requeues) also when the signal made a library fail instead of stopping cleanly:
the W&B service, for one, is in the job step and dies of the same signal, and the next W&B call then raises.

A SIGUSR1 after the command's work is done (a requeued attempt that finished just before its own time-limit
signal) must not kill the process either: Python puts back the default handlers while it shuts down, so the
process died of it after a finished run and SLURM marked the job FAILED. At exit the signal is ignored.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from typing import Optional

# The signals that stop a run cleanly (save, record `interrupted`, resume with `resume=auto`): SIGTERM (scancel, a
# scheduler), SIGUSR1 (SLURM's warning before a time limit: requeued), SIGINT (Ctrl-C) and SIGHUP (the terminal closed,
# an ssh session dropped: it ended training with exit 129, no last.ckpt and the record left `running`). Every handler
# of qkvqa's (run.job, callbacks.last_checkpoint, the DataLoader workers) takes this one tuple.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)

_received: list[int] = []  # the stop signals this process received (since the last `forget_stop_signals`)


def note_stop_signal(signum: int) -> None:
    """Remember that `signum` asked this process to stop (safe inside a signal handler)."""
    _received.append(signum)


def hold_stop_signal() -> None:
    """Remember a SIGUSR1 from now on (main thread only) instead of dying of it, up to the process's exit."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, lambda signum, frame: note_stop_signal(signum))
        atexit.unregister(_ignore_late_stop_signal)  # once, however often it is held
        atexit.register(_ignore_late_stop_signal)  # (registered early: it runs after the later exit handlers)


def release_stop_signal() -> None:
    """A command that opens no run (kb build, synth, the sweep driver, ...) has nothing to stop cleanly: SIGUSR1
    gets its default (the process ends, as before qkvqa held it), and one held since start-up is delivered now."""
    if threading.current_thread() is not threading.main_thread():
        return
    atexit.unregister(_ignore_late_stop_signal)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    if signal.SIGUSR1 in _received:
        _received.clear()
        os.kill(os.getpid(), signal.SIGUSR1)


def _ignore_late_stop_signal() -> None:
    """The work is done: a SIGUSR1 from here on has nothing to stop (and the interpreter's shutdown would reset
    the handler to the default, which kills)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def stop_signal_received() -> Optional[int]:
    """The last stop signal received, if any."""
    return _received[-1] if _received else None


def forget_stop_signals() -> None:
    """Start afresh (a run has ended and acted on its signal)."""
    _received.clear()


def disarm_stop_deadline() -> None:
    """The stop a deferred signal asked for is being carried out (LastCheckpoint saves and stops): the deadline that
    `qkvqa.run.job.interrupt_on_signals` set for it (a SIGALRM timer, checkpoint.stop_within_s) is cancelled."""
    if threading.current_thread() is threading.main_thread():
        signal.setitimer(signal.ITIMER_REAL, 0)


def interruptible_barrier(poll_s: float = 0.2, announce_s: float = 2.0) -> None:
    """A barrier across the process group that a stop signal can interrupt: a blocking one waits in C++, where no
    Python signal handler runs, so a rank signalled while it waited for a rank still at work (rank zero after
    predict, waiting for the others' parts) could not stop, and the job outlived SLURM's lead with its record left
    `running`. This one polls an asynchronous barrier and sleeps between polls, where the handlers run (and raise).
    Nothing to wait for without a process group of several ranks. A wait longer than `announce_s` is logged once
    (a rank done with its share waits, maybe for hours, for a slower one)."""
    import time

    import torch.distributed as dist

    from qkvqa.utils.logging import get_logger

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return
    work = dist.barrier(async_op=True)
    start, announced = time.monotonic(), False
    while not work.is_completed():
        if not announced and time.monotonic() - start > announce_s:
            announced = True
            get_logger(__name__).info(
                "rank %d: done; waiting for the other ranks (a stop signal is honoured here)", dist.get_rank()
            )
        time.sleep(poll_s)
    work.wait()
