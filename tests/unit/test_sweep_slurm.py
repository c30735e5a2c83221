"""The SLURM sweep backend's pieces that need no cluster: the array script and the task's trial lookup (the
whole backend runs on a real cluster in tests/slurm/test_slurm_sweep.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from qkvqa.sweep.array_task import trial_command
from qkvqa.sweep.manifest import Manifest
from qkvqa.sweep.slurm_array import array_spec, render_array_script, settled_status


def test_the_array_script_runs_one_trial_per_task_under_srun(tmp_path):
    script = render_array_script("alpha", tmp_path / "sweep", [0, 3, 7], cwd=Path("/repo"), interpreter="/venv/python",
                                 parallel=2, gpus_per_trial=1)
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
    manifest.trials.update({"t000": {"index": 0, "argv": ["python", "-c", "0"]},
                            "t001": {"index": 1, "argv": ["python", "-c", "1"]},
                            "t002": {"index": 2, "argv": None}})
    manifest.save()
    assert trial_command(tmp_path, 1) == ("t001", ["python", "-c", "1"])
    with pytest.raises(SystemExit, match="no submitted trial has index 2"):
        trial_command(tmp_path, 2)
    with pytest.raises(SystemExit, match="no sweep_manifest.json"):
        trial_command(tmp_path / "elsewhere", 0)


def test_a_task_that_left_the_queue_is_settled_from_its_run_record():
    assert settled_status("finished", True) == "finished" and settled_status("failed", True) == "failed"
    assert settled_status("running", True) == "interrupted"           # killed: no chance to write its end
    assert settled_status("interrupted", True) == "interrupted"
    assert settled_status(None, False) == "pending"                   # cancelled while pending: submit it again
    assert settled_status(None, True) == "failed"                     # started, died before its run: visible
