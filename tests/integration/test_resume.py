"""Resume that loses nothing: numeric equivalence, mid-epoch exactly-once, a signal before training (signals in
training: test_fault_resume.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qkvqa.config.load import compose
from qkvqa.run.record import RunRecord
from qkvqa.run.rundir import clear_run_env
from qkvqa.run.trainer import fit
from tests.helpers.toy import ToyDataModule, ToyRegressor

REPO = Path(__file__).resolve().parents[2]
BASE = [
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "logger.wandb.enabled=false",
    "trainer.max_epochs=100",
    "trainer.deterministic=true",
]


def _fit(run_root, module_kwargs=None, *overrides):
    clear_run_env()
    cfg = compose(None, [], [f"paths.checkpoints_root={run_root}", *BASE, *overrides])
    torch.manual_seed(cfg.seed)  # the same initial weights for every run of a test
    return fit(
        cfg, ToyRegressor(total_steps=40, **(module_kwargs or {})), ToyDataModule(n=60, batch_size=8), batch_size=8
    )


def _losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["value"] for r in RunRecord(run_dir).read_metrics() if r["name"] == "train/loss"}


@pytest.mark.slow
@pytest.mark.parametrize("stop_at", [5, 8])  # mid-epoch (8 batches/epoch) and exactly at an epoch end
def test_interrupted_and_resumed_run_equals_uninterrupted(run_root, stop_at):
    _fit(run_root, None, "run_id=A", "trainer.max_steps=14")
    _fit(run_root, None, "run_id=B", f"trainer.max_steps={stop_at}")
    summary = _fit(run_root, None, "run_id=B", "resume=auto", "trainer.max_steps=14")
    a = torch.load(run_root / "A" / "last.ckpt", weights_only=True)
    b = torch.load(run_root / "B" / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == summary["global_step"] == 14
    for key in a["state_dict"]:
        torch.testing.assert_close(b["state_dict"][key], a["state_dict"][key], rtol=0, atol=0)
    opt_a, opt_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    for pid in opt_a:
        for name in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt_b[pid][name], opt_a[pid][name], rtol=0, atol=0)
    assert a["lr_schedulers"][0]["last_epoch"] == b["lr_schedulers"][0]["last_epoch"] == 14
    assert a["lr_schedulers"][0]["_last_lr"] == b["lr_schedulers"][0]["_last_lr"]
    losses_a, losses_b = _losses(run_root / "A"), _losses(run_root / "B")
    assert sorted(losses_b) == list(range(1, 15))  # step N: the N-th optimizer step's loss
    assert [losses_b[s] for s in range(stop_at + 1, 15)] == [losses_a[s] for s in range(stop_at + 1, 15)]


@pytest.mark.slow
def test_mid_epoch_resume_sees_every_sample_exactly_once(run_root, tmp_path):
    seen = tmp_path / "seen.jsonl"
    with pytest.raises(RuntimeError, match="injected failure"):
        _fit(run_root, {"fail_at_step": 3, "seen_file": str(seen)}, "run_id=mid", "trainer.max_steps=8")
    assert json.loads((run_root / "mid" / "status.json").read_text())["state"] == "failed"
    first = [json.loads(line) for line in seen.read_text().splitlines()]
    _fit(run_root, {"seen_file": str(seen)}, "run_id=mid", "resume=auto", "trainer.max_steps=8")
    rows = [json.loads(line) for line in seen.read_text().splitlines()]
    restart = rows[len(first) :]
    ids = [i for row in rows for i in row["ids"]]
    assert len(first) == 3 and len(restart) == 5
    assert len(ids) == len(set(ids)) == 60  # failed + restart == one whole epoch, no repeats
    assert [r["step"] for r in rows] == list(range(8))


@pytest.mark.slow
def test_sigterm_during_data_preparation_marks_the_run_interrupted_and_exits_143(run_root, tmp_path):
    """Issue 15 item 7: a signal before training (data preparation) left status.json at `running`."""
    flag = tmp_path / "preparing"
    cmd = [
        sys.executable,
        "-m",
        "tests.helpers.toy",
        f"paths.checkpoints_root={run_root}",
        "run_id=prep",
        *BASE,
        "trainer.max_steps=3",
    ]
    env = {**__import__("os").environ, "TOY_SETUP_FLAG": str(flag), "TOY_SETUP_SLEEP": "60"}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not flag.exists():
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)  # at once, not after the 60 s of preparation
    assert proc.returncode == 143, out[-2000:]
    status = json.loads((run_root / "prep" / "status.json").read_text())
    assert status["state"] == "interrupted" and "SIGTERM" in status["error"], status
    assert not (run_root / "prep" / "last.ckpt").exists()


@pytest.mark.slow
def test_a_flipped_or_truncated_last_ckpt_is_refused_on_resume_naming_the_file(run_root):
    """Issue 14 item 6: a flipped last.ckpt resumed into a non-finite tensor and ended `finished`."""
    from qkvqa.errors import DataError
    from qkvqa.run.checkpoint_io import sidecar_of

    _fit(run_root, None, "run_id=flip", "trainer.max_steps=3")
    last = run_root / "flip" / "last.ckpt"
    assert sidecar_of(last).read_text().strip()  # written beside every checkpoint
    data = bytearray(last.read_bytes())
    data[len(data) // 2] ^= 0x20  # one bit, inside the tensors
    last.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"last\.ckpt: corrupt checkpoint \(sha256"):
        _fit(run_root, None, "run_id=flip", "resume=auto", "trainer.max_steps=6")
    sidecar_of(last).unlink()
    last.write_bytes(bytes(data[:1000]))  # truncated, and no sidecar to compare
    with pytest.raises(DataError, match=r"last\.ckpt: unreadable checkpoint"):
        _fit(run_root, None, "run_id=flip", "resume=auto", "trainer.max_steps=6")


@pytest.mark.slow
def test_a_run_directory_moved_after_a_validation_resumes_with_its_best_checkpoints(run_root, tmp_path):
    """Issue 44 class 3: Lightning reloads its top-k and best paths only when the saved dirpath is the current one, so
    a run moved (or copied) after a validation resumed with the best of its later validations only, its best path
    pointing at the old place. The paths are now kept relative to the run directory and rebased on resume."""
    import shutil

    monitored = ["checkpoint.monitor=val/loss", "checkpoint.mode=min", "checkpoint.save_top_k=3"]
    monitored += ["trainer.val_check_interval=3"]

    def fit_with_validation(root, *overrides):
        clear_run_env()
        cfg = compose(None, [], [f"paths.checkpoints_root={root}", *BASE, *monitored, *overrides])
        torch.manual_seed(cfg.seed)
        return fit(cfg, ToyRegressor(total_steps=40), ToyDataModule(n=64, val_n=16), batch_size=8)

    fit_with_validation(run_root, "run_id=ref", "trainer.max_steps=14")
    fit_with_validation(run_root, "run_id=moved", "trainer.max_steps=8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(str(run_root / "moved"), str(elsewhere / "moved"))
    summary = fit_with_validation(elsewhere, "run_id=moved", "resume=auto", "trainer.max_steps=14")

    def top_k(run_dir: Path) -> dict:
        state = torch.load(run_dir / "last.ckpt", weights_only=True)["callbacks"]
        (checkpoint,) = [v for k, v in state.items() if k.startswith("ModelCheckpoint")]
        return {Path(p).name: float(v) for p, v in checkpoint["best_k_models"].items()}

    reference = json.loads((run_root / "ref" / "summary.json").read_text())
    assert top_k(elsewhere / "moved") == top_k(run_root / "ref") and len(top_k(run_root / "ref")) == 3
    assert summary["best_model_score"] == pytest.approx(reference["best_model_score"], abs=0)
    assert Path(summary["best_model_path"]).parent == (elsewhere / "moved").resolve()
    assert Path(summary["best_model_path"]).name == Path(reference["best_model_path"]).name
    kept = sorted(p.name for p in (elsewhere / "moved").glob("epoch*.ckpt"))
    assert kept == sorted(top_k(run_root / "ref")), kept
