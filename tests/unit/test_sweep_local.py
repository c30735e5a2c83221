"""The local sweep runner with a fast, real qkvqa job (run records, no Trainer): manifest, failures, reruns."""

from __future__ import annotations

import csv
import json
import os
import socket

import pytest
import yaml
from omegaconf import OmegaConf

from qkvqa.cli.main import main
from qkvqa.cli.sweep import compose_command
from qkvqa.errors import ConfigError
from qkvqa.run.sweep_manifest import LOCK_NAME, Manifest, RunnerLock
from qkvqa.sweep.local import LocalSweep, trial_env
from qkvqa.sweep.spec import load_sweep

# A qkvqa job that writes a real run record; score = alpha + seed / 10; alpha > 0.95 fails.
JOB = """\
import json, os, sys, time
from qkvqa.config.cli import split_overrides
from qkvqa.config.load import compose
from qkvqa.run.job import run_job

experiment, presets, rest = split_overrides(sys.argv[1:])
cfg = compose(experiment, presets, rest)
print("ENV", json.dumps({k: os.environ.get(k) for k in ("WANDB_RUN_ID", "WANDB_SWEEP_ID", "QKVQA_RUN_ID", "WANDB_MODE",
                                                         "CUDA_VISIBLE_DEVICES")}))
with run_job(cfg, "fake") as job:
    if cfg.qff.alpha == 0.4:
        start = time.time()
        time.sleep(float(os.environ.get("JOB_SLEEP_S", "0")))
        print("SLEPT", json.dumps([start, time.time()]))
    if cfg.qff.alpha > 0.95:
        raise RuntimeError("alpha out of range for this job")
    score = cfg.qff.alpha + cfg.seed / 10
    job.record.append_metrics({"score": score - 0.5}, step=0)
    job.record.append_metrics({"score": score}, step=1)
    job.record.update_summary({"score": score})
"""


@pytest.fixture
def make_sweep(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(JOB)

    def make(parameters, name="fake", **extra):
        path = tmp_path / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "name": name,
                    "method": "grid",
                    "metric": {"name": "score", "goal": "maximize"},
                    "parameters": parameters,
                    "command": ["${interpreter}", str(job), "${args_no_hyphens}"],
                    **extra,
                }
            )
        )
        return path

    return make


def _manifest(run_root, name="fake"):
    return Manifest.load(run_root / "sweeps" / name)


