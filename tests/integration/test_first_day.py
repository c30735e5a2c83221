"""Issue 34, a researcher's first day: the mistakes that failed silently or lost work are caught or saved.

Real runs on the synthetic world and the toy task, real signals to real subprocesses: an evaluation of an untrained
QFF is refused, Ctrl-C keeps the work (training and evaluation), resume=auto on a finished run touches nothing, and a
resumed evaluation that only re-scores keeps its skipped-image record.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qkvqa.cli.main import main
from qkvqa.config.load import compose
from qkvqa.run.rundir import clear_run_env
from qkvqa.run.trainer import fit
from tests.helpers.toy import ToyDataModule, ToyRegressor

REPO = Path(__file__).resolve().parents[2]
TOY = [
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "logger.wandb.enabled=false",
    "trainer.max_epochs=100",
    "trainer.deterministic=true",
]


class Lines(logging.Handler):
    """Every qkvqa log line of a test, in order (qkvqa's logger writes to the stderr it first saw, not capsys's)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def log_lines():
    handler = Lines()
    logging.getLogger("qkvqa").addHandler(handler)
    yield handler.lines
    logging.getLogger("qkvqa").removeHandler(handler)


def _trained_qff(root: Path, run_id: str) -> Path:
    """A run directory that holds a trained QFF's file (what `trained_qff_dirs` looks for)."""
    from safetensors.torch import save_file

    qff = root / run_id / "qff"
    qff.mkdir(parents=True)
    save_file({"w": torch.zeros(2)}, str(qff / "model.safetensors"))
    return qff


