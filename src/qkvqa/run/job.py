"""Run a job inside its run record: status, config and summary on disk, W&B and Lightning wired in."""

from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional

from omegaconf import DictConfig

from qkvqa.config.load import to_plain
from qkvqa.errors import RunInterrupted
from qkvqa.loggers.wandb import job_run
from qkvqa.run.agent import stop_with_the_agent
from qkvqa.run.lock import RunLock
from qkvqa.run.record import RunRecord
from qkvqa.run.resume import prepare_resume
from qkvqa.run.rundir import RunContext, resolve_run
from qkvqa.run.slurm import requeue
from qkvqa.utils.command_line import resume_command
from qkvqa.utils.logging import get_logger
from qkvqa.utils.own_files import check_own_dir
from qkvqa.utils.progress import progress_settings
from qkvqa.utils.stop_signals import STOP_SIGNALS, forget_stop_signals, note_stop_signal, stop_signal_received

log = get_logger(__name__)


@dataclass
class Job:
    """A running job: its config, identity, record and the checkpoint it resumes from."""

    cfg: DictConfig
    run: RunContext
    record: RunRecord
    ckpt_path: Optional[str] = None
    resume_changes: dict = field(default_factory=dict)
    final_state: str = "finished"  # set to "interrupted" by a job that stopped on a signal
    received_signal: Optional[int] = None  # that signal (SIGUSR1 inside a SLURM job: the job is requeued at the end)
    command: str = ""  # the qkvqa command running it (train, evaluate, embed, ...): the W&B job_type

    @property
    def plain_config(self) -> dict:
        """The resolved config as plain containers (for checkpoints and W&B)."""
        return to_plain(self.cfg)


def _clear_stale_wandb_env(run: RunContext) -> None:
    """A leftover WANDB_RUN_ID/WANDB_SWEEP_ID must not hijack a run a sweep did not launch, and no run talks to a W&B
    service it did not start: WANDB_SERVICE, inherited from whatever process used W&B before submitting the job (a
    notebook, a test, a runner), points at that process's service, which may be on another host or gone, and which
    still holds the stream of a previous attempt of this run after a requeue ("run ID ... is in use"). The service
    this process started itself (W&B's token `<version>-<starting pid>-...` names our pid) is kept."""
    token = os.environ.get("WANDB_SERVICE", "")
    parts = token.split("-")
    if token and not (len(parts) > 2 and parts[1] == str(os.getpid())):
        os.environ.pop("WANDB_SERVICE", None)
    if not run.launched_by_sweep:
        for key in ("WANDB_RUN_ID", "WANDB_SWEEP_ID", "WANDB_RESUME"):
            os.environ.pop(key, None)