@pytest.mark.slow  # seconds: `make test` runs it, `make test-fast` does not
def test_grid_trials_run_in_parallel_and_are_compared(make_sweep, run_root):
    path = make_sweep({"qff.alpha": {"values": [0.2, 0.6]}, "seed": {"values": [1, 2]}})
    result = LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root, parallel=2).run()
    trials = result.manifest.trials
    assert sorted(trials) == ["t000", "t001", "t002", "t003"] and result.count("finished") == 4
    for tid, t in trials.items():
        assert (
            t["status"] == "finished" and t["returncode"] == 0 and t["attempts"] == 1 and t["run_state"] == "finished"
        )
        assert t["run_dir"] == str((run_root / f"fake-{tid}").resolve()) and t["overrides"][0].startswith("qff.alpha=")
        saved = OmegaConf.load(run_root / f"fake-{tid}" / "config.yaml")
        assert saved.qff.alpha == t["params"]["qff.alpha"] and saved.seed == t["params"]["seed"]
        assert saved.run_id == f"fake-{tid}" and saved.logger.wandb.group == "fake"
        assert (result.sweep_dir / t["log"]).is_file()
    with open(result.sweep_dir / "comparison.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["best_value"]) for r in rows] == pytest.approx([0.8, 0.7, 0.4, 0.3])  # maximize: best first
    assert [r["best_step"] for r in rows] == ["1"] * 4 and {r["state"] for r in rows} == {"finished"}
    assert {"qff.alpha", "seed"} <= set(rows[0]) and "run_id" in rows[0]
    assert "| best score (maximize) |" in (result.sweep_dir / "comparison.md").read_text()


@pytest.mark.slow  # seconds: `make test` runs it, `make test-fast` does not
def test_failed_trial_is_recorded_and_only_retried_on_request(make_sweep, run_root, capsys):
    path = make_sweep({"qff.alpha": {"values": [0.5, 1.0]}})
    args = ["sweep", str(path), "--checkpoints-root", str(run_root), "--parallel", "2"]
    assert main(args) == 1
    trials = _manifest(run_root).trials
    assert trials["t000"]["status"] == "finished" and trials["t001"]["status"] == "failed"
    assert trials["t001"]["returncode"] == 1 and trials["t001"]["run_state"] == "failed"
    log_text = (run_root / "sweeps" / "fake" / trials["t001"]["log"]).read_text()
    assert "alpha out of range" in log_text and "1 finished, 1 failed" in capsys.readouterr().out

    assert main(args) == 1  # rerun: nothing launched
    again = _manifest(run_root).trials
    assert again["t000"]["attempts"] == 1 and again["t001"]["attempts"] == 1
    assert again["t000"]["finished_at"] == trials["t000"]["finished_at"]

    main([*args, "--dry-run", "--retry-failed"])
    plan = capsys.readouterr().out
    assert "t000  skip (finished)" in plan and "t001  run" in plan and "qff.alpha=1.0" in plan

    assert main([*args, "--retry-failed"]) == 1
    retried = _manifest(run_root).trials
    assert retried["t000"]["attempts"] == 1 and retried["t001"]["attempts"] == 2
    assert (run_root / "sweeps" / "fake" / "logs" / "t001.log").read_text().count("=== ") == 2


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_stale_running_trial_is_relaunched_in_its_run_dir(make_sweep, run_root):
    path = make_sweep({"qff.alpha": {"values": [0.3]}})
    LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root).run()
    manifest = _manifest(run_root)
    manifest.update_trial("t000", status="running")  # the runner died while the trial ran
    result = LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root).run()
    assert result.launched == ["t000"] and result.manifest.trials["t000"]["status"] == "finished"
    status = json.loads((run_root / "fake-t000" / "status.json").read_text())
    assert len(status["attempts"]) == 2 and sorted(p.name for p in run_root.iterdir()) == ["fake-t000", "sweeps"]


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_stopped_runner_terminates_its_trials_and_the_rerun_continues_them(make_sweep, run_root, monkeypatch):
    path = make_sweep({"qff.alpha": {"values": [0.2, 0.4]}})
    monkeypatch.setenv("JOB_SLEEP_S", "60")
    finish = LocalSweep._finish

    def finish_then_interrupt(self, manifest, item):  # Ctrl-C right after the quick trial ends
        finish(self, manifest, item)
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalSweep, "_finish", finish_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root, parallel=2).run()
    trials = _manifest(run_root).trials
    assert trials["t000"]["status"] == "finished" and trials["t001"]["status"] == "interrupted"
    assert trials["t001"]["returncode"] != 0 and not (run_root / "sweeps" / "fake" / ".runner.lock").exists()

    monkeypatch.setattr(LocalSweep, "_finish", finish)
    monkeypatch.delenv("JOB_SLEEP_S")
    result = LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root, parallel=2).run()
    assert result.launched == ["t001"] and result.manifest.trials["t001"]["status"] == "finished"
    assert result.manifest.trials["t001"]["attempts"] == 2


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_changed_sweep_is_refused_on_rerun_and_the_dry_run_says_so(make_sweep, run_root, capsys):
    LocalSweep(
        load_sweep(make_sweep({"qff.alpha": {"values": [0.3]}})), compose=compose_command, checkpoints_root=run_root
    ).run()
    path = make_sweep({"qff.alpha": {"values": [0.4]}})
    with pytest.raises(ConfigError, match="another name"):
        LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root).run()
    capsys.readouterr()
    assert main(["sweep", str(path), "--checkpoints-root", str(run_root), "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "t000  changed (finished)" in out and "skip" not in out  # not "finished": it ran with 0.3
    assert "trial t000 was run with {'qff.alpha': 0.3}" in err and "another name" in err


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_a_trial_whose_command_changed_is_not_shown_as_finished(make_sweep, run_root, capsys):
    path = make_sweep({"qff.alpha": {"values": [0.3, 0.5]}})
    LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root).run()
    args = ["sweep", str(path), "--checkpoints-root", str(run_root), "--dry-run"]
    assert main(args) == 0 and capsys.readouterr().out.count("skip (finished)") == 2  # unchanged: skipped
    spec = yaml.safe_load(path.read_text())
    spec["command"].insert(2, "seed=7")  # another run than the one that ran
    path.write_text(yaml.safe_dump(spec))
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert "t000  changed (finished)" in out and "t001  changed (finished)" in out and "skip" not in out
    assert "its command changed since it ran" in err and "seed=7" in err and "t001" in err
    with pytest.raises(ConfigError, match="its command changed since it ran"):
        LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root).run()
    assert _manifest(run_root).trials["t000"]["attempts"] == 1  # nothing was relaunched


