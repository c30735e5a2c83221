"""The SLURM sweep backend's pieces that need no cluster: the array script and the task's trial lookup (the
whole backend runs on a real cluster in tests/slurm/test_slurm_sweep.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qkvqa.run.sweep_manifest import Manifest
from qkvqa.sweep.array_task import trial_command
from qkvqa.sweep.slurm_array import array_spec, render_array_script, settled_status


def test_the_array_script_runs_one_trial_per_task_under_srun(tmp_path):
    script = render_array_script(
        "alpha",
        tmp_path / "sweep",
        [0, 3, 7],
        cwd=Path("/repo"),
        interpreter="/venv/python",
        parallel=2,
        gpus_per_trial=1,
    )
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert "#SBATCH --array=0,3,7%2" in lines and "#SBATCH --job-name=alpha" in lines
    assert "#SBATCH --requeue" in lines and "#SBATCH --open-mode=append" in lines and "#SBATCH --gres=gpu:1" in lines
    assert f"#SBATCH --output={(tmp_path / 'sweep').resolve()}/logs/slurm-%A_%a.out" in lines
    assert lines[-1] == f"srun /venv/python -m qkvqa.sweep.array_task {(tmp_path / 'sweep').resolve()}"
    assert "--gres" not in render_array_script("a", tmp_path, [1], cwd=tmp_path, interpreter="python")
    assert array_spec([1, 2], None) == "1,2"


def test_a_task_finds_its_trial_by_array_index_or_says_why_not(tmp_path):
    manifest = Manifest.create(tmp_path, {"sweep": "s"})
    manifest.trials.update(
        {
            "t000": {"index": 0, "argv": ["python", "-c", "0"]},
            "t001": {"index": 1, "argv": ["python", "-c", "1"]},
            "t002": {"index": 2, "argv": None},
        }
    )
    manifest.save()
    assert trial_command(tmp_path, 1) == ("t001", ["python", "-c", "1"])
    with pytest.raises(SystemExit, match="no submitted trial has index 2"):
        trial_command(tmp_path, 2)
    with pytest.raises(SystemExit, match="no sweep_manifest.json"):
        trial_command(tmp_path / "elsewhere", 0)


def test_a_task_that_left_the_queue_is_settled_from_its_run_record():
    assert settled_status("finished", True) == "finished" and settled_status("failed", True) == "failed"
    assert settled_status("running", True) == "interrupted"  # killed: no chance to write its end
    assert settled_status("interrupted", True) == "interrupted"
    assert settled_status(None, False) == "pending"  # cancelled while pending: submit it again
    assert settled_status(None, True) == "failed"  # started, died before its run: visible


# --- a submission recorded before sbatch whose job id the runner never read (issue 37 item 6); the whole path runs on
# the real cluster in tests/slurm/test_slurm_sweep_submit.py, these are its branches with SLURM's answers on PATH.


def _slurm_answers(tmp_path, monkeypatch, squeue: str = "", sacct: str | None = None) -> None:
    """`squeue` printing `squeue`, `sacct` printing `sacct` (None: accounting off, an error), `sbatch` present."""
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "squeue": f"printf '%s' '{squeue}'",
        "sacct": ("echo 'accounting storage is disabled' >&2; exit 1" if sacct is None else f"printf '%s' '{sacct}'"),
        "sbatch": "echo 'no submitting here' >&2; exit 1",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def _half_submitted(tmp_path):
    """A sweep of two trials whose runner died after writing submission `arr-s001-feedc0de` and before its job id."""
    import yaml

    from qkvqa.cli.sweep import compose_command
    from qkvqa.sweep.slurm_array import SUBMITTING, SlurmSweep
    from qkvqa.sweep.spec import load_sweep

    path = tmp_path / "arr.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "arr",
                "method": "grid",
                "metric": {"name": "m", "goal": "minimize"},
                "parameters": {"seed": {"values": [0, 1]}},
                "command": ["python", "-m", "x", "${args_no_hyphens}"],
            }
        )
    )
    sweep = SlurmSweep(
        load_sweep(path), compose=compose_command, checkpoints_root=tmp_path / "runs", sweep_dir=tmp_path / "sweep"
    )
    manifest = Manifest.create(tmp_path / "sweep", {"sweep": "arr"})
    for trial in sweep.trials:
        manifest.trials[trial.trial_id] = {
            "index": trial.index,
            "status": SUBMITTING,
            "submission": "arr-s001-feedc0de",
            "status_before_submit": "interrupted",
            "attempts": 1,
            "run_dir": str(tmp_path / "runs" / trial.run_id),
            "argv": ["python"],
        }
    manifest.data["submissions"] = [{"token": "arr-s001-feedc0de", "job": None, "trials": ["t000", "t001"]}]
    manifest.save()
    return sweep, Manifest.load(tmp_path / "sweep")


def test_a_submission_slurm_never_got_releases_its_trials(tmp_path, monkeypatch):
    from qkvqa.sweep.slurm_array import _submittable

    _slurm_answers(tmp_path, monkeypatch)  # squeue: nothing; sacct: accounting off; no logs
    sweep, manifest = _half_submitted(tmp_path)
    sweep.settle_submissions(manifest)
    assert manifest.data["submissions"][0]["outcome"] == "not submitted"
    assert [e["status"] for e in manifest.trials.values()] == ["interrupted", "interrupted"]
    assert all(_submittable(e, False) for e in manifest.trials.values())


def test_a_submission_is_adopted_from_accounting_or_from_its_task_logs(tmp_path, monkeypatch):
    _slurm_answers(tmp_path, monkeypatch, sacct="4242_0\n4242_1\n")
    sweep, manifest = _half_submitted(tmp_path)
    sweep.settle_submissions(manifest)
    assert manifest.data["submissions"][0]["job"] == "4242"
    assert [(e["status"], e["slurm_job"], e["log"], e["attempts"]) for e in manifest.trials.values()] == [
        ("queued", "4242", "logs/slurm-4242_0.out", 2),
        ("queued", "4242", "logs/slurm-4242_1.out", 2),
    ]

    logs = tmp_path / "logs-case"
    logs.mkdir()
    _slurm_answers(logs, monkeypatch)  # forgotten by the controller, no accounting
    sweep, manifest = _half_submitted(logs)
    (logs / "sweep" / "logs").mkdir()
    (logs / "sweep" / "logs" / "slurm-77_1.out").write_text(
        "=== 2026-01-01T00:00:00 trial t001, array task 77_1, job name arr-s001-feedc0de, restart 0: python\n"
    )
    sweep.settle_submissions(manifest)
    assert manifest.data["submissions"][0]["job"] == "77"


def test_the_sweep_names_its_arrays_itself(tmp_path, monkeypatch):
    from qkvqa.errors import ConfigError

    _slurm_answers(tmp_path, monkeypatch)
    sweep, _ = _half_submitted(tmp_path)
    sweep.sbatch_args = ["--job-name=mine"]
    with pytest.raises(ConfigError, match="names each array itself"):
        sweep.run()


def _hanging_sbatch(tmp_path, monkeypatch, submits: bool) -> Path:
    """`sbatch` that hangs past the runner's timeout after submitting (`submits`: it records the script's job name,
    and `squeue --name=THAT` then answers job 5151) or before; `sacct` off. Returns the record of what it submitted."""
    import os

    from qkvqa.sweep import slurm_array

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    submitted = tmp_path / "submitted"
    record = f"sed -n 's/^#SBATCH --job-name=//p' \"${{@: -1}}\" >> {submitted}" if submits else ":"
    scripts = {
        "sbatch": f"{record}\nexec sleep 30",  # exec: the timeout kills the sleep itself, no orphan holds the pipe
        # answers 5151 for a name sbatch recorded (the runner asks by its token), and lists its two tasks as pending
        "squeue": f'for a in "$@"; do case "$a" in --name=*) grep -qx "${{a#--name=}}" {submitted} 2>/dev/null '
        f"&& echo 5151;; '%F|%K|%T') [ -e {submitted} ] && printf '5151|0|PENDING\\n5151|1|PENDING\\n';; esac; "
        "done; exit 0",
        "sacct": "echo 'accounting storage is disabled' >&2; exit 1",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm_array, "SBATCH_TIMEOUT_S", 1.0)
    return submitted


def _fresh_sweep(tmp_path):
    sweep, _ = _half_submitted(tmp_path)  # the sweep's spec and trials; its manifest is started anew
    import shutil

    shutil.rmtree(tmp_path / "sweep")
    return sweep


@pytest.mark.slow
@pytest.mark.parametrize("submits", [True, False], ids=["submitted-then-hung", "hung-before-submitting"])
def test_an_sbatch_that_times_out_is_settled_by_its_token_and_never_submitted_twice(tmp_path, monkeypatch, submits):
    """A timeout during `sbatch` (issue 37 item 6): sbatch may or may not have submitted. The runner asks SLURM by the
    submission's token: a submitted array is adopted (recorded, nothing submitted again); one SLURM never got is
    released by the next run and submitted once."""
    import subprocess

    from qkvqa.run.sweep_manifest import Manifest

    submitted = _hanging_sbatch(tmp_path, monkeypatch, submits)
    sweep = _fresh_sweep(tmp_path)
    if submits:
        sweep.run()  # adopted: the runner goes on
        manifest = Manifest.load(tmp_path / "sweep")
        (sub,) = manifest.data["submissions"]
        assert sub["job"] == "5151" and submitted.read_text().split() == [sub["token"]]
        assert [(e["status"], e["slurm_job"]) for e in manifest.trials.values()] == [("queued", "5151")] * 2
    else:
        with pytest.raises(subprocess.TimeoutExpired):
            sweep.run()
        manifest = Manifest.load(tmp_path / "sweep")
        (sub,) = manifest.data["submissions"]
        assert sub["job"] is None and [e["status"] for e in manifest.trials.values()] == ["submitting"] * 2
        assert not submitted.exists()
    # the next run: nothing is submitted twice (a submitted array stays adopted; a lost one is submitted once more)
    calls = tmp_path / "calls"
    (tmp_path / "bin" / "sbatch").write_text(f"#!/bin/bash\necho x >> {calls}\necho 6262\n")
    sweep.run()
    manifest = Manifest.load(tmp_path / "sweep")
    jobs = [s["job"] for s in manifest.data["submissions"] if s.get("job")]
    if submits:
        assert not calls.exists() and jobs == ["5151"]
    else:
        assert calls.read_text().split() == ["x"] and jobs == ["6262"]
        assert manifest.data["submissions"][0].get("outcome") == "not submitted"