@contextmanager
def run_job(
    cfg: DictConfig, command: str, world_size: int = 1, defer_stop: bool = False, trains: bool = False
) -> Iterator[Job]:
    """Open the run record (rank zero writes it), yield the job, then mark it finished or failed; with `defer_stop`
    a stop signal before training only is noted, and every rank stops together after the first batch. `trains`:
    the job fits a model (it resumes from last.ckpt)."""
    stop_with_the_agent()  # a torchrun worker whose agent dies saves and stops (qkvqa.run.agent)
    run = resolve_run(cfg)
    _clear_stale_wandb_env(run)
    record = RunRecord(run.run_dir)
    fresh = not run.run_dir.exists()
    lock = None
    if run.is_rank_zero:  # one job per run directory (qkvqa.run.lock)
        run.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            check_own_dir(  # another user's folder in a shared (1777) root, pre-created with links in it
                run.run_dir,
                "run directory",
                "choose another run_id, or paths.checkpoints_root a folder of your own (docs/security.md)",
            )
            lock = RunLock.acquire(run.run_dir)
            ckpt, changes = prepare_resume(cfg, run, trains)
        except BaseException:
            if lock is not None:
                lock.release()
            if fresh:
                _remove_if_empty(run.run_dir)
            raise
    else:
        ckpt, changes = _child_ckpt(run), {}
    job = Job(cfg=cfg, run=run, record=record, ckpt_path=ckpt, resume_changes=changes, command=command)
    if run.is_rank_zero:
        record.write_config(cfg)
        record.start(
            run.run_id,
            world_size,
            command,
            {"resumed_from": ckpt, "resume_changes": {k: list(v) for k, v in changes.items()}} if run.resumed else None,
        )
        log.info("run %s -> %s", run.run_id, run.run_dir)
    received = None
    again = resume_command(command, run.run_id, cfg.experiment)
    try:
        with (
            interrupt_on_signals(run.run_id, defer_stop, again, stop_within_s(cfg)),
            progress_settings(**cfg.logger.progress),
            job_run(cfg, run, command),
        ):  # the W&B run of a job without a Trainer (embed, index, mine, ...)
            yield job
    except (KeyboardInterrupt, RunInterrupted) as e:
        received = getattr(e, "signum", None)
        if run.is_rank_zero:
            record.finish("interrupted", f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)
        if isinstance(e, KeyboardInterrupt):  # Ctrl-C outside the loops that stop cleanly: the same record and exit
            received = signal.SIGINT
            raise RunInterrupted(
                f"run {run.run_id} stopped on Ctrl-C (SIGINT); continue it with: {again}", signum=signal.SIGINT
            ) from e
        raise
    except BaseException as e:
        received = stop_signal_received()
        if received is not None:  # the stop made something fail on its way out (qkvqa.utils.stop_signals)
            name = signal.Signals(received).name
            if run.is_rank_zero:
                record.finish("interrupted", f"stopped on {name}, then {type(e).__name__}: {e}")
            then = "" if isinstance(e, SystemExit) else f" (then {type(e).__name__}: {e})"  # Lightning's Ctrl-C exit
            raise RunInterrupted(
                f"run {run.run_id} stopped on {name}{then}; continue it with: {again}", signum=received
            ) from e
        if run.is_rank_zero:
            record.finish("failed", f"{type(e).__name__}: {e}")
            if fresh and _is_user_error(e):
                _remove_if_empty(run.run_dir)
        raise
    else:
        received = job.received_signal if job.final_state == "interrupted" else None
        late = stop_signal_received()
        if received is None and late is not None:  # noted too late to stop anything: said, not dropped in silence
            log.warning(
                "received %s after the work it could stop (training on every rank, the last batch): the run "
                "finished as it would have",
                signal.Signals(late).name,
            )
        if run.is_rank_zero:  # an interrupted run's record names the signal that stopped it
            record.finish(
                job.final_state,
                f"stopped on {signal.Signals(received).name} after saving"
                if job.final_state == "interrupted" and received
                else None,
            )
    finally:
        forget_stop_signals()
        if lock is not None:
            lock.release()
        if received is not None and run.is_rank_zero:
            requeue(received)  # SIGUSR1 before a SLURM time limit: the job comes back (state recorded)


def stop_within_s(cfg: DictConfig) -> Optional[float]:
    """checkpoint.stop_within_s of a config that has it (None: a stop may wait for the first batch)."""
    checkpoint = cfg.get("checkpoint") if hasattr(cfg, "get") else None
    value = checkpoint.get("stop_within_s") if checkpoint is not None else None
    return float(value) if value is not None else None