# ---------------------------------------------------------------- an untrained QFF is refused
@pytest.mark.slow
def test_evaluating_the_qff_without_a_checkpoint_is_refused_naming_the_key_and_the_trained_runs(
    eval_env, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    runs = tmp_path / "runs"
    _trained_qff(runs, "20261203-qff-run")
    clear_run_env()
    capsys.readouterr()
    code = main(
        [
            "evaluate",
            "experiment=world_eval",
            "run_id=untrained",
            f"paths.checkpoints_root={runs}",
            "qff.allow_untrained=false",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "eval.filter=qff needs qff.checkpoint" in err[0] and "untrained" in err[0]
    assert f"qff.checkpoint={runs / '20261203-qff-run' / 'qff'}" in err[0] and "qff.allow_untrained=true" in err[0]
    assert not (runs / "untrained").exists()  # refused before the run started


# ---------------------------------------------------------------- Ctrl-C in training
def _toy(run_root: Path, run_id: str, seen: Path, *overrides: str, step_sleep: str = "0.5") -> subprocess.Popen:
    env = {
        **os.environ,
        "TOY_SEEN_FILE": str(seen),
        "TOY_STEP_SLEEP": step_sleep,
        "TOY_TOTAL_STEPS": "40",
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "tests.helpers.toy",
        f"paths.checkpoints_root={run_root}",
        f"run_id={run_id}",
        *TOY,
        *overrides,
    ]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for_steps(seen: Path, n: int, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if seen.exists() and len(seen.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"the toy run did not reach {n} steps: {proc.poll()}")


@pytest.mark.slow
def test_ctrl_c_in_training_saves_records_interrupted_exits_130_and_prints_the_resume_command(run_root, tmp_path):
    seen = tmp_path / "seen.jsonl"
    proc = _toy(run_root, "ctrlc", seen, "trainer.max_steps=12")
    _wait_for_steps(seen, 3, proc)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    status = json.loads((run_root / "ctrlc" / "status.json").read_text())
    assert status["state"] == "interrupted" and "SIGINT" in status["error"], status
    stopped = torch.load(run_root / "ctrlc" / "last.ckpt", weights_only=True)["global_step"]
    assert 3 <= stopped < 12
    assert "run_id=ctrlc resume=auto" in out and "Ctrl-C again" in out
    # the resume continues from the saved step: no step is trained twice, none is missing
    resumed = _toy(run_root, "ctrlc", seen, "trainer.max_steps=12", "resume=auto", step_sleep="0")
    out, _ = resumed.communicate(timeout=180)
    assert resumed.returncode == 0, out[-3000:]
    steps = [json.loads(line)["step"] for line in seen.read_text().splitlines()]
    assert steps[-(12 - stopped) :] == list(range(stopped, 12))
    assert json.loads((run_root / "ctrlc" / "status.json").read_text())["state"] == "finished"


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_without_the_save(run_root, tmp_path):
    seen = tmp_path / "seen.jsonl"
    proc = _toy(run_root, "twice", seen, "trainer.max_steps=12", step_sleep="4")
    _wait_for_steps(seen, 1, proc)
    time.sleep(0.5)  # inside the next (4 s) step
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-3000:]
    assert "saving" not in out.split("Ctrl-C again")[-1], out[-3000:]  # no save after the batch: stopped at once
    status = json.loads((run_root / "twice" / "status.json").read_text())
    assert status["state"] == "interrupted" and "SIGINT" in status["error"], status


# ---------------------------------------------------------------- resume=auto on a finished run
def _fit_toy(run_root: Path, *overrides: str) -> dict:
    clear_run_env()
    cfg = compose(None, [], [f"paths.checkpoints_root={run_root}", *TOY, *overrides])
    torch.manual_seed(cfg.seed)
    return fit(cfg, ToyRegressor(total_steps=40), ToyDataModule(n=32, batch_size=8), batch_size=8)


@pytest.mark.slow
def test_resume_auto_on_a_finished_run_says_so_and_touches_nothing(run_root, log_lines):
    first = _fit_toy(run_root, "run_id=done", "trainer.max_steps=4")
    run_dir = run_root / "done"
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in run_dir.iterdir() if p.is_file()}
    log_lines.clear()
    again = _fit_toy(run_root, "run_id=done", "trainer.max_steps=4", "resume=auto")
    after = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in run_dir.iterdir() if p.is_file()}
    assert after == before  # not a byte, not a timestamp
    assert again["global_step"] == first["global_step"] == 4
    assert any("run done is finished at step 4" in line and "nothing to resume" in line for line in log_lines), (
        log_lines
    )
    # a raised trainer.max_steps is not "finished": the run trains on
    more = _fit_toy(run_root, "run_id=done", "trainer.max_steps=6", "resume=auto")
    assert more["global_step"] == 6


# ---------------------------------------------------------------- a resumed evaluation that only re-scores
@pytest.mark.slow
def test_a_rescoring_resume_keeps_the_skipped_images_and_logs_no_training_resume(eval_env, monkeypatch, log_lines):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    argv = ["evaluate", "experiment=world_eval", "run_id=rescore", "eval.stop_after=filter"]
    clear_run_env()
    assert main(argv) == 0
    run_dir = eval_env["runs"] / "rescore"
    first = json.loads((run_dir / "skipped_images.json").read_text())
    scores = json.loads((run_dir / "scores.json").read_text())
    assert scores["n_skipped"] > 0  # the world's deliberately missing images
    assert sum(first["counts"].values()) == len(first["skipped"]) == scores["n_skipped"]
    assert "The QFF is untrained" in (run_dir / "report.md").read_text()  # qff.allow_untrained, said in the report
    log_lines.clear()
    clear_run_env()
    assert main([*argv, "resume=auto"]) == 0
    again = json.loads((run_dir / "skipped_images.json").read_text())
    assert again == first
    assert not any("last.ckpt" in line for line in log_lines), log_lines
    answered = [i for i, line in enumerate(log_lines) if "questions already answered" in line]
    assert answered and any("scoring only" in line for line in log_lines[answered[0] :])


# ---------------------------------------------------------------- Ctrl-C in evaluation
@pytest.mark.slow
def test_ctrl_c_in_evaluation_keeps_every_answered_question_and_exits_130(eval_env):
    cmd = [
        sys.executable,
        "-m",
        "qkvqa.cli",
        "evaluate",
        "experiment=world_eval",
        "eval.judge=em_only",
        "generation.batch_size=1",
        "data.batch_size=1",
        "run_id=ctrlc-eval",
    ]
    part = eval_env["runs"] / "ctrlc-eval" / "predictions.parts" / "rank0.jsonl"
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**eval_env["env"], "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 300
    while (
        time.time() < deadline and proc.poll() is None and (not part.exists() or len(part.read_text().splitlines()) < 3)
    ):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 130, err[-3000:]
    status = json.loads((eval_env["runs"] / "ctrlc-eval" / "status.json").read_text())
    assert status["state"] == "interrupted" and "SIGINT" in status["error"], status
    rows = [json.loads(line)["data_id"] for line in part.read_text().splitlines() if line.strip()]
    assert len(rows) >= 3 and len(rows) == len(set(rows))  # every answer before the stop is kept
    assert "run_id=ctrlc-eval resume=auto" in err


# ---------------------------------------------------------------- one step convention
@pytest.mark.slow
def test_metrics_checkpoint_names_and_summary_count_the_same_optimizer_steps(run_root):
    clear_run_env()
    cfg = compose(
        None,
        [],
        [
            f"paths.checkpoints_root={run_root}",
            *TOY,
            "run_id=steps",
            "trainer.max_steps=6",
            "trainer.val_check_interval=3",
            "checkpoint.monitor=val/loss",
            "checkpoint.mode=min",
            "checkpoint.save_top_k=2",
        ],
    )
    torch.manual_seed(cfg.seed)
    summary = fit(cfg, ToyRegressor(total_steps=40), ToyDataModule(n=64, batch_size=8, val_n=8), batch_size=8)
    from qkvqa.run.record import RunRecord

    rows = RunRecord(run_root / "steps").read_metrics()
    steps = lambda name: [r["step"] for r in rows if r["name"] == name]  # noqa: E731
    assert steps("train/loss") == [1, 2, 3, 4, 5, 6] == steps("lr-AdamW")  # step N: the N-th optimizer step
    assert steps("val/loss") == [3, 6]  # measured after 3 and 6 steps
    named = sorted(int(p.stem.split("step")[1]) for p in (run_root / "steps").glob("epoch*-step*.ckpt"))
    assert named == [3, 6] and summary["global_step"] == 6 and "step" not in summary


# ---------------------------------------------------------------- best and last weights, said plainly
@pytest.mark.slow
def test_qff_holds_the_last_weights_the_best_goes_beside_it_and_a_stopped_run_exports_none(world, tmp_path):
    from safetensors.torch import load_file

    from qkvqa.errors import RunInterrupted
    from qkvqa.run.record import RunRecord
    from tests.helpers.faults import FaultInjector
    from tests.helpers.qff_study import mine_world
    from tests.integration.test_fault_resume import _train_qff

    overrides = mine_world(world, tmp_path)
    summary = _train_qff(overrides, "bestlast")
    run_dir = tmp_path / "runs" / "bestlast"
    assert summary["qff/weights"] == "last" and summary["qff/step"] == summary["global_step"] == 18
    assert summary["qff/checkpoint"] == str(run_dir / "qff")
    vals = [(r["step"], r["value"]) for r in RunRecord(run_dir).read_metrics() if r["name"] == "val/article_r1"]
    assert [s for s, _ in vals] == [6, 12, 18]  # a validation each epoch, at the epoch's step
    best_value = max(v for _, v in vals)
    assert summary["qff/best_step"] == next(s for s, v in vals if v == best_value)
    assert summary["qff/best_score"] == pytest.approx(best_value) and summary["qff/best_monitor"] == "val/article_r1"
    if summary["qff/best_step"] == 18:
        assert summary["qff/best_checkpoint"] == str(run_dir / "qff") and not (run_dir / "qff_best").exists()
    else:
        assert summary["qff/best_checkpoint"] == str(run_dir / "qff_best")
        best = load_file(str(run_dir / "qff_best" / "model.safetensors"))
        last = load_file(str(run_dir / "qff" / "model.safetensors"))
        state = torch.load(summary["qff/best_model_path"], weights_only=True)["state_dict"]
        shared = [k for k in best if f"model.{k}" in state]
        assert shared and all(torch.equal(best[k], state[f"model.{k}"].to(best[k].dtype)) for k in shared)
        assert any(not torch.equal(best[k], last[k]) for k in shared)
    # stopped by SIGTERM before its last step: no qff/ that looks trained
    with pytest.raises(RunInterrupted):
        _train_qff(overrides, "stopped", callbacks=[FaultInjector("sigterm@train:4")])
    stopped = tmp_path / "runs" / "stopped"
    assert (stopped / "last.ckpt").is_file() and not (stopped / "qff").exists()
    assert json.loads((stopped / "summary.json").read_text())["qff/checkpoint"] is None


# ---------------------------------------------------------------- fixes that work when copied
@pytest.mark.slow
def test_the_missing_index_fix_carries_the_overrides_that_decide_where_the_index_is(
    eval_env, tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    cache = tmp_path / "elsewhere"  # no embeddings, no index here
    clear_run_env()
    capsys.readouterr()
    code = main(
        [
            "evaluate",
            "experiment=world_eval",
            "run_id=noindex",
            f"paths.cache_dir={cache}",
            "eval.filter=retrieval",
            "eval.judge=em_only",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2, err
    embed = f"qkvqa embed experiment=world_eval paths.cache_dir={cache}"
    assert embed in err and f"qkvqa index build experiment=world_eval paths.cache_dir={cache}" in err, err
    assert "run_id=noindex" not in err and "eval.filter" not in err
