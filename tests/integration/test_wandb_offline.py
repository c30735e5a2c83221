"""W&B in offline mode with the toy task: W&B id = run id and step across resumes, typed sweep values, run metadata."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from qkvqa.config.load import compose
from qkvqa.loggers.wandb import log_run_files
from qkvqa.run.record import RunRecord
from qkvqa.run.rundir import clear_run_env
from qkvqa.run.trainer import fit
from qkvqa.sweep.command import render_args
from tests.helpers.toy import ToyDataModule, ToyRegressor

BASE = [
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "trainer.max_epochs=5",
    "logger.wandb.enabled=true",
    "logger.wandb.mode=offline",
]
# One swept value of every kind, as a sweep file holds them.
SWEPT = {
    "qff.alpha": 0.3,
    "qff.lr": 1e-05,
    "cda.U": None,
    "cda.theta": 0.0,
    "trainer.deterministic": True,
    "seed": 3,
    "eval.judge": "em_only",
    "qff.betas": [0.9, 0.99],
}


@pytest.fixture
def wandb_offline(monkeypatch):
    """WANDB_MODE=offline (no network is ever contacted); the W&B run is finished afterwards."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield
    import wandb

    if wandb.run is not None:
        wandb.finish()
    clear_run_env()


def _fit(run_root, *overrides):
    clear_run_env()
    cfg = compose(None, [], [f"paths.checkpoints_root={run_root}", *BASE, *overrides])
    return fit(cfg, ToyRegressor(total_steps=100), ToyDataModule(), batch_size=8)


