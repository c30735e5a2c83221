"""A deterministic toy regression task used to test the run machinery (records, resume, DDP)."""
from __future__ import annotations

import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset


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
    """Shuffled training loader over ToyDataset."""

    def __init__(self, n: int = 64, batch_size: int = 8, seed: int = 0):
        super().__init__()
        self.n, self.batch_size, self.seed = n, batch_size, seed

    def setup(self, stage=None):
        self.ds = ToyDataset(self.n, seed=self.seed)

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=self.batch_size, shuffle=True,
                          generator=torch.Generator().manual_seed(self.seed))


class ToyRegressor(pl.LightningModule):
    """A linear model trained with AdamW + OneCycle, logging its loss each step."""

    def __init__(self, dim: int = 8, lr: float = 0.05, total_steps: int = 100):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(dim, 1)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])
        self.log("train/loss", loss, on_step=True, prog_bar=False)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr, total_steps=self.hparams.total_steps)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def main(argv: list[str]) -> None:
    """`python -m tests.helpers.toy key=value ...`: fit the toy task as a qkvqa run (used by DDP tests)."""
    from qkvqa.config.cli import split_overrides
    from qkvqa.config.load import compose
    from qkvqa.run.trainer import fit

    experiment, presets, rest = split_overrides(argv)
    cfg = compose(experiment, presets, rest)
    fit(cfg, ToyRegressor(), ToyDataModule(), command="toy-train", batch_size=8)


if __name__ == "__main__":
    main(sys.argv[1:])
