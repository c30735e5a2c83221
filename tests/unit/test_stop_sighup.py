"""Issue 44 class 3: SIGHUP (the terminal closed, an ssh session dropped) stops a run as SIGTERM and Ctrl-C do: it
ended training with exit 129, no last.ckpt and the record left `running`, and `resume=auto` then started at step 0."""

from __future__ import annotations

import json
import os
import signal

import pytest

from qkvqa.config.load import compose
from qkvqa.errors import RunInterrupted
from qkvqa.utils.stop_signals import STOP_SIGNALS


def test_every_stop_handler_takes_sighup_with_the_other_stop_signals():
    from qkvqa.callbacks.last_checkpoint import SIGNALS
    from qkvqa.data_modules.samplers import STOP_SIGNALS as WORKER_SIGNALS

    assert signal.SIGHUP in STOP_SIGNALS and {signal.SIGTERM, signal.SIGUSR1, signal.SIGINT} <= set(STOP_SIGNALS)
    assert tuple(SIGNALS) == tuple(STOP_SIGNALS)  # LastCheckpoint: save after the batch, then stop
    assert tuple(WORKER_SIGNALS) == tuple(STOP_SIGNALS)  # DataLoader workers leave it to the main process


def test_a_sighup_outside_training_records_the_run_interrupted_and_exits_129(tmp_path):
    from qkvqa.run.job import run_job

    cfg = compose(None, [], [f"paths.checkpoints_root={tmp_path}", "run_id=hup"])
    with pytest.raises(RunInterrupted, match="stopped on SIGHUP; continue it with") as stopped:
        with run_job(cfg, "test"):
            os.kill(os.getpid(), signal.SIGHUP)
            pytest.fail("the run went on after SIGHUP")
    assert stopped.value.exit_code == 129 and stopped.value.signum == signal.SIGHUP
    status = json.loads((tmp_path / "hup" / "status.json").read_text())
    assert status["state"] == "interrupted" and "SIGHUP" in status["error"], status
    assert signal.getsignal(signal.SIGHUP) in (signal.SIG_DFL, signal.SIG_IGN)  # handed back after the run
