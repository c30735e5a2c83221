"""The test session itself: children a test starts get Ctrl-C as from a terminal, however pytest was started."""

from __future__ import annotations

import subprocess
import sys


def test_a_child_process_gets_ctrl_c_even_when_pytest_runs_in_a_background_job():
    # `make test` runs the SLURM tests as a background job, which a non-interactive shell starts with SIGINT
    # ignored; tests/conftest.py undoes that, or the sweep Ctrl-C test's runner never sees its Ctrl-C.
    out = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "default_int_handler" in out, out
