"""What a run prints into a file (a SLURM log): progress lines while it runs, no bars and none of Lightning's noise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.qff_study import mine_world

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
TRAIN_LINE = re.compile(
    r"qkvqa\.progress\] train: (\d+)/(\d+) steps \(\d+%\) \| [\d.,]+ steps/s \| epoch (\d+) \| "
    r"loss (\d+\.\d+) \| [\d.,]+ samples/s \| \d+:\d\d:\d\d elapsed \| (?:ETA (\d+:\d\d:\d\d)|done)"
)
# Each was printed by every run before: Lightning's model table and hints, FlagEmbedding's bars, Rich's bar
NOISE = (
    "litlogger",
    "srun",
    "module(s) in eval mode",
    "Checkpoint directory",
    "LeafSpec",
    "weights_only",
    "sync_dist",
    "pre tokenize",
    "Compute Scores",
    "┏",
    "━",
    "anonymous setting",
    "faster than using a method",
)


def file_env(**extra: str) -> dict:
    """The environment of a command whose output goes to a file: no QKVQA_PROGRESS (auto mode decides)."""
    env = {k: v for k, v in os.environ.items() if k != "QKVQA_PROGRESS"}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def test_training_into_a_file_prints_progress_lines_while_it_runs(world, tmp_path):
    overrides = mine_world(world, tmp_path)
    log_path = tmp_path / "slurm-1.out"
    cmd = [
        sys.executable,
        "-m",
        "qkvqa.cli",
        "train",
        "experiment=demo/qff_per_layer",
        "run_id=lines",
        *overrides,
        "trainer.max_steps=40",
        "trainer.limit_val_batches=0",
        "checkpoint.monitor=null",
        "logger.progress.every_s=1",
    ]
    with open(log_path, "w") as out:  # stdout and stderr into one file, as sbatch does
        proc = subprocess.Popen(cmd, cwd=REPO, env=file_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while not TRAIN_LINE.search(log_path.read_text()) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            running = proc.poll() is None  # a line came while training went on
            assert proc.wait(timeout=600) == 0, log_path.read_text()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log_path.read_text()
    assert running, text[-3000:]
    lines = [TRAIN_LINE.search(line) for line in text.splitlines()]
    found = [(int(m.group(1)), int(m.group(2)), m.group(5)) for m in lines if m]
    steps = [step for step, _, _ in found]
    # Lines come at most once a second: how many depends on the machine's speed (here 12 over 15 s), so at least
    # one while training and the last one.
    assert len(found) >= 2 and steps == sorted(set(steps)) and steps[-1] == 40, text[-3000:]
    assert all(total == 40 for _, total, _ in found) and found[-1][2] in (None, "0:00:00")  # `done` or ETA 0
    assert all(eta is not None for _, _, eta in found[:-1])
    assert "QFFTrainer: " in text and "model.base.vision_model (26 modules)" in text  # in place of the table
    assert [n for n in NOISE if n in text] == [], text[-3000:]


def test_evaluate_into_a_file_shows_prediction_lines_and_no_reranker_bars(eval_env, world, tmp_path):
    log_path = tmp_path / "evaluate.out"
    # two pairs per reranker batch: FlagReranker would draw its bars for every question
    cmd = [
        sys.executable,
        "-m",
        "qkvqa.cli",
        "evaluate",
        "experiment=world_eval",
        "run_id=eval-lines",
        "eval.judge=em_only",
        "cda.reranker_batch_size=2",
        "trainer.enable_progress_bar=true",
    ]
    with open(log_path, "w") as out:
        done = subprocess.run(
            cmd,
            cwd=REPO,
            env=file_env(QKVQA_EXPERIMENTS=str(eval_env["root"])),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
    text = log_path.read_text()
    assert done.returncode == 0, text[-3000:]
    predict = re.findall(r"predict: (\d+)/(\d+) batches .*? (\d+) questions, [\d.,]+ questions/s", text)
    n_test = len(world["questions"]["evqa/test.csv"])  # every row of the test CSV, 2_hop included
    assert predict and predict[-1][0] == predict[-1][1] and int(predict[-1][2]) == n_test, text[-3000:]
    assert [n for n in NOISE if n in text] == [], text[-3000:]
