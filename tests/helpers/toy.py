"""A deterministic toy regression task used to test the run machinery (records, resume, DDP)."""

from __future__ import annotations

from qkvqa.utils.stop_signals import hold_stop_signal

hold_stop_signal()  # as `qkvqa`'s main does, before the heavy imports below  # noqa: E402
import json
import os
import sys
import time
from typing import Optional

import lightning.pytorch as pl
import torch
from torch.utils.data import Dataset

from qkvqa.data_modules.samplers import (
    ResumableDataLoader,
    ResumableSampler,
    batches_per_epoch,
    private_generator,
    rank_and_world,
    trainer_batches_done,
)


class ToyDataset(Dataset):
    """y = x @ w + noise, fixed by the seed; items carry their index as an id."""

    def __init__(self, n: int = 64, dim: int = 8, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, dim, generator=g)
        self.y = self.x @ torch.randn(dim, 1, generator=g) + 0.01 * torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return {"idx": i, "x": self.x[i], "y": self.y[i]}


class ToyDataModule(pl.LightningDataModule):
    """Shuffled, rank-sharded, resumable training loader over ToyDataset."""

    def __init__(self, n: int = 64, batch_size: int = 8, seed: int = 0, val_n: int = 0):
        super().__init__()
        self.n, self.batch_size, self.seed, self.val_n = n, batch_size, seed, val_n

    def setup(self, stage=None):
        if os.environ.get("TOY_SETUP_FLAG"):  # data preparation that takes a while (signal tests)
            open(os.environ["TOY_SETUP_FLAG"], "w").close()
            time.sleep(float(os.environ.get("TOY_SETUP_SLEEP", "30")))
        self.ds = ToyDataset(self.n, seed=self.seed)
        self.val_ds = ToyDataset(self.val_n, seed=self.seed + 1) if self.val_n else None

    def train_batches_per_epoch(self, world_size: int) -> int:
        return batches_per_epoch(self.n, self.batch_size, world_size)

    def val_dataloader(self):
        if self.val_ds is None:
            return []
        rank, world = rank_and_world(self.trainer)
        sampler = ResumableSampler(len(self.val_ds), shuffle=False, rank=rank, world_size=world, pad=False)
        return torch.utils.data.DataLoader(
            self.val_ds, sampler=sampler, batch_size=self.batch_size, generator=private_generator()
        )

    def train_dataloader(self):
        rank, world = rank_and_world(self.trainer)
        sampler = ResumableSampler(len(self.ds), seed=self.seed, rank=rank, world_size=world)
        return ResumableDataLoader(
            self.ds,
            sampler,
            trainer_batches_done(self.trainer),
            batch_size=self.batch_size,
            num_workers=int(os.environ.get("TOY_WORKERS", "0")),
        )


class ToyRegressor(pl.LightningModule):
    """A linear model trained with AdamW + OneCycle, logging its loss each step."""

    def __init__(
        self,
        dim: int = 8,
        lr: float = 0.05,
        total_steps: Optional[int] = 100,
        fail_at_step: Optional[int] = None,
        seen_file: Optional[str] = None,
        step_sleep: float = 0.0,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(dim, 1)
        self.drop = torch.nn.Dropout(0.2)  # consumes RNG, so resume must restore it

    def setup(self, stage: str) -> None:
        if os.environ.get("TOY_RANK_SEED"):
            # Each rank draws its own dropout masks (as ranks do whose RNG streams differ): a resume is exact only if
            # every rank gets its own generator states back, not rank zero's. Before the checkpoint is restored.
            torch.manual_seed(1000 + 7919 * self.global_rank)

    def training_step(self, batch, batch_idx):
        if self.hparams.fail_at_step is not None and self.global_step == self.hparams.fail_at_step:
            raise RuntimeError(f"injected failure at step {self.global_step}")
        if self.hparams.step_sleep:
            time.sleep(self.hparams.step_sleep)
        loss = torch.nn.functional.mse_loss(self.net(self.drop(batch["x"])), batch["y"])
        self.log("train/loss", loss, on_step=True, prog_bar=False)
        if self.hparams.seen_file:
            with open(self.hparams.seen_file, "a") as f:
                f.write(
                    json.dumps({"step": self.global_step, "rank": self.global_rank, "ids": batch["idx"].tolist()})
                    + "\n"
                )
        return loss

    def validation_step(self, batch, batch_idx):
        if os.environ.get("TOY_VAL_SLEEP"):  # a long validation (stop-deadline tests)
            time.sleep(float(os.environ["TOY_VAL_SLEEP"]))
        loss = torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        self.log("val/loss", loss, on_epoch=True, batch_size=len(batch["x"]))

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        from qkvqa.run.steps import optimizer_steps

        total = self.hparams.total_steps or optimizer_steps(self.trainer)  # None: planned from the data, as the QFF
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=total)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main(argv: list[str]) -> None:
    """`python -m tests.helpers.toy key=value ...`: fit the toy task as a qkvqa run (used by DDP tests)."""
    from qkvqa.config.cli import split_overrides
    from qkvqa.config.load import compose
    from qkvqa.run.trainer import fit

    if os.environ.get("TOY_EXTRA_OVERRIDES"):  # more key=value, e.g. for one SLURM attempt (tests/slurm)
        argv = [*argv, *os.environ["TOY_EXTRA_OVERRIDES"].split(",")]
    experiment, presets, rest = split_overrides(argv)
    cfg = compose(experiment, presets, rest)
    total = os.environ.get("TOY_TOTAL_STEPS", "100")
    torch.manual_seed(cfg.seed)  # the same initial weights as an in-process run of the test
    module = ToyRegressor(
        seen_file=os.environ.get("TOY_SEEN_FILE"),
        total_steps=int(total) if total else None,
        step_sleep=float(os.environ.get("TOY_STEP_SLEEP", "0")),
    )
    callbacks = []
    if os.environ.get("QKVQA_TEST_FAULT"):
        from tests.helpers.faults import FaultInjector

        callbacks.append(FaultInjector(os.environ["QKVQA_TEST_FAULT"]))
    datamodule = ToyDataModule(n=int(os.environ.get("TOY_N", "64")), val_n=int(os.environ.get("TOY_VAL_N", "0")))
    fit(cfg, module, datamodule, command="toy-train", batch_size=8, callbacks=callbacks)


def report_threads_at_exit() -> None:
    """TOY_THREADS_AT_EXIT: print the names of this process's threads when Python starts its shutdown (Linux): a
    gloo worker still alive there can die taking the GIL and abort the process (qkvqa.run.trainer.close_process_group)."""
    import atexit

    def report() -> None:
        names = []
        for tid in sorted(os.listdir("/proc/self/task")):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                pass
        print(f"toy: threads at exit: {','.join(names)}", file=sys.stderr, flush=True)

    atexit.register(report)


if __name__ == "__main__":
    from qkvqa.errors import RunInterrupted

    if os.environ.get("TOY_THREADS_AT_EXIT"):
        report_threads_at_exit()

    try:
        main(sys.argv[1:])
    except RunInterrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
