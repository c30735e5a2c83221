"""A real SLURM cluster (single node, JobRequeue=0, jobs as an unprivileged user, 2 fake GPUs): the README's and
docs/training.md's sbatch scripts submitted as written (tests/slurm/recipes.py), preempted mid-epoch with SIGUSR1 (by
scancel, and by `--signal=USR1@N` before a `--time` limit with W&B offline on), requeued by qkvqa itself, resumed on
every rank to the uninterrupted result (issues 16, 37)."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import torch

from tests.slurm import recipes
from tests.slurm.recipes import STEPS

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_the_recipes_gpu_request_is_accepted_and_counted(slurm, reference):
    """The reference ran docs/training.md's script with its `--gres=gpu:N` (N = the node's 2 fake GPUs): SLURM
    accepted and allocated it; a request for more GPUs than the node has is refused at submission."""
    fields = reference[3]
    assert fields["TresPerNode"] == "gres:gpu:2", fields
    # the Python jobs run as the unprivileged user (as root, `nobody`: the cluster lets it reach this interpreter)
    assert slurm.user == slurm.unprivileged, slurm.python_user_note
    assert fields["UserId"].startswith(f"{slurm.unprivileged}("), fields
    assert fields["Requeue"] == "1", fields  # the script's --requeue
    work = slurm.workdir("gres")
    with pytest.raises(RuntimeError, match="Requested node configuration is not available"):
        recipes.submit(slurm, "training-sbatch", work, "--gres=gpu:3")


def test_a_strict_cluster_requeues_a_recipe_only_because_it_asks_and_runs_it_unprivileged(slurm):
    """JobRequeue=0: the README's script, its program a `sleep`, submitted by the unprivileged user, may be requeued
    (by that user, as qkvqa's SIGUSR1 path does); the same script without `#SBATCH --requeue` may not."""
    work = slurm.workdir("strict")
    for name in recipes.DOCS:
        text = recipes.doc_script(name)
        assert "#SBATCH --requeue" in text and "#SBATCH --open-mode=append" in text, name
    script = recipes.doc_script("readme-sbatch")
    for old, new in recipes.SCALE["readme-sbatch"]:
        script = script.replace(old, new)
    script = script.replace(recipes.PROGRAM["readme-sbatch"], "sleep 60  #")
    jobs = {}
    for kind, text in (("asks", script), ("silent", script.replace("#SBATCH --requeue", "#SBATCH --comment=none"))):
        path = work / f"{kind}.sbatch"
        path.write_text(text)
        done = subprocess.run(
            slurm.as_user(
                [
                    "sbatch",
                    "--parsable",
                    "--ntasks-per-node=1",
                    "--gres=gpu:1",
                    f"--output={work}/%x-%j.out",
                    str(path),
                ],
                user=slurm.unprivileged,
            ),
            env=slurm.user_env(),
            cwd=work,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        jobs[kind] = done.stdout.strip().split(";")[0]
    try:
        for job in jobs.values():
            slurm.wait_job(job, ("RUNNING",), 60)
            assert slurm.job_field(job, "UserId").startswith(f"{slurm.unprivileged}(")
        requeue = {
            kind: subprocess.run(
                slurm.as_user(["scontrol", "requeue", job], user=slurm.unprivileged),
                env=slurm.user_env(),
                capture_output=True,
                text=True,
                timeout=30,
            )
            for kind, job in jobs.items()
        }
        assert requeue["asks"].returncode == 0, requeue["asks"].stderr
        assert requeue["silent"].returncode != 0 and "disabled" in requeue["silent"].stderr, requeue["silent"]
        assert int(slurm.job_field(jobs["asks"], "Restarts") or 0) == 1
        assert int(slurm.job_field(jobs["silent"], "Restarts") or 0) == 0
    finally:
        slurm.run("scancel", *jobs.values(), check=False)


def test_readme_recipe_preempted_with_sigusr1_requeues_and_resumes_on_every_rank(slurm, reference):
    t0 = time.monotonic()
    reference, ref_order = reference[:2]
    work = slurm.workdir("preempted")
    seen = work / "seen.jsonl"
    # two DataLoader workers per rank, as the gpu and ddp presets have them: the SIGUSR1 that scancel sends to every
    # process of the job reaches them (and the fork server they start from) too, and must still end in a save and a
    # requeue (issue 37 item 1)
    job = recipes.submit(slurm, "readme-sbatch", work, TOY_SEEN_FILE=str(seen), TOY_STEP_SLEEP="0.25", TOY_WORKERS="2")
    run_dir = recipes.run_dir(work, job)
    assert recipes.wait_for(lambda: recipes.rows(seen) >= 2 * 6, 240), recipes.told(slurm, work, run_dir)
    print(f"preempting at {time.monotonic() - t0:.0f} s")  # both ranks past step 6: mid-epoch 2
    slurm.run("scancel", "--signal=USR1", job)
    assert recipes.wait_state(run_dir, "running", 120) == "interrupted", recipes.told(slurm, work, run_dir)
    stopped_at = torch.load(run_dir / "last.ckpt", weights_only=True)["global_step"]
    assert 6 <= stopped_at < STEPS
    slurm.requeue_now(job)
    state = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 300)
    assert state == "COMPLETED", recipes.told(slurm, work, run_dir)
    print(f"requeued job done at {time.monotonic() - t0:.0f} s")
    assert int(slurm.job_field(job, "Restarts") or 0) == 1  # requeued once, by qkvqa
    assert [p.name for p in (work / "runs").iterdir()] == [run_dir.name]
    recipes.assert_resumed_like(reference, ref_order, run_dir, seen, attempts=2)


def test_time_limit_signals_twice_with_wandb_on_save_mid_run_requeue_and_resume(slurm, reference):
    """The README's script with `--time=3 --signal=USR1@90` on sbatch's command line: slurmctld checks time limits
    every 30 s, so every task (W&B's service too) gets the signal 90-120 s into an attempt, and the attempt saves at
    the end of the step in flight. The first trains slowly (12 s a step, after a start of 0-40 s), so it saves a step
    from 5 to 11: mid-run. The second keeps the 3-minute limit and trains slower still (45 s a step): with 5 steps or
    more left, the signal comes before its last step starts, whatever its start, so a second time-limit signal stops
    it too, at most 3 steps later (issue 37 item 3: repeated time-limit requeues). The third gets a longer limit and
    runs at full speed. W&B offline is on, as by default."""
    t0 = time.monotonic()
    reference, ref_order = reference[:2]
    work = slurm.workdir("timed")
    seen = work / "seen.jsonl"
    job = recipes.submit(
        slurm,
        "readme-sbatch",
        work,
        "--time=3",
        "--signal=USR1@90",
        wandb=True,
        TOY_SEEN_FILE=str(seen),
        TOY_ATTEMPT_0_ENV="TOY_STEP_SLEEP=12",
        TOY_ATTEMPT_1_ENV="TOY_STEP_SLEEP=45",
    )
    run_dir = recipes.run_dir(work, job)

    def told() -> str:
        return recipes.told(slurm, work, run_dir)

    saved = run_dir / "last.ckpt"
    steps = []
    for attempt in (1, 2):
        assert recipes.wait_for(lambda: _attempt_running(run_dir, attempt), 180), told()
        assert recipes.wait_state(run_dir, "running", 240) == "interrupted", told()
        steps.append(torch.load(saved, weights_only=True)["global_step"] if saved.exists() else 0)
        print(
            f"attempt {attempt} stopped by the time limit's signal at step {steps[-1]}, {time.monotonic() - t0:.0f} s"
        )
        # the requeued attempt: eligible now; the third with a longer limit, so that a slow start cannot be stopped
        slurm.requeue_now(job, time_limit="10" if attempt == 2 else None)
    assert 0 < steps[0] <= steps[1] < STEPS, (steps, told())  # mid-run both times; the second no earlier
    state = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 300)
    assert state == "COMPLETED", told()
    print(f"requeued twice, done at {time.monotonic() - t0:.0f} s")
    assert int(slurm.job_field(job, "Restarts") or 0) == 2
    status = recipes.assert_resumed_like(reference, ref_order, run_dir, seen, attempts=3)
    assert (status.get("resumed_from") or "").endswith("last.ckpt")
    offline = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 3 and len({name.rsplit("-", 1)[1] for name in offline}) == 1, offline  # one W&B run, resumed


def _attempt_running(run_dir, attempts: int) -> bool:
    """The run record says `running`, in its `attempts`-th attempt."""
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return False
    return status.get("state") == "running" and len(status.get("attempts") or []) == attempts
