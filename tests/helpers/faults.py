"""Faults injected into a training process at an exact point: a signal after a step, during validation, mid-save.

`QKVQA_TEST_FAULT=KIND@WHERE:N`, KIND one of sigkill | sigterm | sigusr1 | sighup, or `-group` after it (sigterm-group: the
signal goes to the whole process group, DataLoader workers included, as SLURM and a terminal's Ctrl-C deliver it):
- `train:N`  the signal arrives as training step N+1 begins (N optimizer steps done);
- `val:N`    during the first validation batch once N steps are done;
- `save:N`   during the N-th checkpoint write (1-based): half the bytes written, then the signal.
The signal is the real one, sent to this process by the kernel (os.kill); nothing is simulated.
"""

from __future__ import annotations

import io
import os
import signal

import lightning.pytorch as pl
import torch

SIGNALS = {
    "sigkill": signal.SIGKILL,
    "sigterm": signal.SIGTERM,
    "sigusr1": signal.SIGUSR1,
    "sighup": signal.SIGHUP,
}


def parse(spec: str) -> tuple[int, str, int, bool]:
    kind, rest = spec.split("@")
    where, n = rest.split(":")
    group = kind.endswith("-group")
    kind = kind[: -len("-group")] if group else kind
    if kind not in SIGNALS or where not in ("train", "val", "save"):
        raise ValueError(f"bad fault spec {spec!r}")
    return SIGNALS[kind], where, int(n), group


class FaultInjector(pl.Callback):
    """Sends the signal of its spec at the spec's point, once."""

    def __init__(self, spec: str):
        self.sig, self.where, self.n, self.group = parse(spec)
        self.fired = False
        if self.where == "save":
            self._arm_save()

    def _fire(self) -> None:
        if not self.fired:
            self.fired = True
            if os.environ.get("QKVQA_TEST_FAULT_STAMP"):  # when it fired, for tests of how soon the stop follows
                import time

                with open(os.environ["QKVQA_TEST_FAULT_STAMP"], "w") as f:
                    f.write(repr(time.time()))
            if self.group:
                os.killpg(os.getpgid(0), self.sig)
            else:
                os.kill(os.getpid(), self.sig)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.where == "train" and trainer.global_step == self.n:
            self._fire()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.where == "val" and not trainer.sanity_checking and trainer.global_step >= self.n:
            self._fire()

    def _arm_save(self) -> None:
        real_save = torch.save
        count = {"saves": 0}
        injector = self

        def save(obj, f, *args, **kwargs):
            count["saves"] += 1
            if count["saves"] != injector.n or not hasattr(f, "write"):
                return real_save(obj, f, *args, **kwargs)
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            f.write(data[: len(data) // 2])
            f.flush()
            injector._fire()
            if injector.sig != signal.SIGKILL:  # a handled signal: the write completes
                f.write(data[len(data) // 2 :])

        torch.save = save


def signal_every_process_of(pid: int, sig: int) -> int:
    """What SLURM's linuxproc tracking does on preemption: the signal goes to the process and all its descendants
    (the DDP child and W&B's service, whatever their session). Returns how many got it."""
    import psutil

    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    return len(procs)


def run_toy(root, run_id: str, *overrides: str, env: dict, timeout_s: float = 300):
    """`python -m tests.helpers.toy` as a run `run_id` under `root`, in its own session (a group signal reaches it and
    its workers only), bounded; returns (CompletedProcess with stdout and stderr together, the time it ended)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.toy", f"paths.checkpoints_root={root}", f"run_id={run_id}", *overrides],
        cwd=repo,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, ""), time.time()


def signal_once_answered(
    cmd: list, env: dict, part, rows: int, sig: int, *, group: bool = False, wait_s: float = 240, cwd=None
):
    """Start `cmd` (an evaluation); once its rank-0 part file `part` holds `rows` answers (or it ended), send `sig` to
    it, or with `group` to its whole session (its DataLoader workers too, as SLURM and a terminal do); bounded.
    Returns a CompletedProcess (stderr captured) with `seconds_to_stop`, from the signal to the end."""
    import subprocess
    import time
    from pathlib import Path

    cwd = cwd or Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + wait_s
        while (
            time.monotonic() < deadline
            and proc.poll() is None
            and (not Path(part).exists() or len(Path(part).read_text().splitlines()) < rows)
        ):
            time.sleep(0.1)
        sent = time.monotonic()
        os.killpg(proc.pid, sig) if group else proc.send_signal(sig)
        err = proc.communicate(timeout=60)[1]
        seconds = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    done = subprocess.CompletedProcess(cmd, proc.returncode, "", err)
    done.seconds_to_stop = seconds
    return done
