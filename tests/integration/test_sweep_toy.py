"""Offline sweeps over the toy training task: real subprocess trials, a failing trial, reruns that skip."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from qkvqa.cli.main import main
from qkvqa.run.record import RunRecord
from qkvqa.run.sweep_manifest import Manifest
from tests.integration.test_wandb_offline import leet

REPO = Path(__file__).resolve().parents[2]
TOY = [
    "${env}",
    "${interpreter}",
    "-m",
    "tests.helpers.toy",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.max_epochs=1",
    "${args_no_hyphens}",
]


def _write_sweep(tmp_path, name, parameters):
    path = tmp_path / f"{name}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": name,
                "program": "tests.helpers.toy",
                "method": "grid",
                "metric": {"name": "train/loss", "goal": "minimize"},
                "parameters": parameters,
                "command": TOY,
            },
            sort_keys=False,
        )
    )
    return path


def _comparison(sweep_dir):
    with open(sweep_dir / "comparison.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_offline_grid_sweep_runs_each_trial_as_its_own_run(tmp_path, run_root, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("WANDB_MODE", "offline")
    path = _write_sweep(tmp_path, "grid", {"seed": {"values": [1, 2]}, "trainer.max_steps": {"values": [2, 3]}})
    args = ["sweep", str(path), "--checkpoints-root", str(run_root), "--parallel", "2"]
    assert main(args) == 0
    sweep_dir = run_root / "sweeps" / "grid"
    trials = Manifest.load(sweep_dir).trials
    assert len(trials) == 4 and len({t["pid"] for t in trials.values()} | {None}) == 1  # pids cleared when done
    for tid, trial in trials.items():
        assert trial["status"] == "finished" and trial["attempts"] == 1
        run_dir = run_root / f"grid-{tid}"
        cfg = OmegaConf.load(run_dir / "config.yaml")
        assert (cfg.seed, cfg.trainer.max_steps) == (trial["params"]["seed"], trial["params"]["trainer.max_steps"])
        assert json.loads((run_dir / "summary.json").read_text())["global_step"] == cfg.trainer.max_steps
        offline = list((run_dir / "wandb").glob("offline-run-*"))
        assert len(offline) == 1 and offline[0].name.endswith(f"-grid-{tid}")  # W&B id = trial run id
    rows = _comparison(sweep_dir)
    losses = [float(r["best_value"]) for r in rows]
    assert len(rows) == 4 and losses == sorted(losses)  # best first (goal: minimize)
    for r in rows:  # each trial's own best, whatever the figures
        logged = [m["value"] for m in RunRecord(run_root / r["run_id"]).read_metrics() if m["name"] == "train/loss"]
        assert float(r["best_value"]) == min(logged)
    assert {(r["seed"], r["trainer.max_steps"]) for r in rows} == {("1", "2"), ("1", "3"), ("2", "2"), ("2", "3")}
    sweep_runs = sorted((sweep_dir / "wandb").glob("offline-run-*"))  # the sweep's own W&B run
    assert len(sweep_runs) == 1 and sweep_runs[0].name.endswith("-sweep-grid")
    records = leet(sweep_runs[0])
    assert [r["run"]["job_type"] for r in records if r.get("type") == "run"] == ["sweep"]
    summary = leet(sweep_runs[0], "--summary")[0]["summary"]
    assert summary["trials/finished"] == 4 and summary["best/run_id"] == rows[0]["run_id"]
    assert summary["sweep/trials"]["nrows"] == 4

    status_before = {tid: (run_root / f"grid-{tid}" / "status.json").read_text() for tid in trials}
    assert main(args) == 0  # rerun: every trial is skipped
    assert Manifest.load(sweep_dir).trials == trials
    assert {tid: (run_root / f"grid-{tid}" / "status.json").read_text() for tid in trials} == status_before
    assert len(_comparison(sweep_dir)) == 4


@pytest.mark.slow
def test_failing_trial_is_marked_failed_while_the_others_finish(tmp_path, run_root, monkeypatch):
    """ModelCheckpoint refuses save_top_k=-5 when it monitors a metric: one grid point of two fails."""
    monkeypatch.chdir(REPO)
    path = _write_sweep(
        tmp_path,
        "fails",
        {
            "checkpoint.monitor": {"value": "train/loss"},
            "checkpoint.save_top_k": {"values": [1, -5]},
            "trainer.max_steps": {"value": 2},
        },
    )
    assert main(["sweep", str(path), "--checkpoints-root", str(run_root), "--parallel", "2"]) == 1
    sweep_dir = run_root / "sweeps" / "fails"
    trials = Manifest.load(sweep_dir).trials
    states = {tid: t["status"] for tid, t in trials.items()}
    assert states == {"t000": "finished", "t001": "failed"}
    assert trials["t001"]["params"] == {
        "checkpoint.monitor": "train/loss",
        "checkpoint.save_top_k": -5,
        "trainer.max_steps": 2,
    }
    assert trials["t001"]["returncode"] != 0 and "save_top_k" in (sweep_dir / trials["t001"]["log"]).read_text()
    assert json.loads((run_root / "fails-t001" / "status.json").read_text())["state"] == "failed"
    assert OmegaConf.load(run_root / "fails-t000" / "config.yaml").checkpoint.save_top_k == 1
    assert sorted(r["run_id"] for r in _comparison(sweep_dir)) == ["fails-t000"]


@pytest.mark.slow
def test_a_trial_whose_experiment_changed_since_its_run_is_changed_not_finished(
    world, tmp_path, run_root, monkeypatch, capsys
):
    """Real `qkvqa retrieve` trials (stage 1 from a results file: no model); then the experiment file is edited."""
    from qkvqa.retrieval.results import write_results
    from tests.helpers.qff_study import world_stage1

    experiments = tmp_path / "experiments"
    experiments.mkdir()
    for name in ("base", "presets"):
        (experiments / name).symlink_to(REPO / "experiments" / name)
    write_results(tmp_path / "stage1.json", world_stage1(world, "test"))
    data = yaml.safe_load((Path(world["dir"]) / "data_evqa.yaml").read_text(encoding="utf-8"))
    experiment = {
        "data": data,
        "retrieval": {"results": str(tmp_path / "stage1.json")},
        "paths": {"cache_dir": str(tmp_path / "cache")},
        "logger": {"wandb": {"enabled": False}},
    }
    (experiments / "world_retrieve.yaml").write_text(yaml.safe_dump(experiment))
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(experiments))
    monkeypatch.chdir(REPO)
    path = tmp_path / "stage1.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "stage1",
                "method": "grid",
                "metric": {"name": "retrieval/test/recall@1", "goal": "maximize"},
                "parameters": {"retrieval.top_k": {"values": [5, 10]}},
                "command": [
                    "${env}",
                    "${interpreter}",
                    "-m",
                    "qkvqa.cli",
                    "retrieve",
                    "experiment=world_retrieve",
                    "split=test",
                    "${args_no_hyphens}",
                ],
            }
        )
    )
    args = ["sweep", str(path), "--checkpoints-root", str(run_root)]
    assert main(args) == 0
    capsys.readouterr()

    experiment["data"]["num_workers"] = 1  # a key a resume may change: the results still stand
    (experiments / "world_retrieve.yaml").write_text(yaml.safe_dump(experiment))
    assert main([*args, "--dry-run"]) == 0
    assert capsys.readouterr().out.count("skip (finished)") == 2

    experiment["data"]["max_questions"] = 10  # another question set: the runs are not this sweep's
    (experiments / "world_retrieve.yaml").write_text(yaml.safe_dump(experiment))
    assert main([*args, "--dry-run"]) == 2
    out, err = capsys.readouterr()
    assert "t000  changed (finished)" in out and "t001  changed (finished)" in out and "skip" not in out
    assert "its config changed since it ran" in err and "data.max_questions: None -> 10" in err
    trials = Manifest.load(run_root / "sweeps" / "stage1").trials
    assert main(args) == 2 and "data.max_questions: None -> 10" in capsys.readouterr().err  # refused, as said
    assert Manifest.load(run_root / "sweeps" / "stage1").trials == trials  # nothing relaunched
