"""Issue 37 item 5: a rank signalled while it waits in the barrier after predict stops at once (a blocking barrier
waited in C++, where no Python signal handler runs, until every other rank had finished its answers)."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ddp


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, out: str, blocking: bool) -> None:
    import torch.distributed as dist

    from qkvqa.errors import RunInterrupted
    from qkvqa.utils.stop_signals import interruptible_barrier

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    if rank == 1:
        time.sleep(15)  # still answering its questions
        dist.barrier()
        return

    def stop(signum, frame):
        raise RunInterrupted("stopped", signum=signum)

    signal.signal(signal.SIGTERM, stop)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    signal.signal(signal.SIGALRM, lambda *_: os.kill(os.getpid(), signal.SIGTERM))  # SLURM's SIGTERM, 1 s in
    start = time.time()
    try:
        dist.barrier() if blocking else interruptible_barrier()
        result = {"stopped": False}
    except RunInterrupted as e:
        result = {"stopped": True, "signum": e.signum}
    result["seconds"] = time.time() - start
    Path(out).write_text(json.dumps(result))
    os._exit(0)  # the other rank is still at work: leave without teardown


def _run(tmp_path: Path, blocking: bool) -> dict:
    import torch.multiprocessing as mp

    out = tmp_path / f"rank0-{blocking}.json"
    port = _port()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, port, str(out), blocking)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
            p.join(10)
    return json.loads(out.read_text())


def test_the_barrier_after_predict_gives_way_to_a_stop_signal(tmp_path):
    result = _run(tmp_path, blocking=False)
    assert result["stopped"] and result["signum"] == signal.SIGTERM
    assert result["seconds"] < 5, result  # the other rank would have come after 15 s
