"""Rank and run identity from the launcher's environment: SLURM, torchrun, Lightning's own children (issue 16)."""

from __future__ import annotations

import pytest

from qkvqa.run.rundir import launcher_run_id
from qkvqa.utils.logging import global_rank

LAUNCH_VARS = (
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "LOCAL_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "TORCHELASTIC_RUN_ID",
)


@pytest.fixture
def launch(monkeypatch):
    for key in LAUNCH_VARS:
        monkeypatch.delenv(key, raising=False)
    return lambda **env: [monkeypatch.setenv(k, str(v)) for k, v in env.items()]


@pytest.mark.parametrize(
    "env,rank",
    [
        ({}, 0),
        ({"RANK": 3, "LOCAL_RANK": 1, "SLURM_PROCID": 0}, 3),  # torchrun inside a SLURM job
        ({"SLURM_PROCID": 5, "SLURM_NTASKS": 8}, 5),  # srun started every task
        ({"SLURM_PROCID": 0, "SLURM_NTASKS": 1, "LOCAL_RANK": 1}, 1),  # salloc + srun -n1: Lightning's child
        ({"SLURM_PROCID": 0, "SLURM_NTASKS": 1}, 0),
        ({"LOCAL_RANK": 1, "NODE_RANK": 1, "LOCAL_WORLD_SIZE": 2}, 3),
        ({"LOCAL_RANK": 0, "NODE_RANK": 1}, 1),  # not rank zero, whatever the size
    ],
)
def test_global_rank_reads_the_launcher_that_started_this_process(launch, env, rank):
    launch(**env)
    assert global_rank() == rank


def test_slurm_names_the_run_by_job_name_id_and_experiment(launch):
    assert launcher_run_id("evqa_qff") is None
    launch(SLURM_JOB_ID=4711, SLURM_JOB_NAME="qff train", SLURM_PROCID=1, SLURM_NTASKS=2)
    assert launcher_run_id("demo/qff_per_layer") == "qff-train-4711-demo-qff_per_layer"


def test_torchrun_names_the_run_by_its_rendezvous_id(launch):
    launch(TORCHELASTIC_RUN_ID="c0ffee-42", RANK=1)
    assert launcher_run_id("evqa_qff") == "evqa_qff-c0ffee-42"


def test_only_a_sigusr1_save_inside_a_slurm_job_requeues_it():
    import signal

    from qkvqa.run.slurm import requeue_command

    job = {"SLURM_JOB_ID": "4711"}
    assert requeue_command(signal.SIGUSR1, job) == ["scontrol", "requeue", "4711"]
    assert requeue_command(signal.SIGUSR1, {**job, "SLURM_ARRAY_JOB_ID": "90", "SLURM_ARRAY_TASK_ID": "3"}) == [
        "scontrol",
        "requeue",
        "90_3",
    ]
    assert requeue_command(signal.SIGTERM, job) is None  # preemption: SLURM requeues a --requeue job itself
    assert requeue_command(signal.SIGUSR1, {}) is None  # not in a SLURM job


def test_lightning_requeues_nothing_itself_under_slurm(launch):
    from qkvqa.run.slurm import slurm_plugins

    assert slurm_plugins() == []
    launch(SLURM_JOB_ID=4711, SLURM_NTASKS=2, SLURM_NTASKS_PER_NODE=2, SLURM_PROCID=0, SLURM_JOB_NAME="train")
    (env,) = slurm_plugins()
    assert env.auto_requeue is False


def test_a_run_never_joins_a_wandb_service_another_process_started(monkeypatch):
    """A WANDB_SERVICE inherited from the submitting process (a test, a notebook) once made a requeued job's rank 0
    join that service, which still held the first attempt's stream: "run ID ... is in use" (SLURM time-limit test)."""
    import os
    from types import SimpleNamespace

    from qkvqa.run.job import _clear_stale_wandb_env

    run = SimpleNamespace(launched_by_sweep=False)
    monkeypatch.setenv("WANDB_SERVICE", "3-1-unix-/tmp/wandb-elsewhere.sock")
    _clear_stale_wandb_env(run)
    assert "WANDB_SERVICE" not in os.environ
    own = f"3-{os.getpid()}-tcp-localhost-40000"  # the service this process started itself
    monkeypatch.setenv("WANDB_SERVICE", own)
    _clear_stale_wandb_env(run)
    assert os.environ["WANDB_SERVICE"] == own


def test_a_sigusr1_during_start_up_is_held_and_stops_the_run_as_interrupted(tmp_path):
    """SLURM's SIGUSR1 (time limit, scancel --signal) that lands during imports once killed the job outright, with no
    run record and no requeue (the time-limit SLURM test on a loaded machine): it is held from the command's first
    line and the run stops at once, `interrupted`, when it starts."""
    import json
    import os
    import signal

    import pytest

    from qkvqa.config.load import compose
    from qkvqa.errors import RunInterrupted
    from qkvqa.run.job import run_job
    from qkvqa.utils.stop_signals import hold_stop_signal

    before = signal.getsignal(signal.SIGUSR1)
    try:
        hold_stop_signal()
        os.kill(os.getpid(), signal.SIGUSR1)  # delivered now, held, the process lives
        cfg = compose(None, [], [f"paths.checkpoints_root={tmp_path}", "run_id=early"])
        with pytest.raises(RunInterrupted, match="SIGUSR1"):
            with run_job(cfg, "test"):
                pytest.fail("the run went on after a held SIGUSR1")
    finally:
        signal.signal(signal.SIGUSR1, before)
    assert json.loads((tmp_path / "early" / "status.json").read_text())["state"] == "interrupted"


