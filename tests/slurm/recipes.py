"""The sbatch scripts of the README and docs/training.md, extracted and submitted as written (issue 37 item 6).

A script is the fenced block after a `<!-- slurm-test: NAME -->` line. Only the program (`python -m qkvqa.cli train
experiment=evqa_qff [preset=ddp]` -> the toy task through `toy.sh`), the node, task and GPU counts (the test cluster
is one node with 2 CPUs and 2 fake GPUs) and the accelerator are substituted; each substituted text must occur in the
script, so a changed recipe fails here instead of being submitted half-substituted. Paths (`--output`) and the
toy's environment go on sbatch's command line and in the submitting environment (`--export=ALL`, sbatch's default).

`toy.sh` runs the toy with `TOY_ATTEMPT_<n>_ENV` (space-separated `KEY=VALUE`) exported on top, n being the job's
`SLURM_RESTART_COUNT`: a fault, a slow data preparation or slow steps for one attempt of a requeued job only.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STEPS = 16  # 64 samples, batch 8 on 2 ranks: 4 steps an epoch
DOCS = {
    "training-sbatch": REPO / "docs" / "training.md",
    "readme-sbatch": REPO / "README.md",
    "evaluate-sbatch": REPO / "docs" / "training.md",
}
SCALE = {  # the recipes' counts -> the test node's (1 node, 2 tasks, 2 fake GPUs, CPU)
    "training-sbatch": [
        ("#SBATCH --nodes=2", "#SBATCH --nodes=1"),
        ("--ntasks-per-node=4", "--ntasks-per-node=2"),
        ("--gres=gpu:4", "--gres=gpu:2"),
        ("trainer.accelerator=gpu", "trainer.accelerator=cpu"),
        ("trainer.devices=4", "trainer.devices=2"),
        ("trainer.num_nodes=2", "trainer.num_nodes=1"),
    ],
    "readme-sbatch": [
        ("#SBATCH --nodes=2", "#SBATCH --nodes=1"),
        ("--ntasks-per-node=8", "--ntasks-per-node=2"),
        ("--gres=gpu:8", "--gres=gpu:2"),
        ("trainer.devices=8", "trainer.devices=2"),
        ("trainer.num_nodes=2", "trainer.num_nodes=1"),
    ],
    "evaluate-sbatch": [
        ("--ntasks-per-node=4", "--ntasks-per-node=2"),
        ("--gres=gpu:4", "--gres=gpu:2"),
        ("trainer.accelerator=gpu", "trainer.accelerator=cpu"),
    ],
}
PROGRAM = {
    "training-sbatch": "python -m qkvqa.cli train experiment=evqa_qff",
    "readme-sbatch": "python -m qkvqa.cli train experiment=evqa_qff preset=ddp",
    "evaluate-sbatch": "python -m qkvqa.cli evaluate experiment=eval/evqa_qwen",
}


def doc_script(name: str) -> str:
    """The fenced block after `<!-- slurm-test: NAME -->` in its document."""
    text = DOCS[name].read_text()
    m = re.search(rf"<!-- slurm-test: {re.escape(name)} -->\s*```(?:bash|sh)?\n(.*?)```", text, re.S)
    if m is None:
        raise AssertionError(f"{DOCS[name]}: no sbatch block marked `<!-- slurm-test: {name} -->`")
    return m.group(1)


def _replace(script: str, old: str, new: str, name: str) -> str:
    if old not in script:
        raise AssertionError(f"{DOCS[name]} ({name}): the recipe no longer has {old!r}; update tests/slurm/recipes.py")
    return script.replace(old, new)


def launcher(work: Path) -> Path:
    path = work / "toy.sh"
    if not path.exists():
        path.write_text(f"""#!/bin/bash
