"""Samplers and a loader that shard across DDP ranks themselves and resume mid-epoch exactly."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
from functools import partial
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils.data import DataLoader, Sampler

from qkvqa.utils.stop_signals import STOP_SIGNALS


class ResumableSampler(Sampler[int]):
    """Indices of one rank for one epoch: seeded shuffle (or file order), strided sharding.

    The order depends only on (seed, epoch), so every rank agrees. Training pads the global
    order to a multiple of the world size (as DistributedSampler does); evaluation sets
    `pad=False`, so each index is visited exactly once over all ranks. After
    `resume_from(epoch, samples_done)` the next pass over `epoch` skips the samples this rank
    already consumed.
    """

    def __init__(
        self,
        num_samples: int,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        pad: bool = True,
    ):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.num_samples, self.seed, self.shuffle = num_samples, seed, shuffle
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.epoch = 0
        self._resume_epoch: Optional[int] = None
        self._resume_skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next pass yields (Lightning calls this every epoch)."""
        self.epoch = int(epoch)

    def resume_from(self, epoch: int, samples_done: int) -> None:
        """Skip the first `samples_done` indices of this rank the next time `epoch` is iterated, and make `epoch` the
        current one now: on a resume Lightning (2.6.6) creates the loader's iterator before it calls `set_epoch`, and
        DataLoader workers draw their first indices at once (a single process draws them later), so they took
        epoch 0's order, unskipped, in a resume of any later epoch."""
        self._resume_epoch, self._resume_skip = int(epoch), int(samples_done)
        self.epoch = int(epoch)

    def global_order(self) -> list[int]:
        """The order of all indices for the current epoch, before sharding."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            return torch.randperm(self.num_samples, generator=g).tolist()
        return list(range(self.num_samples))

    def rank_indices(self) -> list[int]:
        """This rank's indices for the current epoch."""
        order = self.global_order()
        if self.pad and self.world_size > 1 and order:
            total = math.ceil(len(order) / self.world_size) * self.world_size
            order = order + order[: total - len(order)]
        return order[self.rank :: self.world_size]

    def __len__(self) -> int:
        if self.pad:
            return math.ceil(self.num_samples / self.world_size)
        return len(range(self.rank, self.num_samples, self.world_size))

    def __iter__(self) -> Iterator[int]:
        indices = self.rank_indices()
        if self._resume_epoch == self.epoch:
            indices = indices[self._resume_skip :]
            self._resume_epoch, self._resume_skip = None, 0
        yield from indices


