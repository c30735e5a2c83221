"""SIGTERM preemption on a real SLURM cluster (issue 37 item 3), docs/training.md's script submitted as written
(tests/slurm/recipes.py): SIGTERM reaches every task (`scancel --signal=TERM`, as the scheduler signals a job it
preempts), qkvqa saves and exits 143 without requeueing itself (on SIGTERM the scheduler requeues), and the test
then requeues the job as the scheduler does under `PreemptMode=REQUEUE` (`scontrol requeue`, which JobRequeue=0
allows only because the script says `--requeue`). Each run ends bitwise equal to the uninterrupted reference:
- two successive preemptions mid-training, with two DataLoader workers per rank (QKVQA_TEST_PREEMPT_WORKERS,
  default 2; it ended with other weights until a resumed epoch was made current before the workers prefetch);
- a preemption before the first checkpoint (in a slow data preparation): the next attempt trains from scratch and
  says so; then a SIGTERM during a validation (the toy has a validation set): the third attempt resumes from it."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch

from tests.slurm import recipes
from tests.slurm.recipes import STEPS

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED")


def _preempted(slurm, job: str, work, rdir) -> None:
    """The attempt stopped on SIGTERM: it ends on its own (exit 143, not requeued by qkvqa); requeue it."""
    state = slurm.wait_job(job, ENDED, 120)
    assert state == "FAILED" and slurm.job_field(job, "ExitCode") == "143:0", recipes.told(slurm, work, rdir)
    assert recipes.wait_state(rdir, "running", 10) == "interrupted", recipes.told(slurm, work, rdir)
    slurm.run("scontrol", "requeue", job)  # the scheduler's part of PreemptMode=REQUEUE
    slurm.requeue_now(job)


def _saved_step(rdir) -> int:
    return torch.load(rdir / "last.ckpt", weights_only=True)["global_step"]


def test_two_successive_sigterm_preemptions_with_workers_resume_bitwise(slurm, reference):
    t0 = time.monotonic()
    reference, ref_order = reference[:2]
    work = slurm.workdir("preempt2")
    seen = work / "seen.jsonl"
    job = recipes.submit(
        slurm,
        "training-sbatch",
        work,
        TOY_SEEN_FILE=str(seen),
        TOY_STEP_SLEEP="1",
        TOY_WORKERS=os.environ.get("QKVQA_TEST_PREEMPT_WORKERS", "2"),
    )
    rdir = recipes.run_dir(work, job)
    assert recipes.wait_for(lambda: recipes.max_step(seen) >= 4, 240), recipes.told(slurm, work, rdir)
    slurm.run("scancel", "--signal=TERM", job)
    _preempted(slurm, job, work, rdir)
    first = _saved_step(rdir)
    assert 4 <= first < STEPS - 4, first
    print(f"first preemption at step {first}, {time.monotonic() - t0:.0f} s")
    assert recipes.wait_for(lambda: recipes.max_step(seen) >= first + 3, 240), recipes.told(slurm, work, rdir)
    slurm.run("scancel", "--signal=TERM", job)
    _preempted(slurm, job, work, rdir)
    second = _saved_step(rdir)
    assert first < second < STEPS, (first, second)
    print(f"second preemption at step {second}, {time.monotonic() - t0:.0f} s")
    state = slurm.wait_job(job, ENDED, 300)
    assert state == "COMPLETED", recipes.told(slurm, work, rdir)
    assert int(slurm.job_field(job, "Restarts") or 0) == 2
    status = recipes.assert_resumed_like(reference, ref_order, rdir, seen, attempts=3)
    assert status["resumed_from"].endswith("last.ckpt")
    print(f"done at {time.monotonic() - t0:.0f} s")


def test_sigterm_before_the_first_checkpoint_then_during_validation_resumes_bitwise(slurm, reference):
    t0 = time.monotonic()
    reference, ref_order = reference[:2]
    work = slurm.workdir("preempt-early")
    seen, flag = work / "seen.jsonl", work / "setup.flag"
    job = recipes.submit(
        slurm,
        "training-sbatch",
        work,
        TOY_SEEN_FILE=str(seen),
        TOY_VAL_N="16",
        # a preparation longer than checkpoint.stop_within_s: the stop comes at that bound, before
        # any step (a shorter one would reach the first batch, which saves and stops: not this test)
        TOY_ATTEMPT_0_ENV=f"TOY_SETUP_FLAG={flag} TOY_SETUP_SLEEP=90 TOY_EXTRA_OVERRIDES=checkpoint.stop_within_s=10",
        TOY_ATTEMPT_1_ENV="QKVQA_TEST_FAULT=sigterm@val:8",
    )
    rdir = recipes.run_dir(work, job)
    assert recipes.wait_for(flag.exists, 240), recipes.told(slurm, work, rdir)  # in data preparation
    slurm.run("scancel", "--signal=TERM", job)
    _preempted(slurm, job, work, rdir)
    assert not (rdir / "last.ckpt").exists() and recipes.rows(seen) == 0  # stopped before any step
    print(f"preempted in data preparation, {time.monotonic() - t0:.0f} s")
    # attempt 2: from scratch; every rank sends itself SIGTERM in the validation after step 8
    _preempted(slurm, job, work, rdir)
    status = json.loads((rdir / "status.json").read_text())
    assert len(status["attempts"]) == 2 and status["resumed_from"] is None, status  # the record: from scratch
    assert _saved_step(rdir) == 8
    print(f"preempted during validation at step 8, {time.monotonic() - t0:.0f} s")
    state = slurm.wait_job(job, ENDED, 300)
    assert state == "COMPLETED", recipes.told(slurm, work, rdir)
    assert int(slurm.job_field(job, "Restarts") or 0) == 2
    status = recipes.assert_resumed_like(reference, ref_order, rdir, seen, attempts=3)
    assert status["resumed_from"].endswith("last.ckpt")
    log = (work / f"evqa_qff-{job}.out").read_text()  # one log, every attempt
    assert "has no last.ckpt yet, starting from scratch" in log, log[-3000:]
    print(f"done at {time.monotonic() - t0:.0f} s")