@contextmanager
def interrupt_on_signals(
    run_id: str, defer: bool = False, again: str = "", deadline_s: Optional[float] = None
) -> Iterator[None]:
    """SIGTERM/SIGUSR1/SIGHUP outside the training loop (data preparation, evaluation) stop the job at once with
    RunInterrupted, so its record says `interrupted` and it exits 143; inside `fit`, LastCheckpoint takes the
    signals over for the time of training (it saves and stops after the batch), then hands them back.

    `defer` (training on several ranks): a rank that stopped alone before training left the others blocked for good
    in the process-group rendezvous (C++ code, where no Python signal handler runs; the SLURM time-limit test: rank
    0 hung until the limit, its record `running`). So the signal is only noted (qkvqa.utils.stop_signals), and
    LastCheckpoint stops every rank together after the first batch, with a checkpoint.

    Ctrl-C (SIGINT) is noted too and stops at once with KeyboardInterrupt (Lightning turns one inside `fit` into
    SystemExit(1)): `run_job` records `interrupted` either way and exits 130; with `defer`, the first one is only
    noted, as the other signals, and a second stops at once. `again`: the command that continues the run.

    `deadline_s` (with `defer`): a noted stop that training has not carried out this long after the signal (a long
    data preparation before the first batch: the job would outlast SLURM's signal lead and die unrequeued) stops
    the job then, with the signal's number (a SIGALRM timer; LastCheckpoint disarms it when it saves and stops).
    Nothing was trained since the last checkpoint, so nothing is lost; the other ranks got the same signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        first = stop_signal_received() is None
        note_stop_signal(signum)
        if signum == signal.SIGINT and not (defer and first):
            raise KeyboardInterrupt
        if defer:
            log.warning(
                "received %s: noted; training stops on every rank after its next batch (none once training is over)%s",
                signal.Signals(signum).name,
                f", or in {deadline_s:g} s if it has not by then (checkpoint.stop_within_s)" if deadline_s else "",
            )
            if deadline_s and signal.getitimer(signal.ITIMER_REAL)[0] == 0:
                signal.setitimer(signal.ITIMER_REAL, deadline_s)
            return
        raise RunInterrupted(
            f"run {run_id} stopped on {signal.Signals(signum).name}; continue it with: "
            f"{again or f'the same command plus run_id={run_id} resume=auto'}",
            signum=signum,
        )

    def deadline(signum, frame):
        held = stop_signal_received() or signal.SIGTERM
        raise RunInterrupted(
            f"run {run_id} stopped on {signal.Signals(held).name}: training had not reached a batch "
            f"{deadline_s:g} s after it (checkpoint.stop_within_s; data preparation), so the job stops "
            f"now, before SLURM's lead runs out; nothing was trained since the last checkpoint. "
            f"Continue it with: {again or f'the same command plus run_id={run_id} resume=auto'}",
            signum=held,
        )

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}  # SIGHUP: a closed terminal
    previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, deadline)
    try:
        held = stop_signal_received()  # arrived during start-up (qkvqa.utils.stop_signals): stop now
        if held is not None:
            stop(held, None)  # (noted again; with `defer` LastCheckpoint acts on it)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# What a run directory holds before its job has produced anything (the run record and logger scaffolding).
RECORD_ONLY = {
    "config.yaml",
    "status.json",
    "summary.json",
    "metrics.csv",
    "hparams.yaml",
    "wandb",
    "events",
    "inputs.json",  # the training input files' sha256 (qkvqa.run.resume.check_training_inputs)
}


def _is_user_error(error: BaseException) -> bool:
    from qkvqa.errors import QkvqaError

    return isinstance(error, QkvqaError)


def _remove_if_empty(run_dir) -> None:
    """Remove a run directory this invocation created when a user error (bad data, bad config) stopped it before it
    wrote anything but its record: a failed command leaves no directory behind, so a fixed rerun starts clean."""
    import shutil

    left = [p.name for p in run_dir.iterdir()]
    if all(name in RECORD_ONLY or name.startswith(".") for name in left):
        shutil.rmtree(run_dir, ignore_errors=True)
        log.info("removed %s: the run stopped on an error before producing anything", run_dir)


def _child_ckpt(run: RunContext) -> Optional[str]:
    """DDP ranks >= 1 resume from the checkpoint rank zero resumes from, found the same way from the same file
    (`last.ckpt`, which nothing writes before training starts on every rank), never from status.json: rank zero
    may not have rewritten it yet when a child starts (torchrun, srun), and a child then started from scratch
    beside a resumed rank zero. `RunStateCallback` checks at train start that every rank holds the same step."""
    last = run.run_dir / "last.ckpt"
    return str(last) if run.resumed and last.is_file() else None
