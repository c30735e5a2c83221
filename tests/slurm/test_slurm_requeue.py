"""A real SLURM cluster (single node): the README's recipe under sbatch, preempted mid-epoch with SIGUSR1 (by scancel,
and by `--signal=USR1@N` before a `--time` limit with W&B offline on), requeued by qkvqa itself, resumed on every rank
to the uninterrupted result (issue 16)."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
STEPS = 16                  # 64 samples, batch 8 on 2 ranks: 4 steps an epoch


def _script(root: Path, name: str, seen: Path, sleep: str, sbatch: str = "", wandb: bool = False) -> Path:
    """The README's recipe for the toy task: 2 tasks on 1 node, CPU and gloo, requeue on, resume=auto, no run_id."""
    path = root / f"{name}.sbatch"
    path.write_text(f"""#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=2
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output={root}/{name}-%j.out
{sbatch}
export OMP_NUM_THREADS=1 TOY_SEEN_FILE={seen} TOY_STEP_SLEEP={sleep} WANDB_MODE=offline
cd {REPO}
srun {sys.executable} -m tests.helpers.toy paths.checkpoints_root={root / 'runs'} resume=auto \\
    trainer.accelerator=cpu trainer.devices=2 trainer.num_nodes=1 trainer.strategy=ddp \\
    trainer.enable_progress_bar=false trainer.log_every_n_steps=1 logger.wandb.enabled={str(wandb).lower()} \\
    trainer.deterministic=true trainer.max_epochs=100 trainer.max_steps={STEPS}
""")
    return path


def _submit(slurm, script: Path) -> str:
    out = slurm.run("sbatch", "--parsable", str(script)).stdout.strip()
    return out.split(";")[0]


def _rows(seen: Path) -> int:
    return len(seen.read_text().splitlines()) if seen.exists() else 0


def _order(seen: Path) -> dict:
    """(rank, step) -> the sample ids that rank trained on at that step (the last time it did)."""
    order = {}
    for line in seen.read_text().splitlines():
        row = json.loads(line)
        order[(row["rank"], row["step"])] = row["ids"]
    return order


@pytest.fixture(scope="module")
def reference(slurm, tmp_path_factory) -> tuple[dict, dict]:
    """An uninterrupted run of the recipe (once for the module): its final checkpoint and every rank's sample order."""
    tmp_path = tmp_path_factory.mktemp("reference")
    seen = tmp_path / "ref.jsonl"
    job = _submit(slurm, _script(tmp_path, "reference", seen, "0"))
    assert slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 240) == "COMPLETED", slurm.logs()
    ckpt = torch.load(tmp_path / "runs" / f"reference-{job}-base" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == STEPS
    return ckpt, _order(seen)


def _told(slurm, root: Path, run_dir: Path) -> str:
    """What a failed assertion shows: the run record, the tail of every job output under `root`, the daemons' logs."""
    parts = [f"--- {run_dir / 'status.json'}\n" + ((run_dir / "status.json").read_text()
                                                   if (run_dir / "status.json").exists() else "(none)")]
    parts += [f"--- {out.name}\n" + out.read_text()[-6000:] for out in sorted(root.glob("*.out"))]
    return "\n".join(parts + [slurm.logs()])


def _wait_state(run_dir: Path, leave: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    state = leave
    while time.monotonic() < deadline:
        status = run_dir / "status.json"
        state = json.loads(status.read_text()).get("state") if status.exists() else leave
        if state != leave:
            break
        time.sleep(0.2)
    return state


def _assert_resumed_like(reference: dict, ref_order: dict, run_dir: Path, seen: Path) -> None:
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and len(status["attempts"]) == 2
    assert not list(run_dir.glob("hpc_ckpt_*"))                            # one preemption mechanism
    final = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert final["global_step"] == STEPS
    for key in reference["state_dict"]:
        assert torch.equal(final["state_dict"][key], reference["state_dict"][key]), key
    assert _order(seen) == ref_order                                       # every rank, every step


def test_sbatch_recipe_preempted_with_sigusr1_requeues_and_resumes_on_every_rank(slurm, reference, tmp_path):
    t0 = time.monotonic()
    reference, ref_order = reference
    seen = tmp_path / "seen.jsonl"
    job = _submit(slurm, _script(tmp_path, "preempted", seen, "0.25"))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and _rows(seen) < 2 * 6:             # both ranks past step 6: mid-epoch 2
        time.sleep(0.2)
    print(f"preempting at {time.monotonic() - t0:.0f} s")
    assert _rows(seen) >= 12, slurm.logs()
    slurm.run("scancel", "--signal=USR1", job)
    run_dir = tmp_path / "runs" / f"preempted-{job}-base"
    assert _wait_state(run_dir, "running", 120) == "interrupted", _told(slurm, tmp_path, run_dir)
    print(f"interrupted at {time.monotonic() - t0:.0f} s")
    stopped_at = torch.load(run_dir / "last.ckpt", weights_only=True)["global_step"]
    assert 6 <= stopped_at < STEPS
    slurm.requeue_now(job)
    state = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 300)
    assert state == "COMPLETED", _told(slurm, tmp_path, run_dir)
    print(f"requeued job done at {time.monotonic() - t0:.0f} s")
    assert int(slurm.job_field(job, "Restarts") or 0) == 1                  # requeued once, by qkvqa
    assert [p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith("preempted")] == [run_dir.name]
    _assert_resumed_like(reference, ref_order, run_dir, seen)


def test_time_limit_signal_with_wandb_on_saves_in_seconds_requeues_and_resumes(slurm, reference, tmp_path):
    """`--time=2 --signal=USR1@60`: slurmctld checks time limits every 30 s and sends the signal up to 30 s early, so
    every task (W&B's service too) gets it 30-60 s into the first attempt; that attempt trains slowly (5 s a step
    after a start of 20-30 s), so the signal lands mid-run (or, on a loaded machine, in data preparation: the job is
    requeued all the same); the requeued attempt runs at full speed. W&B offline is on, as by default."""
    t0 = time.monotonic()
    reference, ref_order = reference
    seen = tmp_path / "seen.jsonl"
    script = _script(tmp_path, "timed", seen, '$([ "${SLURM_RESTART_COUNT:-0}" = 0 ] && echo 5 || echo 0)',
                     sbatch="#SBATCH --time=2\n#SBATCH --signal=USR1@60", wandb=True)
    job = _submit(slurm, script)
    run_dir = tmp_path / "runs" / f"timed-{job}-base"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (run_dir / "status.json").exists():
        time.sleep(0.2)
    assert _wait_state(run_dir, "running", 200) == "interrupted", _told(slurm, tmp_path, run_dir)
    waited = time.monotonic() - t0
    saved = run_dir / "last.ckpt"
    stopped_at = torch.load(saved, weights_only=True)["global_step"] if saved.exists() else 0
    assert stopped_at < STEPS, stopped_at
    # The continuation gets a longer limit: a second time-limit signal (30-60 s into the attempt) would otherwise
    # stop a requeued attempt that starts slowly on a loaded machine, and this test checks one requeue.
    slurm.requeue_now(job, time_limit="10")
    state = slurm.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 300)
    assert state == "COMPLETED", _told(slurm, tmp_path, run_dir)
    print(f"interrupted at {waited:.0f} s (step {stopped_at}), requeued job done at {time.monotonic() - t0:.0f} s")
    assert int(slurm.job_field(job, "Restarts") or 0) == 1
    _assert_resumed_like(reference, ref_order, run_dir, seen)
    offline = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and len({name.rsplit("-", 1)[1] for name in offline}) == 1, offline  # one W&B run, resumed
