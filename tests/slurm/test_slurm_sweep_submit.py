"""`qkvqa sweep --backend slurm` never submits a trial's array twice (issue 37 item 6): the runner records each
submission's token (its job name) before `sbatch` and looks it up on the next run. Real cluster, real sbatch: the
runner is SIGKILLed right after `sbatch` returned (before it could save the job id), or gets Ctrl-C while `sbatch`
hangs after submitting; the next run adopts that array, and SLURM ends up holding one array whose trials ran once.

The kill comes from an `sbatch` on PATH that runs the real one, then kills its caller (the runner): the runner's own
code is not changed for the test."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
STEPS = 2


def _sweep_file(tmp_path: Path, name: str, seeds: list[int]) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "program": "tests.helpers.toy",
                "method": "grid",
                "metric": {"name": "train/loss", "goal": "minimize"},
                "parameters": {"seed": {"values": seeds}},
                "command": [
                    "${env}",
                    "${interpreter}",
                    "-m",
                    "tests.helpers.toy",
                    "trainer.accelerator=cpu",
                    "trainer.enable_progress_bar=false",
                    "logger.wandb.enabled=false",
                    "trainer.max_epochs=100",
                    f"trainer.max_steps={STEPS}",
                    "${args_no_hyphens}",
                ],
            },
            sort_keys=False,
        )
    )
    return path


def _fake_sbatch(tmp_path: Path, then: str) -> tuple[Path, Path]:
    """A directory whose `sbatch` submits with the real one, writes its answer to a file, then runs `then`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    answer = tmp_path / "sbatch.answer"
    script = bin_dir / "sbatch"
    script.write_text(f"""#!/bin/bash
out=$({shutil.which("sbatch")} "$@"); rc=$?
echo "$out" > {answer}.part && mv {answer}.part {answer}
{then}
echo "$out"; exit $rc
""")
    script.chmod(0o755)
    return bin_dir, answer


def _sweep(slurm, sweep_file: Path, root: Path, *extra: str, path_first: Path | None = None) -> subprocess.Popen:
    env = {**slurm.user_env(), "OMP_NUM_THREADS": "1"}
    if path_first is not None:
        env["PATH"] = f"{path_first}{os.pathsep}{env['PATH']}"
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


def _manifest(root: Path) -> dict:
    return json.loads((root / "sweep" / "sweep_manifest.json").read_text())


def _arrays_named(slurm, prefix: str) -> set[str]:
    """Every (array) job id the controller holds, in any state, whose job name starts with `prefix`."""
    out = slurm.run("squeue", "-h", "--states=all", "-o", "%F|%j").stdout
    return {line.split("|")[0] for line in out.splitlines() if line.split("|")[-1].startswith(prefix)}


def _rerun_adopts(slurm, sweep_file: Path, root: Path, job: str, trials: list[str]) -> str:
    rerun = _sweep(slurm, sweep_file, root, "--wait", "--wait-timeout", "200")
    out, _ = rerun.communicate(timeout=240)
    assert rerun.returncode == 0, out
    manifest = _manifest(root)
    assert [(s["job"], s["trials"]) for s in manifest["submissions"]] == [(job, trials)], manifest["submissions"]
    for tid in trials:
        entry = manifest["trials"][tid]
        assert entry["status"] == "finished" and entry["slurm_job"] == job and entry["attempts"] == 1, entry
        status = json.loads((Path(entry["run_dir"]) / "status.json").read_text())
        assert status["state"] == "finished" and len(status["attempts"]) == 1, status  # ran once
    return out


def test_a_runner_killed_right_after_sbatch_returned_never_submits_the_array_again(slurm):
    t0 = time.monotonic()
    tmp_path = slurm.workdir("sweep-killed")  # the job user's (tests/slurm/cluster.py)
    sweep_file = _sweep_file(tmp_path, "once", [0, 1])
    bin_dir, answer = _fake_sbatch(tmp_path, "kill -KILL $PPID; sleep 2")
    runner = _sweep(slurm, sweep_file, tmp_path, path_first=bin_dir)
    out, _ = runner.communicate(timeout=120)
    assert runner.returncode == -signal.SIGKILL, out
    job = answer.read_text().strip().split(";")[0]
    assert job.isdigit(), answer.read_text()
    manifest = _manifest(tmp_path)  # what the killed runner left: the token, no job id
    (sub,) = manifest["submissions"]
    assert sub["job"] is None and sub["token"].startswith("once-s001-")
    assert {t["status"] for t in manifest["trials"].values()} == {"submitting"}
    assert _arrays_named(slurm, "once") == {job}
    assert slurm.job_field(job, "JobName") == sub["token"]

    out = _rerun_adopts(slurm, sweep_file, tmp_path, job, ["t000", "t001"])
    assert f"adopted SLURM array job {job}" in out, out
    assert _arrays_named(slurm, "once") == {job}  # one array, never a second
    print(f"killed runner's array adopted and finished in {time.monotonic() - t0:.0f} s")


def test_ctrl_c_while_sbatch_hangs_after_submitting_records_the_array(slurm):
    t0 = time.monotonic()
    tmp_path = slurm.workdir("sweep-ctrl-c")
    sweep_file = _sweep_file(tmp_path, "intr", [0])
    bin_dir, answer = _fake_sbatch(tmp_path, "exec sleep 60")  # submitted, the answer never comes
    runner = _sweep(slurm, sweep_file, tmp_path, path_first=bin_dir)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not answer.exists():
        time.sleep(0.2)
    assert answer.exists(), runner.poll()
    job = answer.read_text().strip().split(";")[0]
    runner.send_signal(signal.SIGINT)  # Ctrl-C
    out, _ = runner.communicate(timeout=180)  # bounded; a loaded machine took over 60 s
    assert runner.returncode == 130, out
    manifest = _manifest(tmp_path)  # adopted at once, by the token
    assert [s["job"] for s in manifest["submissions"]] == [job], (manifest["submissions"], out)
    assert manifest["trials"]["t000"]["status"] in ("queued", "running"), manifest["trials"]

    _rerun_adopts(slurm, sweep_file, tmp_path, job, ["t000"])
    assert _arrays_named(slurm, "intr") == {job}
    print(f"Ctrl-C'd runner's array recorded and finished in {time.monotonic() - t0:.0f} s")
