"""Run records with a real Trainer: one directory per run, reuse on resume, checkpoint hygiene."""

from __future__ import annotations

import json

import pytest
import torch

from qkvqa.config.load import compose
from qkvqa.errors import ConfigError
from qkvqa.run.record import RunRecord
from qkvqa.run.rundir import clear_run_env
from qkvqa.run.trainer import fit
from tests.helpers.toy import ToyDataModule, ToyRegressor

BASE = [
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "logger.wandb.enabled=false",
    "trainer.max_epochs=50",
]


def _cfg(run_root, *extra):
    return compose(None, [], [f"paths.checkpoints_root={run_root}", *BASE, *extra])


def _fit(cfg):
    clear_run_env()
    return fit(cfg, ToyRegressor(total_steps=100), ToyDataModule(), batch_size=8)


@pytest.mark.slow
def test_run_dir_holds_the_record(run_root):
    summary = _fit(_cfg(run_root, "run_id=rec", "trainer.max_steps=3"))
    run_dir = run_root / "rec"
    assert sorted(p.name for p in run_root.iterdir()) == ["rec"]
    for name in ("config.yaml", "status.json", "metrics.csv", "summary.json", "last.ckpt"):
        assert (run_dir / name).exists(), name
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == 1 and status["run_id"] == "rec"
    assert status["host"] and status["created_at"] and status["finished_at"] and len(status["attempts"]) == 1
    assert summary["global_step"] == 3 and "train/loss" in summary
    rows = RunRecord(run_dir).read_metrics()
    assert [r["step"] for r in rows if r["name"] == "train/loss"] == [1, 2, 3]  # step N: after N optimizer steps


@pytest.mark.slow
def test_new_run_ids_are_unique_directories(run_root):
    _fit(_cfg(run_root, "trainer.max_steps=1"))
    _fit(_cfg(run_root, "trainer.max_steps=1"))
    assert len(list(run_root.iterdir())) == 2


@pytest.mark.slow
def test_checkpoint_loads_with_weights_only_and_holds_the_run_state(run_root):
    _fit(_cfg(run_root, "run_id=ck", "trainer.max_steps=2", "qff.lr=1e-05"))
    ckpt = torch.load(run_root / "ck" / "last.ckpt", weights_only=True)
    state = ckpt["qkvqa"]
    assert state["run_id"] == "ck" and state["world_size"] == 1 and state["global_batch_size"] == 8
    assert isinstance(state["config"], dict) and state["config"]["qff"]["lr"] == pytest.approx(1e-5)
    assert ckpt["global_step"] == 2


@pytest.mark.slow
def test_resume_reuses_the_directory_and_appends_metrics(run_root):
    _fit(_cfg(run_root, "run_id=res", "trainer.max_steps=3"))
    before = (run_root / "res" / "metrics.csv").read_text()
    summary = _fit(_cfg(run_root, "run_id=res", "resume=auto", "trainer.max_steps=6"))
    after = (run_root / "res" / "metrics.csv").read_text()
    assert after.startswith(before) and len(after) > len(before)
    assert summary["global_step"] == 6 and sorted(p.name for p in run_root.iterdir()) == ["res"]
    steps = [r["step"] for r in RunRecord(run_root / "res").read_metrics() if r["name"] == "train/loss"]
    assert steps == [1, 2, 3, 4, 5, 6]
    status = json.loads((run_root / "res" / "status.json").read_text())
    assert len(status["attempts"]) == 2 and status["resumed_from"].endswith("last.ckpt")
    assert status["resume_changes"] == {"resume": ["never", "auto"], "trainer.max_steps": [3, 6]}


@pytest.mark.slow
def test_first_launch_with_resume_auto_trains_from_scratch(run_root):
    summary = _fit(_cfg(run_root, "run_id=fresh", "resume=auto", "trainer.max_steps=2"))
    assert summary["global_step"] == 2


