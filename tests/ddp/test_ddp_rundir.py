"""DDP on 2 CPU ranks (gloo), launched through a command line: exactly one run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.ddp
@pytest.mark.slow
def test_ddp_subprocess_makes_one_run_dir(run_root):
    cmd = [
        sys.executable,
        "-m",
        "tests.helpers.toy",
        f"paths.checkpoints_root={run_root}",
        "preset=ddp_cpu_sim",
        "trainer.max_steps=3",
        "trainer.max_epochs=5",
        "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=1",
        "logger.wandb.enabled=false",
        "qff.alpha=0.25",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = list(run_root.iterdir())
    assert len(runs) == 1, runs
    run_dir = runs[0]
    assert len(list(run_dir.glob("config.yaml"))) == 1
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and status["world_size"] == 2 and len(status["attempts"]) == 1
    ckpt = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert ckpt["qkvqa"]["world_size"] == 2 and ckpt["qkvqa"]["global_batch_size"] == 16
    assert ckpt["qkvqa"]["config"]["qff"]["alpha"] == 0.25 and ckpt["qkvqa"]["run_id"] == run_dir.name