class ResumableDataLoader(DataLoader):
    """A DataLoader with Lightning's `state_dict`/`load_state_dict`, so a mid-epoch checkpoint resumes exactly.

    `batches_done` reports how many batches of the current epoch the training loop has finished
    (the DataModule wires it to the trainer's progress counter, which, unlike a count of fetched
    batches, is not fooled by prefetching).
    """

    def __init__(self, dataset: Any, sampler: ResumableSampler, batches_done: Callable[[], int], **kwargs: Any):
        # A private generator: creating an iterator must not draw from the global RNG, or a resumed
        # run's dropout/noise would shift by one draw against the uninterrupted run.
        kwargs.setdefault("generator", private_generator(sampler.seed + 10_007 * sampler.rank))
        kwargs.update(
            worker_options(
                kwargs.pop("num_workers", 0),
                kwargs.pop("worker_init_fn", None),
                kwargs.pop("multiprocessing_context", None),
            )
        )
        super().__init__(dataset, sampler=sampler, **kwargs)
        self.resumable_sampler = sampler
        self.batches_done = batches_done

    def state_dict(self) -> dict[str, int]:
        """Where this rank is: epoch, samples consumed, and the layout that makes the position valid."""
        return {
            "epoch": self.resumable_sampler.epoch,
            "samples_done": int(self.batches_done()) * int(self.batch_size),
            "world_size": self.resumable_sampler.world_size,
            "rank": self.resumable_sampler.rank,
            "seed": self.resumable_sampler.seed,
            "num_samples": self.resumable_sampler.num_samples,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a saved position; refuse one saved with another layout."""
        s = self.resumable_sampler
        saved = (state["world_size"], state["seed"], state["num_samples"])
        if saved != (s.world_size, s.seed, s.num_samples):
            raise RuntimeError(
                f"cannot resume mid-epoch: the checkpoint's loader had world_size/seed/num_samples {saved}, this run "
                f"has {(s.world_size, s.seed, s.num_samples)}. Resume with the same settings or from an end-of-epoch "
                "checkpoint."
            )
        s.resume_from(state["epoch"], state["samples_done"])


def batches_per_epoch(num_samples: int, batch_size: int, world_size: int = 1, pad: bool = True) -> int:
    """Batches one rank sees in an epoch of a ResumableSampler (padded to the world size) and drop_last=False."""
    per_rank = math.ceil(num_samples / world_size) if pad else num_samples // world_size
    return math.ceil(per_rank / batch_size)


# SLURM (preemption, `--signal`), schedulers and a terminal's Ctrl-C signal the whole process group, DataLoader workers
# included. A forked worker inherits the main process's handlers (qkvqa's, Lightning's), and a stop raised inside a
# worker reached the main process as a worker failure with the signal number lost (no requeue). Workers ignore the
# stop signals: the main process alone honours them, at the next batch boundary (callbacks.last_checkpoint).
# STOP_SIGNALS (qkvqa.utils.stop_signals): SIGTERM, SIGUSR1, SIGINT and SIGHUP; re-exported for worker_server.py.


def ignore_stop_signals(worker_id: int, then: Optional[Callable[[int], None]] = None) -> None:
    """A DataLoader `worker_init_fn`: ignore SIGTERM, SIGUSR1, SIGINT and SIGHUP in this worker, then run `then`. (A worker of
    the fork server inherits them blocked as well, `worker_start_context`: unblocked, as a forked worker has them.)
    It also lets the fork server go (`release_fork_server`)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    release_fork_server()
    if then is not None:
        then(worker_id)


def release_fork_server() -> None:
    """In a DataLoader worker: close its copy of the write end of the fork server's "alive" pipe. The server exits
    once every holder has closed that pipe, and each process it starts is handed a copy (multiprocessing's
    forkserver). So the workers kept the server alive, and the server kept the workers alive: their parent, it
    satisfies torch's worker watchdog. A rank killed outright (SIGKILL, the OOM killer) left both running for ever.
    Now its death ends the server, and then the workers."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        server._forkserver_alive_fd = None
        try:
            os.close(fd)
        except OSError:
            pass


def stop_signal_safe(worker_init_fn: Optional[Callable[[int], None]] = None) -> Callable[[int], None]:
    """`worker_init_fn` wrapped so that the worker first ignores the stop signals (`ignore_stop_signals`); picklable.

    Without one of its own, the worker runs the per-worker seeding that Lightning's `seed_everything(workers=True)`
    would have added (Lightning adds it only to a loader without a `worker_init_fn`), with this process's rank: both
    are read here, in the main process, because a worker started by the fork server sees the server's environment
    and module state, not this process's."""
    if worker_init_fn is None and os.environ.get("PL_SEED_WORKERS") == "1":
        from lightning.fabric.utilities.rank_zero import rank_zero_only
        from lightning.fabric.utilities.seed import pl_worker_init_function

        worker_init_fn = partial(pl_worker_init_function, rank=int(getattr(rank_zero_only, "rank", 0) or 0))
    return partial(ignore_stop_signals, then=worker_init_fn)


# A DataLoader forks its workers from the process that iterates it. In a DDP rank that process runs gloo's (or NCCL's)
# threads, and CPython 3.11 runs code in a forked child (PyOS_AfterFork_Child -> _PyThreadState_DeleteExcept) that
# takes the interpreter's thread-state lock: a worker forked while a gloo thread held that lock, as it took the GIL to
# drop a tensor, waited for it for ever, and its rank with it (a 2-rank evaluation under srun hung so, once in three).
# While a process group is live, the workers are started by a fork server instead: a fresh interpreter started by
# fork+exec (no Python runs in between), single-threaded, whose forked children inherit no held lock. The server starts
# with the stop signals blocked, and first imports WORKER_SERVER_MODULE, which ignores them too: a group SIGUSR1 or
# SIGTERM would otherwise kill it, and its workers, whose parent it is, then exit (torch's worker watchdog). That module
# also preloads what the workers import; should its import fail (the server says nothing), the blocked signals still
# hold. (CPython 3.11's server preloads no '__main__': each worker imports it.)
WORKER_SERVER_MODULE = "qkvqa.data_modules.worker_server"


def worker_start_context() -> Optional[multiprocessing.context.BaseContext]:
    """How DataLoader workers start: the fork server while a torch.distributed process group is live (see above),
    else None (the platform's default: fork)."""
    from multiprocessing import forkserver, resource_tracker

    from qkvqa.run.trainer import process_group_initialized

    if not process_group_initialized():
        return None

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([WORKER_SERVER_MODULE])  # read when the server starts
    # Start the resource tracker (the queues' named semaphores) and the server with the stop signals blocked: a process
    # inherits the blocked set through fork+exec, so a group SIGUSR1 neither kills the tracker (which ignores SIGINT and
    # SIGTERM only: "resource_tracker: process died unexpectedly, relaunching") nor the server, before or after its
    # preload. Here they stay pending (or another thread takes them), and are delivered when the mask is restored.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        resource_tracker.ensure_running()
        # the tracker's start unblocks SIGINT and SIGTERM in this thread as it ends: block them again for the server's
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    return context


def worker_options(
    num_workers: int,
    worker_init_fn: Optional[Callable[[int], None]] = None,
    multiprocessing_context: Any = None,
) -> dict:
    """DataLoader keyword arguments for `num_workers` workers that leave stop signals to the main process (around
    `worker_init_fn`: `stop_signal_safe`) and, unless `multiprocessing_context` is given, beside a live process group
    start from the fork server (`worker_start_context`)."""
    if not num_workers:
        return {"num_workers": 0}
    return {
        "num_workers": int(num_workers),
        "worker_init_fn": stop_signal_safe(worker_init_fn),
        "multiprocessing_context": multiprocessing_context or worker_start_context(),
    }


def private_generator(seed: int = 0) -> torch.Generator:
    """A DataLoader's own generator: creating its iterator then draws nothing from the global RNG, so a validation
    that a resumed run skips or replays (Lightning fast-forwards one) leaves training's dropout draws unchanged."""
    return torch.Generator().manual_seed(seed)


def trainer_batches_done(trainer: Any) -> Callable[[], int]:
    """A callable giving the batches the trainer has processed in the current training epoch."""
    return lambda: trainer.fit_loop.epoch_loop.batch_progress.current.processed


def rank_and_world(trainer: Any) -> tuple[int, int]:
    """(global rank, world size) of the attached trainer, (0, 1) without one."""
    if trainer is None:
        return 0, 1
    return int(trainer.global_rank), int(trainer.world_size)