def wandb_records(path: Path):
    """The protobuf records of a `.wandb` transaction log (LevelDB-style log: 32 KiB blocks, 7-byte chunk headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data):  # a record still being written
            return
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST chunk: one record is complete
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def finished_records(offline_dir: Path, timeout_s: float = 60.0) -> list:
    """The records of an offline run once its `exit` record is on disk (wandb-core writes asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = list(wandb_records(next(offline_dir.glob("run-*.wandb"))))
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def logged_config(offline_dir: Path) -> dict:
    """The config the run logged to W&B, as W&B stores it (values decoded from JSON)."""
    config: dict = {}
    for record in finished_records(offline_dir):
        kind = record.WhichOneof("record_type")
        items = record.run.config.update if kind == "run" else record.config.update if kind == "config" else []
        for item in items:
            config[item.key] = json.loads(item.value_json)
    return config


def leet(offline_dir: Path, *flags: str) -> list[dict]:
    """An offline run as W&B's own reader prints it: `wandb leet inspect --json` (one JSON object per record, or
    the run's state with --summary)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", *flags, str(offline_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return (
        [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        if not flags
        else [json.loads(done.stdout)]
    )


def history(offline_dir: Path) -> list[dict]:
    """The history rows of an offline run (W&B's `_step` and the logged values), in logging order."""
    return [r["history"]["item"] for r in leet(offline_dir) if r.get("type") == "history"]


def _offline_dirs(run_dir: Path) -> list[Path]:
    """The offline run folders of a run dir, after the active W&B run has flushed them (wandb.finish)."""
    import wandb

    if wandb.run is not None:
        wandb.finish()
    return sorted((run_dir / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_offline_run_dirs_carry_the_run_id_across_resumes(run_root, wandb_offline):
    _fit(run_root, "run_id=wb", "trainer.max_steps=2")
    _fit(run_root, "run_id=wb", "resume=auto", "trainer.max_steps=4")
    dirs = _offline_dirs(run_root / "wb")
    # one per launch, same id; W&B appends "-1" to the folder of a launch that starts in the same second as the one
    # before (wandb_init.py, x_sync_dir_suffix), as the two quick runs here may
    assert len(dirs) == 2 and all(re.fullmatch(r"offline-run-\d{8}_\d{6}-wb(-\d+)?", d.name) for d in dirs), dirs
    for d in dirs:
        runs = [r.run for r in finished_records(d) if r.WhichOneof("record_type") == "run"]
        assert runs and all(r.run_id == "wb" for r in runs)
    assert sorted(p.name for p in run_root.iterdir()) == ["wb"]
    steps = [r["step"] for r in RunRecord(run_root / "wb").read_metrics() if r["name"] == "train/loss"]
    assert steps == [1, 2, 3, 4]  # the local record holds everything too
    # W&B's own step is the run's (optimizer steps done): the resumed segment continues at step 3 instead of restarting, so
    # `wandb sync` of both segments into run `wb` keeps both (wandb/wandb#5865)
    first, second = (history(d) for d in dirs)
    assert [r["_step"] for r in first if "train/loss" in r] == [1, 2]
    assert [r["_step"] for r in second if "train/loss" in r] == [3, 4]
    assert all(r["_step"] == r["trainer/global_step"] for r in first + second if "trainer/global_step" in r)


@pytest.mark.slow
def test_logged_config_holds_the_sweep_values_with_their_types(run_root, wandb_offline):
    _fit(run_root, "run_id=typed", "trainer.max_steps=1", *render_args(SWEPT)["args_no_hyphens"])
    logged = logged_config(_offline_dirs(run_root / "typed")[0])
    saved = OmegaConf.to_container(OmegaConf.load(run_root / "typed" / "config.yaml"))
    for key, value in SWEPT.items():
        for source in (logged, saved):
            node = source
            for part in key.split("."):
                node = node[part]
            assert node == value and type(node) is type(value), (key, node, value)


@pytest.mark.slow
def test_summary_and_report_are_saved_with_the_wandb_run(run_root, wandb_offline):
    _fit(run_root, "run_id=files", "trainer.max_steps=1")
    (run_root / "files" / "report.md").write_text("# report\n")
    assert log_run_files(run_root / "files") == ["summary.json", "report.md"]
    import wandb

    assert wandb.run.summary["global_step"] == 1
    files = _offline_dirs(run_root / "files")[0] / "files"
    assert (files / "report.md").read_text() == "# report\n"
    assert json.loads((files / "summary.json").read_text())["global_step"] == 1
    assert log_run_files(run_root / "files") == []  # no active run: nothing to do


@pytest.mark.slow
@pytest.mark.parametrize("leaked", [{"WANDB_RUN_ID": "stale"}, {"WANDB_SWEEP_ID": "oldsweep"}])
def test_manual_run_clears_leaked_wandb_ids(run_root, wandb_offline, monkeypatch, leaked):
    import os

    for key, value in leaked.items():
        monkeypatch.setenv(key, value)
    _fit(run_root, "run_id=manual", "trainer.max_steps=1")
    assert "WANDB_RUN_ID" not in os.environ and "WANDB_SWEEP_ID" not in os.environ
    assert [d.name.rsplit("-", 1)[-1] for d in _offline_dirs(run_root / "manual")] == ["manual"]


@pytest.mark.slow
def test_manual_resume_is_not_hijacked_by_a_leaked_sweep(run_root, wandb_offline, monkeypatch):
    monkeypatch.setenv("WANDB_RUN_ID", "stale")
    monkeypatch.setenv("WANDB_SWEEP_ID", "oldsweep")
    _fit(run_root, "run_id=manual", "trainer.max_steps=1")
    assert [d.name.rsplit("-", 1)[-1] for d in _offline_dirs(run_root / "manual")] == ["manual"]


@pytest.mark.slow
def test_the_wandb_run_carries_job_type_notes_tags_the_learning_rate_and_relative_paths(run_root, wandb_offline):
    _fit(
        run_root, "run_id=meta", "trainer.max_steps=2", "notes=why this run", "tags=[study]", "logger.wandb.tags=[toy]"
    )
    log_run_files(run_root / "meta")
    (state,) = leet(_offline_dirs(run_root / "meta")[0], "--summary")
    assert state["notes"] == "why this run" and state["tags"] == ["toy", "study"]
    runs = [r["run"] for r in leet(_offline_dirs(run_root / "meta")[0]) if r.get("type") == "run"]
    assert runs and runs[0]["job_type"] == "train"
    summary = state["summary"]
    assert summary["last_model_path"] == "last.ckpt"  # relative to the run directory
    assert json.loads((run_root / "meta" / "summary.json").read_text())["last_model_path"].startswith("/")
    assert "train/loss" in summary and any(k.startswith("lr-") or k.startswith("train/lr") for k in summary)


@pytest.mark.slow
def test_a_value_read_from_the_environment_never_reaches_the_run_records(run_root, wandb_offline, monkeypatch):
    """Issue 31 item 7: `${oc.env:...}` values (API keys) are used, but config.yaml, the checkpoints and the W&B
    config keep the interpolation's text."""
    secret = "sk-test-9f8e7d6c5b4a"
    monkeypatch.setenv("QKVQA_TEST_SECRET", secret)
    _fit(run_root, "run_id=secret", "trainer.max_steps=1", "logger.wandb.group=${oc.env:QKVQA_TEST_SECRET}")
    run_dir = run_root / "secret"
    logged = logged_config(_offline_dirs(run_dir)[0])
    assert logged["logger"]["wandb"]["group"] == "${oc.env:QKVQA_TEST_SECRET}"
    assert secret not in json.dumps(logged)
    assert "${oc.env:QKVQA_TEST_SECRET}" in (run_dir / "config.yaml").read_text()
    for path in run_dir.rglob("*"):  # W&B's run file (.wandb, uploaded by `wandb sync`) included (issue 44)
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    runs = [r.run for r in finished_records(_offline_dirs(run_dir)[0]) if r.WhichOneof("record_type") == "run"]
    assert runs and runs[0].run_group == "${oc.env:QKVQA_TEST_SECRET}"