@pytest.mark.slow
def test_existing_run_is_never_overwritten(run_root):
    _fit(_cfg(run_root, "run_id=keep", "trainer.max_steps=1"))
    with pytest.raises(ConfigError, match="resume=auto"):
        _fit(_cfg(run_root, "run_id=keep", "trainer.max_steps=1"))


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_immutable_change_on_resume_is_refused(run_root):
    _fit(_cfg(run_root, "run_id=imm", "trainer.max_steps=1"))
    before = {name: (run_root / "imm" / name).read_bytes() for name in ("config.yaml", "status.json")}
    with pytest.raises(ConfigError) as e:
        _fit(_cfg(run_root, "run_id=imm", "resume=auto", "seed=5"))
    assert "seed" in str(e.value)
    # a refused resume changes nothing in the run directory (issue 15 item 7): still `finished`, same config
    assert {name: (run_root / "imm" / name).read_bytes() for name in before} == before


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_a_run_stopped_by_bad_data_before_any_work_leaves_no_directory(run_root):
    """Issue 14 item 10: every failed command left a run directory behind; one stopped by a user error before it
    produced anything is removed, one that has produced something (or an existing run) is kept."""
    from qkvqa.errors import DataError

    class NoData(ToyDataModule):
        def setup(self, stage=None):
            raise DataError("data/x.csv: file not found")

    clear_run_env()
    with pytest.raises(DataError):
        fit(_cfg(run_root, "run_id=nodata", "trainer.max_steps=1"), ToyRegressor(), NoData())
    assert not (run_root / "nodata").exists()
    clear_run_env()
    fit(_cfg(run_root, "run_id=kept", "trainer.max_steps=1"), ToyRegressor(), ToyDataModule())
    clear_run_env()
    with pytest.raises(DataError):
        fit(_cfg(run_root, "run_id=kept", "resume=auto", "trainer.max_steps=2"), ToyRegressor(), NoData())
    assert json.loads((run_root / "kept" / "status.json").read_text())["state"] == "failed"


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_a_second_launch_into_a_run_directory_in_use_is_refused_naming_the_holder(run_root):
    """Issue 15 item 6: two resume=auto launches of one run_id both trained into one directory."""
    import os

    from qkvqa.run.lock import RunLock

    clear_run_env()
    fit(_cfg(run_root, "run_id=locked", "trainer.max_steps=1"), ToyRegressor(), ToyDataModule())
    held = RunLock.acquire(run_root / "locked")  # another job holds it
    try:
        clear_run_env()
        with pytest.raises(ConfigError, match=rf"locked is in use by PID {os.getpid()} on .*choose another run_id"):
            fit(_cfg(run_root, "run_id=locked", "resume=auto", "trainer.max_steps=2"), ToyRegressor(), ToyDataModule())
    finally:
        held.release()
    assert json.loads((run_root / "locked" / "status.json").read_text())["state"] == "finished"  # untouched
    clear_run_env()
    fit(_cfg(run_root, "run_id=locked", "resume=auto", "trainer.max_steps=2"), ToyRegressor(), ToyDataModule())


def test_failed_run_is_marked_failed(run_root):
    class Broken(ToyRegressor):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    clear_run_env()
    with pytest.raises(RuntimeError, match="boom"):
        fit(_cfg(run_root, "run_id=bad", "trainer.max_steps=1"), Broken(), ToyDataModule())
    status = json.loads((run_root / "bad" / "status.json").read_text())
    assert status["state"] == "failed" and "boom" in status["error"]


class _WorseningRegressor(ToyRegressor):
    """Logs a validation score that is best after the first epoch and worse after every later one."""

    def validation_step(self, batch, batch_idx):
        self.log("val/score", -float(self.current_epoch))


class _ValidatedToyData(ToyDataModule):
    def val_dataloader(self):
        return torch.utils.data.DataLoader(self.ds, batch_size=self.batch_size)


@pytest.mark.slow
def test_last_ckpt_stays_current_when_the_monitored_metric_stops_improving(run_root):
    clear_run_env()
    cfg = _cfg(
        run_root,
        "run_id=mon",
        "trainer.max_epochs=3",
        "~trainer.max_steps",
        "checkpoint.monitor=val/score",
        "checkpoint.mode=max",
    )
    summary = fit(cfg, _WorseningRegressor(total_steps=100), _ValidatedToyData(), batch_size=8)
    run_dir = run_root / "mon"
    assert summary["global_step"] == 24  # 3 epochs of 8 batches
    assert torch.load(run_dir / "last.ckpt", weights_only=True)["global_step"] == 24
    best = [p.name for p in run_dir.glob("epoch*.ckpt")]
    assert best == ["epoch000-step0000008.ckpt"] and summary["best_model_path"].endswith(best[0])


def test_a_metrics_row_torn_by_a_kill_is_ignored_when_read_and_cut_before_the_next_append(run_root):
    """Issue 15 item 7: a torn last row crashed `qkvqa compare` or became a bogus metric."""
    record = RunRecord(run_root / "torn")
    record.append_metrics({"train/loss": 0.5}, step=1)
    with open(record.metrics_path, "a", encoding="utf-8") as f:
        f.write("1796.1,2,train/lo")  # killed mid-write
    assert [(r["step"], r["value"]) for r in record.read_metrics()] == [(1, 0.5)]
    record.append_metrics({"train/loss": 0.25}, step=2)
    assert [(r["step"], r["value"]) for r in record.read_metrics()] == [(1, 0.5), (2, 0.25)]
