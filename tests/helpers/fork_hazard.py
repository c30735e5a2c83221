"""The deadlock of a DataLoader worker forked beside gloo's threads, made certain instead of rare; and a rank killed
outright beside its fork-server workers (`rank_to_kill`).

In CPython 3.11 a forked child runs `PyOS_AfterFork_Child -> _PyEval_ReInitThreads -> _PyThreadState_DeleteExcept`,
which takes the interpreter's thread-state lock (`HEAD_LOCK`, `_PyRuntime.interpreters.mutex`) before it re-creates
that lock. A gloo thread that takes the GIL to drop a tensor creates a thread state, under that lock and without the
GIL; a fork at that instant leaves the child waiting for ever (seen in a 2-rank evaluation under srun; gdb showed
exactly this stack). `hold_thread_state_lock_at_fork` holds the lock across every fork of this process, as that thread
would have: the real lock, taken and released through CPython's own `PyThread_acquire_lock`/`PyThread_release_lock`.
A process forked by a fork server started before, or one exec'd, is untouched.
"""

from __future__ import annotations

import ctypes
import os
import sys

from torch.utils.data import Dataset

# struct _PyRuntimeState (CPython 3.11, Include/internal/pycore_runtime.h): five ints, `_finalizing` (a pointer-sized
# atomic), then `struct pyinterpreters { PyThread_type_lock mutex; ... }`: the mutex is the pointer at offset 32.
_INTERPRETERS_MUTEX_OFFSET = 32


def thread_state_lock() -> int:
    """The address of CPython 3.11's `_PyRuntime.interpreters.mutex` (HEAD_LOCK) in this process."""
    if sys.version_info[:2] != (3, 11):
        raise RuntimeError(f"the thread-state lock's offset is CPython 3.11's; this is {sys.version.split()[0]}")
    runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    return ctypes.c_void_p.from_address(runtime + _INTERPRETERS_MUTEX_OFFSET).value


def hold_thread_state_lock_at_fork() -> None:
    """From now on, every fork of this process happens while the thread-state lock is held."""
    lock = ctypes.c_void_p(thread_state_lock())
    acquire, release = ctypes.pythonapi.PyThread_acquire_lock, ctypes.pythonapi.PyThread_release_lock
    acquire.argtypes, acquire.restype = [ctypes.c_void_p, ctypes.c_int], ctypes.c_int
    release.argtypes, release.restype = [ctypes.c_void_p], None
    os.register_at_fork(before=lambda: acquire(lock, 1), after_in_parent=lambda: release(lock))


class ParentPids(Dataset):
    """Item i is (i, the pid of the process that started the worker which loads it)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> list[int]:
        return [index, os.getppid()]


def gloo_group_of_one(store: str) -> None:
    """A gloo process group of this process alone (its threads are what the hazard is about)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)


def server_pid() -> int:
    """The pid of this process's multiprocessing fork server."""
    import multiprocessing.forkserver

    return multiprocessing.forkserver._forkserver._forkserver_pid


def main(store: str, start: str, timeout_s: float) -> None:
    """In a gloo group of one, with the lock held at every fork: two passes of a DataLoader with 2 workers
    (`samplers.worker_options`) and one of a ResumableDataLoader; a SIGUSR1 to the whole process group after the first
    batch. Prints one JSON line: the rows of each pass, this pid, the fork server's pid before and after the signal."""
    import json
    import signal

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from qkvqa.data_modules.samplers import ResumableDataLoader, ResumableSampler, worker_options

    gloo_group_of_one(store)
    hold_thread_state_lock_at_fork()
    stops = []
    signal.signal(signal.SIGUSR1, lambda sig, frame: stops.append(sig))  # as qkvqa's handler: noted, honoured later
    options = worker_options(2)
    if start == "fork":  # the control: workers forked from this process, as before the fork server
        options["multiprocessing_context"] = "fork"
    dataset = ParentPids(6)
    loaders = [DataLoader(dataset, batch_size=2, timeout=timeout_s, **options)] * 2
    sampler = ResumableSampler(len(dataset), shuffle=False)
    loaders.append(ResumableDataLoader(dataset, sampler, lambda: 0, batch_size=2, num_workers=2, timeout=timeout_s))
    passes, servers = [], []
    for number, loader in enumerate(loaders):
        rows = []
        for batch in loader:
            rows += torch.stack(batch, 1).tolist()
            if number == 0 and len(rows) == 2:
                servers.append(server_pid())
                os.killpg(os.getpgrp(), signal.SIGUSR1)
        passes.append(rows)
    servers.append(server_pid())
    server_signals = signal_masks(servers[-1])
    dist.destroy_process_group()
    print(
        json.dumps(
            {"passes": passes, "pid": os.getpid(), "servers": servers, "stops": len(stops), "server": server_signals}
        )
    )


def signal_masks(pid: int) -> dict[str, list[str]]:
    """The signals process `pid` blocks and ignores (`/proc/PID/status`), by name."""
    import signal

    masks = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("SigBlk", "SigIgn"):  # bit n-1 is signal n; the standard signals are 1-31
                bits = int(value, 16)
                masks[key] = sorted(signal.Signals(n).name for n in range(1, 32) if bits >> (n - 1) & 1)
    return masks


def rank_to_kill(store: str) -> None:
    """A gloo rank of one iterating a DataLoader with 2 workers: prints its pid, the fork server's and the workers'
    after the first batch, then waits to be killed."""
    import json
    import time

    from torch.utils.data import DataLoader

    from qkvqa.data_modules.samplers import worker_options

    gloo_group_of_one(store)
    batches = iter(DataLoader(ParentPids(100_000), batch_size=2, **worker_options(2)))
    next(batches)
    pids = {"pid": os.getpid(), "server": server_pid(), "workers": [worker.pid for worker in batches._workers]}
    print(json.dumps(pids), flush=True)
    time.sleep(600)


if __name__ == "__main__":
    if sys.argv[2] == "killed":
        rank_to_kill(sys.argv[1])
    else:
        main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
