"""Build the Lightning Trainer of a job and run `fit` inside its run record."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional

import lightning.pytorch as pl
from omegaconf import DictConfig

from qkvqa.callbacks.last_checkpoint import LastCheckpoint
from qkvqa.callbacks.run_state import RunStateCallback
from qkvqa.callbacks.steps import EPOCH_KEY, STEP_KEY, OptimizerStepRows
from qkvqa.loggers.local import RunRecordLogger
from qkvqa.loggers.wandb import log_run_files, make_wandb_logger, wandb_run_id
from qkvqa.run.checkpoint_io import CheckedCheckpointIO
from qkvqa.run.job import Job, run_job
from qkvqa.run.slurm import slurm_plugins
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

_TRAINER_KEYS = (
    "accelerator",
    "devices",
    "num_nodes",
    "strategy",
    "precision",
    "max_epochs",
    "max_steps",
    "accumulate_grad_batches",
    "gradient_clip_val",
    "log_every_n_steps",
    "val_check_interval",
    "check_val_every_n_epoch",
    "limit_train_batches",
    "limit_val_batches",
    "num_sanity_val_steps",
    "deterministic",
    "enable_progress_bar",
    "enable_model_summary",
    "detect_anomaly",
    "fast_dev_run",
)


def trainer_kwargs(cfg: DictConfig) -> dict[str, Any]:
    """The `trainer:` section as keyword arguments (None values left to Lightning's defaults)."""
    kwargs = {k: cfg.trainer[k] for k in _TRAINER_KEYS if cfg.trainer[k] is not None}
    if kwargs.get("strategy") == "ddp" and kwargs.get("accelerator") == "cpu":
        from lightning.pytorch.strategies import DDPStrategy

        kwargs["strategy"] = DDPStrategy(process_group_backend="gloo")
    return kwargs


GPU_ACCELERATORS = ("gpu", "cuda")


def check_hardware(cfg: DictConfig, components: Iterable[str] = ()) -> None:
    """Before any work: a GPU the config asks for (trainer.accelerator, a component's device) exists, else one
    ConfigError line naming the key and the fix (Lightning's own error is a 30-line traceback, raised late)."""
    import torch

    from qkvqa.errors import ConfigError

    if torch.cuda.is_available():
        return
    asked = [f"trainer.accelerator={cfg.trainer.accelerator}"] if cfg.trainer.accelerator in GPU_ACCELERATORS else []
    asked += [
        f"components.{name}.device={cfg.components[name].device}"
        for name in components
        if str(cfg.components[name].device or "").startswith("cuda")
    ]
    if asked:
        raise ConfigError(
            f"{', '.join(asked)}, but this machine has no CUDA GPU (torch.cuda.is_available() is "
            f"False); run on a GPU node, or use preset=cpu (trainer.accelerator=cpu and "
            f"components.*.device=cpu)"
        )


def progress_callbacks(cfg: DictConfig) -> tuple[bool, list[pl.Callback]]:
    """(Lightning's bar on?, callbacks) for trainer.enable_progress_bar and logger.progress: a bar on a terminal, plain
    lines (`ProgressLines`) in a file, where Lightning's bar shows nothing until fit ends; nothing with mode off."""
    from qkvqa.callbacks.progress_lines import FitStartNote, ProgressLines
    from qkvqa.utils.progress import progress_mode

    mode = progress_mode() if cfg.trainer.enable_progress_bar else "off"
    note: list[pl.Callback] = [] if cfg.trainer.enable_model_summary else [FitStartNote()]
    if mode == "lines":
        return False, [ProgressLines(cfg.logger.progress.every_s, cfg.logger.progress.every_fraction), *note]
    return mode == "bar", note


def _run_dir_checkpoint_class():
    """ModelCheckpoint whose paths survive a move or copy of the run directory (issue 44).

    Lightning keeps the best and top-k checkpoints' absolute paths in its state, and reloads them only when the saved
    `dirpath` equals the current one: a run directory moved (or copied) after a validation resumed with its top-k
    forgotten and its best path pointing at the old place, so the best of the later validations alone was reported
    (11.11 at step 46 against the true 13.89 at step 23) and `RUN/qff_best` was never written. Here the paths are
    saved relative to the run directory and, on load, rebased onto the current one (an absolute path under the saved
    `dirpath`, from a checkpoint of an earlier version, is rebased too)."""
    import os

    from lightning.pytorch.callbacks import ModelCheckpoint

    from qkvqa.utils.io import path_within

    class RunDirCheckpoint(ModelCheckpoint):
        def _generate_state_key(self, **kwargs) -> str:
            return f"ModelCheckpoint{kwargs!r}"  # Lightning's own key: checkpoints of earlier versions load

        def state_dict(self) -> dict:
            state = super().state_dict()
            root = self.dirpath

            def rel(path):
                if isinstance(path, str) and path and root and os.path.isabs(path) and path_within(path, root):
                    return os.path.relpath(path, root)
                return path

            for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
                state[key] = rel(state.get(key))
            state["best_k_models"] = {rel(k): v for k, v in (state.get("best_k_models") or {}).items()}
            return state

        def load_state_dict(self, state_dict: dict) -> None:
            state = dict(state_dict)
            saved, here = state.get("dirpath"), self.dirpath

            def rebase(path):
                if not isinstance(path, str) or not path or not here:
                    return path
                if not os.path.isabs(path):
                    return os.path.join(here, path)
                if saved and saved != here and path_within(path, saved):
                    return os.path.join(here, os.path.relpath(path, saved))
                return path

            for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
                if key in state:
                    state[key] = rebase(state[key])
            if "best_k_models" in state:
                state["best_k_models"] = {rebase(k): v for k, v in state["best_k_models"].items()}
            state["dirpath"] = here  # the paths are this directory's now: Lightning reloads them all
            super().load_state_dict(state)

    return RunDirCheckpoint


def build_trainer(job: Job, callbacks: Iterable[pl.Callback] = (), batch_size: Optional[int] = None) -> pl.Trainer:
    """A Trainer whose checkpoints, local log and W&B files all live in the run directory."""
    ModelCheckpoint = _run_dir_checkpoint_class()  # noqa: N806 (a class)

    from qkvqa.run.lightning_noise import quiet_lightning, srun_hint_only_when_useful

    quiet_lightning()
    cfg = job.cfg
    ck = cfg.checkpoint
    # last.ckpt is LastCheckpoint's alone (why: its docstring); ModelCheckpoint keeps the top-k (monitored) or the
    # latest periodic checkpoint (unmonitored) under their own names.
    checkpoints: list[pl.Callback] = [
        LastCheckpoint(
            job.run.run_dir,
            ck.every_n_train_steps,
            ck.save_on_exception,
            stop_in_validation=ck.stop_within_s is not None,
        )
    ]
    if ck.save_top_k:
        checkpoints.append(
            ModelCheckpoint(
                dirpath=str(job.run.run_dir),
                filename="epoch{epoch:03d}-step{step:07d}",
                monitor=ck.monitor,
                mode=ck.mode,
                save_top_k=ck.save_top_k if ck.monitor else 1,
                save_last=False,
                every_n_train_steps=ck.every_n_train_steps,
                save_on_exception=False,
                auto_insert_metric_name=False,
                enable_version_counter=False,
            )
        )
    wandb_logger = make_wandb_logger(cfg, job.run, command=job.command or "train")
    # resumed: a run continued in its directory (from last.ckpt or from scratch) first drops the rows it logs again
    loggers = [RunRecordLogger(job.record, job.run.run_id, resumed=job.run.resumed)] + (
        [wandb_logger] if wandb_logger else []
    )
    state = RunStateCallback(job.plain_config, job.run.run_id, wandb_run_id(wandb_logger), batch_size)
    bar, shown = progress_callbacks(cfg)
    # qkvqa DataModules shard across ranks themselves (qkvqa.data_modules.samplers), which keeps mid-epoch
    # resume exact and evaluation free of padded duplicates; Lightning must not swap their samplers.
    with srun_hint_only_when_useful(world_size_of(cfg)):
        return pl.Trainer(
            default_root_dir=str(job.run.run_dir),
            logger=loggers,
            use_distributed_sampler=False,
            callbacks=[*checkpoints, state, OptimizerStepRows(), *shown, *callbacks],
            plugins=[CheckedCheckpointIO(), *slurm_plugins()],
            enable_checkpointing=bool(ck.save_top_k),
            **{**trainer_kwargs(cfg), "enable_progress_bar": bar},
        )


def world_size_of(cfg: DictConfig) -> int:
    """The world size a trainer config asks for (devices x nodes; -1/auto counted as visible GPUs)."""
    devices = cfg.trainer.devices
    if isinstance(devices, (list, tuple)):
        n = len(devices)
    elif str(devices) in ("-1", "auto"):
        import torch

        n = max(torch.cuda.device_count(), 1) if cfg.trainer.accelerator in ("gpu", "cuda", "auto") else 1
    else:
        n = int(devices)
    return n * int(cfg.trainer.num_nodes)


def fit(
    cfg: DictConfig,
    module: pl.LightningModule,
    datamodule: pl.LightningDataModule,
    command: str = "train",
    callbacks: Iterable[pl.Callback] = (),
    batch_size: Optional[int] = None,
) -> dict:
    """Train `module` on `datamodule` as one run; resumes with `resume=auto`; returns the summary."""
    from qkvqa.callbacks.steps import StepLearningRateMonitor
    from qkvqa.errors import RunInterrupted
    from qkvqa.run.lightning_noise import srun_hint_only_when_useful

    check_hardware(cfg)
    finished = finished_run_summary(cfg)
    if finished is not None:
        return finished
    world_size = world_size_of(cfg)
    with run_job(cfg, command, world_size, defer_stop=world_size > 1, trains=True) as job:  # see interrupt_on_signals
        pl.seed_everything(cfg.seed, workers=True, verbose=False)
        trainer = build_trainer(job, [StepLearningRateMonitor(logging_interval="step"), *callbacks], batch_size)
        last = next(cb for cb in trainer.callbacks if isinstance(cb, LastCheckpoint))
        # a stop during a validation is decided and saved by every rank together: they leave fit together too
        with closes_its_process_group(ended_together_on_error=lambda: last.preempted):
            with srun_hint_only_when_useful(world_size_of(cfg)):
                trainer.fit(module, datamodule=datamodule, ckpt_path=job.ckpt_path, weights_only=True)
        if last.preempted:
            job.final_state, job.received_signal = "interrupted", last.received
        summary: dict = {}
        if job.run.is_rank_zero and trainer.is_global_zero:
            ckpt_cb = trainer.checkpoint_callback
            summary = job.record.update_summary(
                {
                    "global_step": trainer.global_step,
                    "epoch": trainer.current_epoch,
                    "best_model_path": getattr(ckpt_cb, "best_model_path", None) or None,
                    "best_model_score": getattr(ckpt_cb, "best_model_score", None),
                    "last_model_path": str(job.run.run_dir / "last.ckpt"),
                    **{k: float(v) for k, v in trainer.callback_metrics.items() if k not in (STEP_KEY, EPOCH_KEY)},
                }
            )
            log_run_files(job.run.run_dir)
    if job.final_state == "interrupted":  # after run_job has recorded the state (and requeued on SIGUSR1)
        from qkvqa.utils.command_line import resume_command

        name = signal.Signals(job.received_signal).name if job.received_signal else "a signal"
        raise RunInterrupted(
            f"run {job.run.run_id} stopped on {name} at step {trainer.global_step} and saved "
            f"{job.run.run_dir / 'last.ckpt'}; continue it with: "
            f"{resume_command(command, job.run.run_id, cfg.experiment)}",
            signum=job.received_signal,
        )
    return summary


def process_group_initialized() -> bool:
    """Whether this process has a torch.distributed process group open."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


@contextmanager
def closes_its_process_group(ended_together_on_error: Callable[[], bool] = lambda: False) -> Iterator[None]:
    """Around a Lightning `fit` or `predict` (and whatever ends it on every rank): the process group that Lightning
    opens inside is closed on the way out (`close_process_group`), when the block ended normally on every rank, or
    raised where `ended_together_on_error()` says every rank stopped together. A group open before the block is not
    ours to close; nor is one a rank leaves alone (the others may still wait in a collective)."""
    opens = not process_group_initialized()
    together = False
    try:
        yield
        together = True
    finally:
        if opens and (together or ended_together_on_error()):
            close_process_group()


def close_process_group() -> None:
    """Close the process group of a fit that every rank has left together, before the process moves on to exit.

    A gloo worker thread finishes each collective after handing its result over: it drops the last reference to
    the op's tensors, which Python owns and whose release takes the GIL. A rank that exits right after its last
    collective (rank 1, with nothing to write after fit, a few ms; sooner under a loaded CPU) could reach
    Python's shutdown first: the thread's GIL request then ends the thread from within a noexcept C++ frame,
    `terminate called without an active exception`, and the rank died of SIGABRT after a finished run. Under
    torchrun the other agent then waited in its exit barrier (300 s) for an agent that had already failed: the
    relaunch of test_killed_torchrun_agents_... hung. Closing the group joins those threads here, with the GIL
    free (torch releases it to destroy a process group); Lightning only does it at exit for NCCL, never for gloo.
    Only after every rank has left fit together: a rank still inside a collective would wait for the others."""
    import torch.distributed as dist

    if process_group_initialized():
        dist.destroy_process_group()


def finished_run_summary(cfg: DictConfig) -> Optional[dict]:
    """`resume=auto` on a training run that has finished: say so and return its summary (nothing is rebuilt, refit,
    exported or rewritten; the command exits 0), else None (train)."""
    import json

    from qkvqa.run.resume import finished_training
    from qkvqa.run.rundir import resolve_run

    run = resolve_run(cfg)
    line = finished_training(cfg, run)
    if line is None:
        return None
    log.info("%s", line)
    path = run.run_dir / "summary.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
