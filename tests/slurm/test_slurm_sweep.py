"""`qkvqa sweep --backend slurm` on a real SLURM cluster: a 4-trial sweep as one job array, one task killed mid-run,
the sweep rerun: only that trial is submitted again, it resumes, and every trial finishes exactly once (issue 16)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
STEPS = 8


def _sweep_file(tmp_path: Path) -> Path:
    path = tmp_path / "arr.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "arr",
                "program": "tests.helpers.toy",
                "method": "grid",
                "metric": {"name": "train/loss", "goal": "minimize"},
                "parameters": {"seed": {"values": [0, 1, 2, 3]}},
                "command": [
                    "${env}",
                    "${interpreter}",
                    "-m",
                    "tests.helpers.toy",
                    "trainer.accelerator=cpu",
                    "trainer.enable_progress_bar=false",
                    "trainer.log_every_n_steps=1",
                    "logger.wandb.enabled=false",
                    "trainer.max_epochs=100",
                    f"trainer.max_steps={STEPS}",
                    "trainer.deterministic=true",
                    "checkpoint.every_n_train_steps=1",
                    "${args_no_hyphens}",
                ],
            },
            sort_keys=False,
        )
    )
    return path


def _sweep(slurm, sweep_file: Path, root: Path, *extra: str) -> subprocess.Popen:
    env = {**slurm.user_env(), "OMP_NUM_THREADS": "1", "TOY_STEP_SLEEP": "1"}
    return subprocess.Popen(
        slurm.as_user(
            [
                sys.executable,
                "-m",
                "qkvqa.cli",
                "sweep",
                str(sweep_file),
                "--backend",
                "slurm",
                "--checkpoints-root",
                str(root / "runs"),
                "--sweep-dir",
                str(root / "sweep"),
                *extra,
            ]
        ),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _state(run_dir: Path):
    path = run_dir / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_sweep_as_a_job_array_reruns_only_the_killed_trial_and_each_finishes_once(slurm):
    t0 = time.monotonic()
    tmp_path = slurm.workdir("sweep-array")  # the job user's (tests/slurm/cluster.py)
    sweep_file = _sweep_file(tmp_path)
    runner = _sweep(slurm, sweep_file, tmp_path, "--wait", "--wait-timeout", "400", "--gpus-per-trial", "1")
    victim = tmp_path / "runs" / "arr-t002"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (victim / "last.ckpt").exists():  # t002 trained a step or more
        time.sleep(0.2)
    assert (victim / "last.ckpt").exists(), slurm.logs()
    manifest = json.loads((tmp_path / "sweep" / "sweep_manifest.json").read_text())
    job = manifest["trials"]["t002"]["slurm_job"]
    assert slurm.job_field(f"{job}_2", "TresPerNode") == "gres:gpu:1"  # --gpus-per-trial, counted by SLURM
    slurm.run("scancel", f"{job}_2")  # SIGTERM, as a preemption would
    print(f"killed task {job}_2 at {time.monotonic() - t0:.0f} s")
    out, _ = runner.communicate(timeout=420)
    assert runner.returncode == 0, out
    manifest = json.loads((tmp_path / "sweep" / "sweep_manifest.json").read_text())
    trials = manifest["trials"]
    assert [trials[t]["status"] for t in sorted(trials)] == ["finished", "finished", "interrupted", "finished"], out
    killed = torch.load(victim / "last.ckpt", weights_only=True)["global_step"]
    assert 1 <= killed < STEPS
    assert len(manifest["submissions"]) == 1 and manifest["submissions"][0]["trials"] == [
        "t000",
        "t001",
        "t002",
        "t003",
    ]
    before = {t: (tmp_path / "runs" / f"arr-{t}" / "status.json").read_text() for t in ("t000", "t001", "t003")}
    print(f"first array done at {time.monotonic() - t0:.0f} s")

    dry = _sweep(slurm, sweep_file, tmp_path, "--dry-run")
    plan, _ = dry.communicate(timeout=120)
    assert dry.returncode == 0, plan
    assert "t002  run" in plan and plan.count("skip (finished)") == 3 and "#SBATCH --array=2\n" in plan, plan

    rerun = _sweep(slurm, sweep_file, tmp_path, "--wait", "--wait-timeout", "300")
    out, _ = rerun.communicate(timeout=320)
    assert rerun.returncode == 0, out
    print(f"rerun done at {time.monotonic() - t0:.0f} s")
    manifest = json.loads((tmp_path / "sweep" / "sweep_manifest.json").read_text())
    assert [s["trials"] for s in manifest["submissions"]] == [["t000", "t001", "t002", "t003"], ["t002"]]
    assert all(t["status"] == "finished" for t in manifest["trials"].values()), manifest["trials"]
    for tid in ("t000", "t001", "t003"):  # untouched by the rerun
        assert (tmp_path / "runs" / f"arr-{tid}" / "status.json").read_text() == before[tid]
        assert len(_state(tmp_path / "runs" / f"arr-{tid}")["attempts"]) == 1
    status = _state(victim)
    assert status["state"] == "finished" and len(status["attempts"]) == 2  # resumed, not restarted
    assert (status.get("resumed_from") or "").endswith("last.ckpt")
    assert torch.load(victim / "last.ckpt", weights_only=True)["global_step"] == STEPS
    rows = (tmp_path / "sweep" / "comparison.csv").read_text().splitlines()
    assert len(rows) == 5 and sorted(r.split(",")[0] for r in rows[1:]) == [f"arr-t00{i}" for i in range(4)], rows
    for i in range(4):  # one log per task, across attempts
        assert list((tmp_path / "sweep" / "logs").glob(f"slurm-*_{i}.out"))
