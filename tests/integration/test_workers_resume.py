"""Issue 37 item 1: DataLoader workers (fork) under stop signals. SLURM and a terminal deliver SIGTERM / SIGUSR1 /
Ctrl-C to the whole process group, DataLoader workers included. Workers ignore them; the main process honours the
stop at the next batch boundary with the signal number kept, saves, and a resume equals the uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.faults import run_toy, signal_once_answered
from tests.integration.test_qff_train import mined, train  # noqa: F401  (the module fixture)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
STEPS = 12
BASE = [
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "logger.wandb.enabled=false",
    "trainer.deterministic=true",
    "trainer.max_epochs=100",
    f"trainer.max_steps={STEPS}",
    "checkpoint.every_n_train_steps=4",
]


def toy(root: Path, run_id: str, *overrides: str, fault: str = "", workers: int = 2) -> subprocess.CompletedProcess:
    """The toy run with `workers` DataLoader workers in its own session, bounded."""
    return run_toy(
        root,
        run_id,
        *BASE,
        *overrides,
        env={"OMP_NUM_THREADS": "1", "QKVQA_TEST_FAULT": fault, "TOY_WORKERS": str(workers), "TOY_STEP_SLEEP": "0.05"},
    )[0]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    done = toy(root, "ref")
    assert done.returncode == 0, done.stdout[-3000:]
    return torch.load(root / "ref" / "last.ckpt", weights_only=True)


@pytest.mark.parametrize(
    "fault, exit_code",
    [
        ("sigusr1-group@train:6", 143),
        ("sigterm-group@train:1", 143),
        # in the second epoch (8 steps an epoch): workers prefetch at once
        ("sigterm-group@train:10", 143),
    ],
)
def test_a_group_signal_with_two_workers_stops_at_a_batch_boundary_and_resumes_exactly(
    reference, tmp_path, fault, exit_code
):
    stopped = toy(tmp_path, "run", fault=fault)
    assert stopped.returncode == exit_code, stopped.stdout[-3000:]
    assert "DataLoader worker" not in stopped.stdout, stopped.stdout[-3000:]  # no worker died of the signal
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "interrupted", status
    saved = torch.load(tmp_path / "run" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == int(fault.rsplit(":", 1)[1]) + 1  # the step in flight, finished, then saved
    resumed = toy(tmp_path, "run", "resume=auto")
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    final = torch.load(tmp_path / "run" / "last.ckpt", weights_only=True)
    assert final["global_step"] == STEPS
    for key in reference["state_dict"]:
        assert torch.equal(final["state_dict"][key], reference["state_dict"][key]), key
    for pid, state in reference["optimizer_states"][0]["state"].items():
        assert torch.equal(final["optimizer_states"][0]["state"][pid]["exp_avg"], state["exp_avg"]), pid


def test_a_qff_mid_epoch_resume_with_two_workers_equals_the_uninterrupted_run(mined):  # noqa: F811
    common = [
        "trainer.limit_val_batches=0",
        "checkpoint.monitor=null",
        "trainer.deterministic=true",
        "qff.schedule_steps=6",
        "data.num_workers=2",
    ]
    straight = train(mined, "workers-a", "trainer.max_steps=6", *common)
    train(mined, "workers-b", "trainer.max_steps=3", *common)
    resumed = train(mined, "workers-b", "trainer.max_steps=6", *common, "resume=auto")
    a = torch.load(straight / "last.ckpt", weights_only=True)
    b = torch.load(resumed / "last.ckpt", weights_only=True)
    assert a["global_step"] == b["global_step"] == 6
    assert [key for key in a["state_dict"] if not torch.equal(a["state_dict"][key], b["state_dict"][key])] == []


def test_an_evaluation_with_two_workers_stopped_by_group_signals_keeps_every_answer(eval_env, world):
    """SIGUSR1 to the whole group (SLURM's way) ends 143, then Ctrl-C to the resumed run (a terminal's way) ends 130:
    each keeps every stored answer, no DataLoader worker dies of the signal, and the last resume answers the rest
    with none twice. One run for both signals: each extra evaluation start costs the suite seconds."""
    from tests.integration.test_evaluate import _expected_ids, _rows

    cmd = [
        sys.executable,
        "-m",
        "qkvqa.cli",
        "evaluate",
        "experiment=world_eval",
        "eval.judge=em_only",
        "generation.batch_size=1",
        "data.batch_size=1",
        "data.num_workers=2",
        "run_id=workers",
    ]
    runs, env = eval_env["runs"], eval_env["env"]
    part = runs / "workers" / "predictions.parts" / "rank0.jsonl"
    answered: list[str] = []
    for sig, code, extra in ((signal.SIGUSR1, 143, []), (signal.SIGINT, 130, ["resume=auto"])):
        stopped = signal_once_answered(cmd + extra, env, part, len(answered) + 3, sig, group=True)
        assert stopped.returncode == code, (signal.Signals(sig).name, stopped.stderr[-3000:])
        assert "DataLoader worker" not in stopped.stderr, stopped.stderr[-3000:]
        status = json.loads((runs / "workers" / "status.json").read_text())
        assert status["state"] == "interrupted", status
        now = [json.loads(line)["data_id"] for line in part.read_text().splitlines() if line.strip()]
        assert len(now) >= len(answered) + 3 and now[: len(answered)] == answered  # the answers kept
        answered = now
    resumed = subprocess.run(cmd + ["resume=auto"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["data_id"] for r in _rows(runs / "workers")] == _expected_ids(world)
    ids = [json.loads(line)["data_id"] for line in part.read_text().splitlines() if line.strip()]
    assert len(ids) == len(set(ids)) and ids[: len(answered)] == answered  # the answers kept, none twice
