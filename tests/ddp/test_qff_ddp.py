"""`qkvqa train` under DDP on 2 CPU ranks (gloo), launched as a subprocess: one run, the trained QFF, world size 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.qff_study import mine_world

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.ddp
@pytest.mark.slow
def test_qff_training_runs_on_two_cpu_ranks_as_one_run(world, tmp_path):
    overrides = mine_world(world, tmp_path)
    cmd = [
        sys.executable,
        "-m",
        "qkvqa.cli",
        "train",
        "experiment=demo/qff_per_layer",
        *overrides,
        "trainer.devices=2",
        "trainer.accelerator=cpu",
        "trainer.strategy=ddp",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "qff.max_val_samples=7",
        "trainer.num_sanity_val_steps=0",
        # as the gpu and ddp presets: DataLoader workers, which beside gloo's threads start from the fork server
        # (data_modules.samplers.worker_start_context), so the datasets and collator travel pickled
        "data.num_workers=2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "QKVQA_PROGRESS": "lines"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # progress lines come from rank 0 alone, and Lightning has nothing to say about sync_dist
    assert proc.stderr.count("qkvqa.progress] train: 3/3 steps (100%)") == 1, proc.stderr[-3000:]
    assert proc.stderr.count("qkvqa.progress] validate at step 3: ") == 1 and "sync_dist" not in proc.stderr
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, runs
    run_dir = runs[0]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == 2 and len(status["attempts"]) == 1
    ckpt = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 3 and ckpt["qkvqa"]["world_size"] == 2 and ckpt["qkvqa"]["global_batch_size"] == 8
    assert (run_dir / "qff" / "model.safetensors").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"val/article_r1", "val/section_r1"} <= set(summary)
    # 7 validation questions over 2 ranks, each counted once: every per-question rate is a multiple of 1/7
    names = ("val/section_r1", "val/article_r1", "val/stage1_article_r1")
    assert any(0 < summary[name] < 100 for name in names)
    for name in names:
        assert round(summary[name] * 7 / 100, 4) == round(summary[name] * 7 / 100)
