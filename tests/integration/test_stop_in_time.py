"""Issue 37 item 4: a stop outlasting SLURM's signal lead. A signal during a long validation is honoured at the
validation's next batch (the state before it saved; the resumed run runs it first and ends bitwise equal to the
uninterrupted run, every metric row included); one that two ranks wait on during a long data preparation stops the
job after checkpoint.stop_within_s instead of after the preparation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qkvqa.run.record import RunRecord
from tests.helpers.faults import run_toy, signal_every_process_of

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
BASE = [
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "logger.wandb.enabled=false",
    "trainer.deterministic=true",
    "trainer.max_epochs=100",
    "trainer.max_steps=9",
    "trainer.val_check_interval=3",
    "checkpoint.monitor=val/loss",
    "checkpoint.mode=min",
]


def toy(root: Path, run_id: str, *overrides: str, env_extra: dict | None = None):
    return run_toy(
        root,
        run_id,
        *BASE,
        *overrides,
        env={"OMP_NUM_THREADS": "1", "TOY_N": "64", "TOY_VAL_N": "48", "TOY_TOTAL_STEPS": "40", **(env_extra or {})},
    )


def test_a_signal_during_a_long_validation_stops_at_its_next_batch_and_the_resume_runs_it_first(tmp_path):
    reference, _ = toy(tmp_path / "ref", "ref")
    assert reference.returncode == 0, reference.stdout[-3000:]
    ref = torch.load(tmp_path / "ref" / "ref" / "last.ckpt", weights_only=True)
    ref_rows = {(r["step"], r["name"]): r["value"] for r in RunRecord(tmp_path / "ref" / "ref").read_metrics()}
    stamp = tmp_path / "fired"
    # 6 validation batches of 3 s each: the whole validation outlasts the stop bound by far
    stopped, ended = toy(
        tmp_path,
        "run",
        env_extra={"QKVQA_TEST_FAULT": "sigterm@val:3", "TOY_VAL_SLEEP": "3", "QKVQA_TEST_FAULT_STAMP": str(stamp)},
    )
    assert stopped.returncode == 143, stopped.stdout[-3000:]
    took = ended - float(stamp.read_text())
    assert took < 12, f"{took:.1f} s from the signal to the end (the validation alone takes 18 s)"
    assert "during a validation" in stopped.stdout
    run = tmp_path / "run"
    assert json.loads((run / "status.json").read_text())["state"] == "interrupted"
    saved = torch.load(run / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 3 and saved["qkvqa_validation_pending"] is True
    resumed, _ = toy(tmp_path, "run", "resume=auto")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    final = torch.load(run / "last.ckpt", weights_only=True)
    assert final["global_step"] == 9
    for key in ref["state_dict"]:
        assert torch.equal(final["state_dict"][key], ref["state_dict"][key]), key
    rows = {(r["step"], r["name"]): r["value"] for r in RunRecord(run).read_metrics()}
    assert rows == ref_rows  # the step-3 validation rows too, once
    assert any(name == "val/loss" for _, name in rows)


@pytest.mark.ddp
def test_a_stop_that_two_ranks_wait_on_in_data_preparation_ends_the_job_within_the_bound(tmp_path):
    flag = tmp_path / "preparing"
    cmd = [
        sys.executable,
        "-m",
        "tests.helpers.toy",
        f"paths.checkpoints_root={tmp_path}",
        "run_id=prep",
        "preset=ddp_cpu_sim",
        *BASE[:6],
        "trainer.max_steps=3",
        "checkpoint.stop_within_s=5",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOY_SETUP_FLAG": str(flag), "TOY_SETUP_SLEEP": "120"}
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not flag.exists():
            time.sleep(0.2)
        time.sleep(1.0)  # both ranks are in their preparation
        signal_every_process_of(proc.pid, signal.SIGTERM)  # as SLURM signals every process of the job
        sent = time.time()
        out, _ = proc.communicate(timeout=100)
        took = time.time() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 143, out[-3000:]
    assert took < 60, f"{took:.0f} s: the job waited for the 120 s preparation"
    status = json.loads((tmp_path / "prep" / "status.json").read_text())
    assert status["state"] == "interrupted" and "SIGTERM" in status["error"], status
    assert "checkpoint.stop_within_s" in out