@pytest.mark.slow
def test_an_error_a_stop_signal_causes_is_recorded_as_an_interruption(tmp_path):
    """A library that fails because of the stop (the W&B service died of the same SIGUSR1, the next W&B call raised
    ConnectionResetError; a library re-raised our RunInterrupted as its own error) once left the run `failed`,
    unrequeued: the run record says `interrupted`, and RunInterrupted carries the signal on."""
    import json
    import os
    import signal
    import time

    import pytest

    from qkvqa.config.load import compose
    from qkvqa.errors import RunInterrupted
    from qkvqa.run.job import run_job
    from qkvqa.utils.stop_signals import stop_signal_received

    cfg = compose(None, [], [f"paths.checkpoints_root={tmp_path}", "run_id=wrapped"])
    with pytest.raises(RunInterrupted, match="then ConnectionResetError") as stopped:
        with run_job(cfg, "test"):
            try:
                os.kill(os.getpid(), signal.SIGUSR1)
                time.sleep(5)
            except RunInterrupted as e:
                raise ConnectionResetError("the service is gone") from e
    assert stopped.value.signum == signal.SIGUSR1
    status = json.loads((tmp_path / "wrapped" / "status.json").read_text())
    assert status["state"] == "interrupted" and "SIGUSR1" in status["error"], status
    assert stop_signal_received() is None  # the next run in this process starts clean
    with run_job(compose(None, [], [f"paths.checkpoints_root={tmp_path}", "run_id=next"]), "test"):
        pass
    assert json.loads((tmp_path / "next" / "status.json").read_text())["state"] == "finished"


@pytest.mark.slow
def test_a_sigusr1_while_python_shuts_down_after_the_work_does_not_kill_the_process(tmp_path):
    """A requeued SLURM attempt that finished just before its own time-limit SIGUSR1 died of the signal while the
    interpreter shut down (Python resets handlers to the default there) and SLURM marked the finished job FAILED."""
    import signal
    import subprocess
    import sys

    sent = tmp_path / "sent"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"""
import os, time
from qkvqa.utils.stop_signals import hold_stop_signal
hold_stop_signal()
class ShutsDownSlowly:                        # its finaliser runs after Python has reset the signal handlers
    def __del__(self):
        print("shutting down", flush=True)
        deadline = time.monotonic() + 30
        while not os.path.exists({str(sent)!r}) and time.monotonic() < deadline:
            time.sleep(0.05)                  # shut down until the test has sent the signal
        time.sleep(0.3)
keep = ShutsDownSlowly()
""",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline().strip() == "shutting down"
    assert child.poll() is None  # the signal lands during the shutdown
    child.send_signal(signal.SIGUSR1)
    sent.touch()
    assert child.wait(timeout=60) == 0


@pytest.mark.slow
def test_before_training_on_several_ranks_a_stop_signal_is_noted_for_the_first_batch_not_raised(tmp_path):
    """A rank that stopped alone before training left the others blocked in the process-group rendezvous (the SLURM
    time-limit test hung until its limit): with `defer_stop` the signal is noted, and LastCheckpoint stops every
    rank together after the first batch."""
    import os
    import signal
    import time

    from qkvqa.config.load import compose
    from qkvqa.run.job import run_job
    from qkvqa.utils.stop_signals import stop_signal_received

    cfg = compose(None, [], [f"paths.checkpoints_root={tmp_path}", "run_id=deferred"])
    with run_job(cfg, "test", world_size=2, defer_stop=True):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.5)  # not raised here
        assert stop_signal_received() == signal.SIGUSR1  # LastCheckpoint.on_train_start reads it
    assert stop_signal_received() is None


def test_a_command_that_opens_no_run_leaves_sigusr1_its_default_and_a_run_command_holds_it():
    """Holding SIGUSR1 is for commands whose run can stop cleanly on it; `kb build`, `synth`, the sweep driver
    would otherwise note it and run on until SIGKILL."""
    import signal

    from qkvqa.cli.main import build_parser, main

    before = signal.getsignal(signal.SIGUSR1)
    try:
        assert main(["config", "list"]) == 0
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
        opens = {
            name
            for name in ("train", "evaluate", "embed", "mine", "rerank", "retrieve", "cache-vit", "demo")
            if getattr(build_parser().parse_args([name]), "opens_run", False)
        }
        assert opens == {"train", "evaluate", "embed", "mine", "rerank", "retrieve", "cache-vit", "demo"}
        assert not getattr(build_parser().parse_args(["synth", "--out", "x"]), "opens_run", False)
    finally:
        signal.signal(signal.SIGUSR1, before)