@pytest.mark.slow
def test_trials_get_no_leaked_run_identity(make_sweep, run_root, monkeypatch):
    for key, value in {
        "WANDB_RUN_ID": "stale",
        "WANDB_SWEEP_ID": "old",
        "QKVQA_RUN_ID": "x",
        "WANDB_MODE": "disabled",
    }.items():
        monkeypatch.setenv(key, value)
    assert not {"WANDB_RUN_ID", "WANDB_SWEEP_ID", "QKVQA_RUN_ID"} & set(trial_env(os.environ))
    result = LocalSweep(
        load_sweep(make_sweep({"qff.alpha": {"values": [0.3]}})), compose=compose_command, checkpoints_root=run_root
    ).run()
    line = next(t for t in (result.sweep_dir / "logs" / "t000.log").read_text().splitlines() if t.startswith("ENV "))
    env = json.loads(line[4:])
    assert {k: env[k] for k in ("WANDB_RUN_ID", "WANDB_SWEEP_ID", "QKVQA_RUN_ID", "WANDB_MODE")} == {
        "WANDB_RUN_ID": None,
        "WANDB_SWEEP_ID": None,
        "QKVQA_RUN_ID": None,
        "WANDB_MODE": "disabled",
    }
    assert os.environ["WANDB_RUN_ID"] == "stale"  # the runner's own environment is untouched


@pytest.mark.slow  # seconds: `make test` runs it, `make test-fast` does not
def test_seeded_random_sweep_plans_the_same_trials(make_sweep, run_root, capsys):
    path = make_sweep(
        {"qff.alpha": {"min": 0.0, "max": 0.9}, "seed": {"min": 0, "max": 99}}, name="rnd", method="random"
    )
    plans = []
    for seed in (5, 5, 6):
        main(
            ["sweep", str(path), "--checkpoints-root", str(run_root), "--count", "3", "--seed", str(seed), "--dry-run"]
        )
        plans.append(capsys.readouterr().out)
    assert plans[0] == plans[1] != plans[2] and plans[0].count("qff.alpha=") == 3


@pytest.mark.slow
def test_rerun_reuses_the_recorded_seed(make_sweep, run_root):
    path = make_sweep({"qff.alpha": {"min": 0.0, "max": 0.9}}, name="rnd", method="random")
    first = LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root, count=2, seed=11).run()
    again = LocalSweep(load_sweep(path), compose=compose_command, checkpoints_root=run_root, count=3)
    assert again.seed == 11 and [t.params for t in again.trials[:2]] == [
        t["params"] for t in first.manifest.trials.values()
    ]


def test_runner_lock(tmp_path):
    with RunnerLock(tmp_path):
        with pytest.raises(ConfigError, match="in use by a runner"):
            RunnerLock(tmp_path).__enter__()
    assert not (tmp_path / LOCK_NAME).exists()
    (tmp_path / LOCK_NAME).write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname()}))
    with RunnerLock(tmp_path):  # a dead runner's lock is taken over
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()


@pytest.mark.slow  # seconds: `make test` runs it, `make test-fast` does not
def test_gpus_per_trial_shares_the_pool_without_overlap(make_sweep, run_root, monkeypatch):
    """8 GPUs' worth of pool in small: 4 devices, 2 per trial, so 2 trials at a time, each on its own pair."""
    monkeypatch.setenv("JOB_SLEEP_S", "1.5")
    path = make_sweep({"qff.alpha": {"value": 0.4}, "seed": {"values": [1, 2, 3, 4]}})
    assert (
        main(["sweep", str(path), "--checkpoints-root", str(run_root), "--gpus", "0,1,2,3", "--gpus-per-trial", "2"])
        == 0
    )  # --parallel follows from the pool: 2
    manifest = _manifest(run_root)
    seen = {}
    for tid, t in manifest.trials.items():
        text = (manifest.sweep_dir / t["log"]).read_text()
        env = json.loads(text.split("ENV ", 1)[1].splitlines()[0])
        window = json.loads(text.split("SLEPT ", 1)[1].splitlines()[0])
        gpus = env["CUDA_VISIBLE_DEVICES"].split(",")
        assert len(set(gpus)) == 2 and set(gpus) <= {"0", "1", "2", "3"} and t["gpus"] == gpus
        seen[tid] = (set(gpus), window)
    overlapping = [
        (a, b) for a in seen for b in seen if a < b and seen[a][1][0] < seen[b][1][1] and seen[b][1][0] < seen[a][1][1]
    ]
    assert overlapping  # two trials did run at once
    for a, b in overlapping:
        assert not seen[a][0] & seen[b][0], (a, b, seen[a][0], seen[b][0])


def test_gpus_per_trial_larger_than_the_pool_is_one_clear_error(make_sweep, run_root, capsys):
    path = make_sweep({"seed": {"values": [1]}})
    assert main(["sweep", str(path), "--checkpoints-root", str(run_root), "--gpus", "0", "--gpus-per-trial", "2"]) != 0
    err = capsys.readouterr().err
    assert "--gpus-per-trial 2 needs 2 GPUs but 1 is available" in err and "--gpus" in err