# what the recipes' program is replaced by: the toy task, with this attempt's TOY_ATTEMPT_<n>_ENV on top
v=TOY_ATTEMPT_${{SLURM_RESTART_COUNT:-0}}_ENV
[ -n "${{!v}}" ] && export ${{!v}}
exec {sys.executable} -m tests.helpers.toy "$@"
""")
        path.chmod(0o755)
    return path


def recipe(name: str, work: Path, wandb: bool = False, program: str | None = None) -> Path:
    """The recipe `name` with the toy as its program (or `program`, which replaces PROGRAM[name] as it is),
    written to `work`; the toy's runs go to `work/runs`."""
    script = doc_script(name)
    for old, new in SCALE[name]:
        script = _replace(script, old, new, name)
    if program is not None:
        path = work / f"{name}.sbatch"
        path.write_text(_replace(script, PROGRAM[name], program, name))
        return path
    extra = "trainer.accelerator=cpu trainer.strategy=ddp " if "preset=ddp" in PROGRAM[name] else ""
    script = _replace(
        script,
        PROGRAM[name],
        f"{launcher(work)} {extra}paths.checkpoints_root={work / 'runs'} "
        f"trainer.enable_progress_bar=false trainer.log_every_n_steps=1 "
        f"logger.wandb.enabled={str(wandb).lower()} trainer.deterministic=true "
        f"trainer.max_epochs=100 trainer.max_steps={STEPS}",
        name,
    )
    path = work / f"{name}.sbatch"
    path.write_text(script)
    return path


def submit(
    slurm, name: str, work: Path, *sbatch: str, wandb: bool = False, program: str | None = None, **env: str
) -> str:
    """Submit recipe `name` as the job user from the repository (the job's working directory); the job id.
    `sbatch`: options on sbatch's command line (they override the script's `#SBATCH` lines)."""
    import subprocess

    script = recipe(name, work, wandb=wandb, program=program)
    user_env = slurm.user_env(OMP_NUM_THREADS="1", WANDB_MODE="offline", **env)
    done = subprocess.run(
        slurm.as_user(["sbatch", "--parsable", f"--output={work}/%x-%j.out", *sbatch, str(script)]),
        env=user_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise RuntimeError(f"sbatch {script}: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def run_dir(work: Path, job: str) -> Path:
    return work / "runs" / f"evqa_qff-{job}-base"


def rows(seen: Path) -> int:
    return len(seen.read_text().splitlines()) if seen.exists() else 0


def max_step(seen: Path) -> int:
    return (
        max((json.loads(line)["step"] for line in seen.read_text().splitlines()), default=-1) if seen.exists() else -1
    )


def order(seen: Path) -> dict:
    """(rank, step) -> the sample ids that rank trained on at that step (the last time it did)."""
    out = {}
    for line in seen.read_text().splitlines():
        row = json.loads(line)
        out[(row["rank"], row["step"])] = row["ids"]
    return out


def told(slurm, work: Path, rdir: Path) -> str:
    """What a failed assertion shows: the run record, the tail of every job output, the daemons' logs."""
    parts = [
        f"--- {rdir / 'status.json'}\n"
        + ((rdir / "status.json").read_text() if (rdir / "status.json").exists() else "(none)")
    ]
    parts += [f"--- {out.name}\n" + out.read_text()[-6000:] for out in sorted(work.glob("*.out"))]
    return "\n".join(parts + [slurm.logs()])


def wait_state(rdir: Path, leave: str, timeout_s: float) -> str:
    """Wait until status.json's state is no longer `leave` (a missing record counts as `leave`)."""
    deadline = time.monotonic() + timeout_s
    state = leave
    while time.monotonic() < deadline:
        status = rdir / "status.json"
        try:
            state = json.loads(status.read_text()).get("state") if status.exists() else leave
        except ValueError:
            state = leave
        if state != leave:
            break
        time.sleep(0.2)
    return state


def wait_for(ready, timeout_s: float, poll_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(poll_s)
    return bool(ready())


def assert_resumed_like(reference: dict, ref_order: dict, rdir: Path, seen: Path, attempts: int) -> dict:
    """Finished after `attempts` attempts, one preemption mechanism, weights bitwise equal to the reference's, the
    same sample order on every rank at every step."""
    import torch

    status = json.loads((rdir / "status.json").read_text())
    assert status["state"] == "finished" and len(status["attempts"]) == attempts, status
    assert not list(rdir.glob("hpc_ckpt_*"))
    final = torch.load(rdir / "last.ckpt", weights_only=True)
    assert final["global_step"] == STEPS
    for key in reference["state_dict"]:
        assert torch.equal(final["state_dict"][key], reference["state_dict"][key]), key
    assert order(seen) == ref_order
    return status
