"""Under torchrun: a worker gets SIGTERM when its agent process dies, so it saves and stops instead of running on.

torchrun's agents start their workers in the agent's session; an agent killed on its own (SIGKILL, a lost login
shell, `kill <agent pid>` by hand) used to leave the workers training, unreachable, holding the run lock and the GPUs.
Linux's parent-death signal (prctl PR_SET_PDEATHSIG) hands the worker a SIGTERM the moment its parent, the agent,
exits; qkvqa's handler then saves last.ckpt after the batch in flight and the worker exits 143 (`interrupted`).
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def stop_with_the_agent(environ=os.environ) -> bool:
    """Ask for SIGTERM on the agent's death when this process is a torchrun worker on Linux; True when set."""
    if sys.platform != "linux" or "TORCHELASTIC_RUN_ID" not in environ:
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # The agent may have died before the request: then the parent is already someone else (init or a subreaper).
    if os.getppid() == 1:
        os.kill(os.getpid(), signal.SIGTERM)
    return True
