"""DataLoader workers beside a live process group: the fork hazard, and what the fork server costs.

Run: `.venv/bin/python bench/worker_start.py [--forks 2000] [--epochs 20]` (about 4 minutes on 2 cores).

1. **The race, unprovoked** (measured second). A native thread that keeps entering Python (each `pthread_create`d thread runs a ctypes
   callback: `PyGILState_Ensure` makes a thread state under CPython's thread-state lock, without the GIL, as a gloo
   thread does when it drops a tensor) while this process starts `--forks` children that exit at once: forked from
   this process (`os.fork`, what a DataLoader worker was), and from multiprocessing's fork server (what qkvqa's workers
   beside a live group are). A child not gone within 2 s is stuck (gdb shows `_PyThreadState_DeleteExcept`); it is
   killed and counted.
2. **The cost.** In a gloo group of one (measured first, so that its loaders start qkvqa's fork server), a DataLoader with 2 workers over a small dataset, `--epochs` passes, each
   starting its workers afresh (`persistent_workers=False`, as qkvqa's loaders): seconds per pass with fork and with
   the fork server (`samplers.worker_options`), side by side, and their ratio.

Writes bench/out/worker_start.{json,md}.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
_START = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
_CALLBACKS: list = []  # kept for the life of the process: a detached thread may still run one


def _exit_now() -> None:
    os._exit(0)


def hammer() -> threading.Event:
    """Start a thread that keeps creating native threads which enter Python once each; set the event to stop it."""
    libc = ctypes.CDLL(None)
    routine = _START(lambda arg: None)
    _CALLBACKS.append(routine)
    stop = threading.Event()

    def spawn() -> None:
        tid = ctypes.c_ulong()
        while not stop.is_set():
            if libc.pthread_create(ctypes.byref(tid), None, routine, None) == 0:
                libc.pthread_detach(tid)

    threading.Thread(target=spawn, daemon=True).start()
    return stop


def stuck_children(n: int, start: str) -> dict:
    """Start `n` children that exit at once, with the hammer running; count those not gone within 2 s."""
    context = multiprocessing.get_context("forkserver") if start == "forkserver" else None
    if context is not None:
        from multiprocessing import forkserver

        forkserver.ensure_running()
    stop = hammer()
    stuck, t0 = 0, time.perf_counter()
    try:
        for _ in range(n):
            if context is None:
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                process = None
            else:
                process = context.Process(target=_exit_now)
                process.start()
                pid = process.pid
            deadline = time.monotonic() + 2.0
            while True:
                if process is None:
                    gone = os.waitpid(pid, os.WNOHANG)[0] != 0
                else:
                    gone = process.exitcode is not None
                if gone:
                    break
                if time.monotonic() > deadline:
                    stuck += 1
                    os.kill(pid, signal.SIGKILL)
                    if process is None:
                        os.waitpid(pid, 0)
                    else:
                        process.join()
                    break
                time.sleep(0.0005)
    finally:
        stop.set()
    return {"start": start, "children": n, "stuck": stuck, "seconds": round(time.perf_counter() - t0, 1)}


class Items:
    """`n` small tensors (what a worker sends back is not what this measures)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):
        import torch

        return torch.full((16,), float(index))


def pass_seconds(epochs: int) -> dict:
    """Seconds per pass of a 2-worker DataLoader in a gloo group of one: fork and the fork server, interleaved."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from qkvqa.data_modules.samplers import worker_options

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            server = worker_options(2)  # the fork server, started here (its first start is timed apart)
            t0 = time.perf_counter()
            sum(1 for _ in DataLoader(Items(64), batch_size=8, **server))
            first = time.perf_counter() - t0
            loaders = {"fork": {**server, "multiprocessing_context": "fork"}, "forkserver": server}
            times: dict[str, list[float]] = {name: [] for name in loaders}
            for _ in range(epochs):
                for name, options in loaders.items():
                    t0 = time.perf_counter()
                    sum(1 for _ in DataLoader(Items(64), batch_size=8, **options))
                    times[name].append(time.perf_counter() - t0)
        finally:
            dist.destroy_process_group()
    median = {name: sorted(values)[len(values) // 2] for name, values in times.items()}
    return {
        "epochs": epochs,
        "first_pass_with_server_start_s": round(first, 3),
        "median_pass_s": {name: round(value, 4) for name, value in median.items()},
        "forkserver_over_fork": round(median["forkserver"] / median["fork"], 2),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--forks", type=int, default=2000, help="children per start method (default 2000)")
    parser.add_argument("--epochs", type=int, default=20, help="DataLoader passes per start method (default 20)")
    args = parser.parse_args(argv)
    # the cost first: its loaders start qkvqa's fork server (with its preload), which the race then uses too
    cost = pass_seconds(args.epochs)
    print(json.dumps(cost), flush=True)
    race = [stuck_children(args.forks, start) for start in ("fork", "forkserver")]
    for row in race:
        print(f"{row['start']}: {row['stuck']} of {row['children']} children stuck ({row['seconds']} s)", flush=True)
    OUT.mkdir(exist_ok=True)
    result = {"race": race, "cost": cost, "cpus": os.cpu_count()}
    (OUT / "worker_start.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# DataLoader workers beside a live process group",
        "",
        f"{os.cpu_count()} CPUs. `bench/worker_start.py` (its docstring says what each figure is).",
        "",
        "| start | children | stuck (after-fork deadlock) |",
        "|---|---|---|",
        *[f"| {row['start']} | {row['children']} | {row['stuck']} |" for row in race],
        "",
        f"A 2-worker pass of 8 batches, median of {cost['epochs']}: fork {cost['median_pass_s']['fork']} s, "
        f"fork server {cost['median_pass_s']['forkserver']} s ({cost['forkserver_over_fork']}x); the server's "
        f"first start and pass {cost['first_pass_with_server_start_s']} s.",
        "",
    ]
    (OUT / "worker_start.md").write_text("\n".join(lines))
    print(f"wrote {OUT / 'worker_start.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
