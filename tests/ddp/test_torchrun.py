"""torchrun with two "nodes" on localhost (gloo): one run directory without a run_id, and a crash of both workers
mid-run relaunched with resume=auto continues on both ranks exactly where the uninterrupted run went (issue 16)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.faults import signal_every_process_of

pytestmark = [pytest.mark.ddp, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
STEPS = 12  # 64 samples, batch 8 per rank on 2 ranks: 4 steps an epoch
BASE = [
    "trainer.accelerator=cpu",
    "trainer.devices=1",
    "trainer.num_nodes=2",
    "trainer.strategy=ddp",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=1",
    "logger.wandb.enabled=false",
    "trainer.deterministic=true",
    "trainer.max_epochs=100",
    f"trainer.max_steps={STEPS}",
    "checkpoint.every_n_train_steps=2",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    root: Path, seen: Path, *overrides: str, fault: str = "", out=subprocess.PIPE, **env_extra: str
) -> list[subprocess.Popen]:
    """Start the toy run with two torchrun agents (node ranks 0 and 1), each in its own session."""
    port = _free_port()
    env = {**os.environ, "TOY_SEEN_FILE": str(seen), "OMP_NUM_THREADS": "1", "QKVQA_TEST_FAULT": fault, **env_extra}
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={rank}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                "--max_restarts=0",
                "-m",
                "tests.helpers.toy",
                f"paths.checkpoints_root={root}",
                *BASE,
                *overrides,
            ],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]


def _torchrun(
    root: Path, seen: Path, *overrides: str, fault: str = "", **env: str
) -> list[subprocess.CompletedProcess]:
    """Launch the toy run with two torchrun agents (node ranks 0 and 1) and wait for both, bounded."""
    agents = _launch(root, seen, *overrides, fault=fault, **env)
    done = []
    try:
        for agent in agents:
            out, _ = agent.communicate(timeout=240)
            done.append(subprocess.CompletedProcess(agent.args, agent.returncode, out, ""))
    finally:
        for agent in agents:  # torchrun's workers run in the agent's session: end it by its id
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(timeout=30)
    return done


def _order(seen: Path) -> dict[tuple[int, int], list[int]]:
    order = {}
    for line in seen.read_text().splitlines():
        row = json.loads(line)
        order[(row["rank"], row["step"])] = row["ids"]  # a replayed step's last record wins
    return order


def test_torchrun_two_nodes_one_run_dir_and_a_crash_resumes_exactly_on_both_ranks(tmp_path):
    ref_root = tmp_path / "reference"
    agents = _torchrun(ref_root, tmp_path / "ref.jsonl")  # no run_id: the launcher's
    assert all(a.returncode == 0 for a in agents), agents[0].stdout[-3000:] + agents[1].stdout[-3000:]
    runs = list(ref_root.iterdir())
    assert len(runs) == 1, runs  # one directory for both ranks
    ref = torch.load(runs[0] / "last.ckpt", weights_only=True)
    assert ref["global_step"] == STEPS and ref["qkvqa"]["world_size"] == 2

    root, seen = tmp_path / "runs", tmp_path / "seen.jsonl"
    crashed = _torchrun(root, seen, "run_id=crash", fault="sigkill@train:7")  # both workers die at step 7
    assert all(a.returncode != 0 for a in crashed)
    saved = torch.load(root / "crash" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 6  # the last periodic save
    resumed = _torchrun(root, seen, "run_id=crash", "resume=auto")
    assert all(a.returncode == 0 for a in resumed), resumed[0].stdout[-3000:] + resumed[1].stdout[-3000:]
    final = torch.load(root / "crash" / "last.ckpt", weights_only=True)
    assert final["global_step"] == STEPS
    for key in ref["state_dict"]:
        assert torch.equal(final["state_dict"][key], ref["state_dict"][key]), key
    for pid, state in ref["optimizer_states"][0]["state"].items():
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(final["optimizer_states"][0]["state"][pid][name], state[name]), (pid, name)
    assert _order(seen) == _order(tmp_path / "ref.jsonl")  # both ranks, every step
    status = json.loads((root / "crash" / "status.json").read_text())
    assert status["state"] == "finished" and status["resumed_from"].endswith("last.ckpt")


def test_each_rank_resumes_with_its_own_random_generators(tmp_path):
    """Issue 37 item 2: every rank restored rank 0's generator states, so a rank whose dropout stream differs (here
    seeded per rank) did not continue where it stopped, and the resumed weights differed from the uninterrupted
    run's. Now each rank saves and restores its own (CPU here; CUDA: its own device's, tests/unit/test_rng_state.py)."""
    ref_root = tmp_path / "reference"
    agents = _torchrun(ref_root, tmp_path / "ref.jsonl", "run_id=ref", TOY_RANK_SEED="1")
    assert all(a.returncode == 0 for a in agents), agents[0].stdout[-3000:] + agents[1].stdout[-3000:]
    ref = torch.load(ref_root / "ref" / "last.ckpt", weights_only=True)
    per_rank = ref["qkvqa"]["rng_per_rank"]
    assert len(per_rank) == 2 and not torch.equal(per_rank[0]["torch"], per_rank[1]["torch"])  # two streams
    root = tmp_path / "runs"
    crashed = _torchrun(root, tmp_path / "seen.jsonl", "run_id=crash", fault="sigkill@train:7", TOY_RANK_SEED="1")
    assert all(a.returncode != 0 for a in crashed)
    assert torch.load(root / "crash" / "last.ckpt", weights_only=True)["global_step"] == 6
    resumed = _torchrun(root, tmp_path / "seen.jsonl", "run_id=crash", "resume=auto", TOY_RANK_SEED="1")
    assert all(a.returncode == 0 for a in resumed), resumed[0].stdout[-3000:] + resumed[1].stdout[-3000:]
    final = torch.load(root / "crash" / "last.ckpt", weights_only=True)
    for key in ref["state_dict"]:
        assert torch.equal(final["state_dict"][key], ref["state_dict"][key]), key
    for rank in (0, 1):
        assert torch.equal(final["qkvqa"]["rng_per_rank"][rank]["torch"], per_rank[rank]["torch"]), rank


def test_a_preempted_two_rank_run_with_wandb_on_stops_in_seconds_and_resumes(tmp_path):
    """Issue 16 item 2: SIGTERM to every process of the job (W&B's service too) once hung until SIGKILL: rank 0's
    next W&B call failed and the exception path waited in a barrier rank 1 never reached."""
    import time

    seen = tmp_path / "seen.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "tests.helpers.toy",
        f"paths.checkpoints_root={tmp_path / 'runs'}",
        "run_id=pre",
        "preset=ddp_cpu_sim",
        "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=1",
        "logger.wandb.enabled=true",
        "trainer.max_epochs=100",
        "trainer.max_steps=400",
    ]
    env = {
        **os.environ,
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "TOY_SEEN_FILE": str(seen),
        "TOY_STEP_SLEEP": "0.05",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        deadline = time.time() + 180
        while time.time() < deadline and (not seen.exists() or len(seen.read_text().splitlines()) < 10):
            time.sleep(0.2)
        import psutil

        names = [p.name() for p in psutil.Process(proc.pid).children(recursive=True)]
        assert any("wandb" in n for n in names), names  # the W&B service runs, and is hit
        assert signal_every_process_of(proc.pid, signal.SIGTERM) >= 3
        sent = time.time()
        out, _ = proc.communicate(timeout=90)
        stopped_in = time.time() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    assert proc.returncode == 143, out[-3000:]
    assert stopped_in < 60, stopped_in
    run_dir = tmp_path / "runs" / "pre"
    assert json.loads((run_dir / "status.json").read_text())["state"] == "interrupted", out[-3000:]
    step = torch.load(run_dir / "last.ckpt", weights_only=True)["global_step"]
    resumed = subprocess.run(
        cmd[:-1] + [f"trainer.max_steps={step + 2}", "resume=auto"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    final = torch.load(run_dir / "last.ckpt", weights_only=True)
    assert final["global_step"] == step + 2
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


def test_killed_torchrun_agents_take_their_workers_with_them_and_the_relaunch_resumes(tmp_path):
    """Issue 16 item 7: SIGKILL to the two agents alone once left both workers training in the agents' sessions.
    Now each worker gets SIGTERM when its agent dies (qkvqa.run.agent), saves after its batch and exits."""
    import time

    import psutil

    root, seen = tmp_path / "runs", tmp_path / "seen.jsonl"
    log = open(tmp_path / "agents.log", "w")  # a file, not a pipe: nobody reads once the agents die
    agents = _launch(root, seen, "run_id=orphan", out=log, TOY_STEP_SLEEP="0.3")
    try:
        deadline = time.time() + 180
        while time.time() < deadline and (not seen.exists() or len(seen.read_text().splitlines()) < 2 * 4):
            time.sleep(0.2)
        assert seen.exists() and len(seen.read_text().splitlines()) >= 8, (tmp_path / "agents.log").read_text()[-3000:]
        workers = [child for agent in agents for child in psutil.Process(agent.pid).children(recursive=True)]
        assert len(workers) >= 2
        for agent in agents:
            agent.kill()  # the agent process only, by its PID
            agent.wait(timeout=30)
        gone, alive = psutil.wait_procs(workers, timeout=90)
        assert not alive, f"workers still running after their agents died: {alive}"
    finally:
        log.close()
        for agent in agents:
            try:
                os.killpg(agent.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    run_dir = root / "orphan"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "interrupted", status
    step = torch.load(run_dir / "last.ckpt", weights_only=True)["global_step"]
    assert 4 <= step < STEPS
    resumed = _torchrun(root, seen, "run_id=orphan", "resume=auto", TOY_THREADS_AT_EXIT="1")
    assert all(a.returncode == 0 for a in resumed), resumed[0].stdout[-3000:] + resumed[1].stdout[-3000:]
    # A gloo worker thread alive at shutdown could abort its rank (SIGABRT) after a finished run; the other agent
    # then waited 300 s in torchrun's exit barrier: every rank closes its process group when fit ends.
    for agent in resumed:
        at_exit = [line for line in agent.stdout.splitlines() if line.startswith("toy: threads at exit:")]
        assert len(at_exit) == 1 and "gloo" not in at_exit[0], at_exit or agent.stdout[-3000:]
    assert torch.load(run_dir / "last.ckpt", weights_only=True)["global_step"] == STEPS
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished" and len(status["attempts"]) == 2
