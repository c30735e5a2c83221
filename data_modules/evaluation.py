"""The evaluation DataModule: one split's questions, sharded across ranks with no padding, minus those already answered."""
from __future__ import annotations

from functools import partial
from typing import Iterable, Optional

import lightning as L
from torch.utils.data import DataLoader

from qkvqa.data_modules.base import KBVQADataModule, QuestionImageDataset, collate_samples
from qkvqa.data_modules.samplers import ResumableSampler, rank_and_world


class EvaluationDataModule(L.LightningDataModule):
    """Wraps a benchmark DataModule for `Trainer.predict`: each remaining question goes to exactly one rank."""

    def __init__(self, benchmark: KBVQADataModule, split: str, done_ids: Iterable[str] = (), batch_size: Optional[int] = None):
        super().__init__()
        self.benchmark = benchmark
        self.split = split
        self.done_ids = set(done_ids)
        self.batch_size = batch_size or benchmark.config.batch_size
        self.dataset: Optional[QuestionImageDataset] = None

    def remaining(self):
        """The split's questions that still need an answer, in file order."""
        return [q for q in self.benchmark.questions(self.split) if q.data_id not in self.done_ids]

    def setup(self, stage: Optional[str] = None) -> None:
        if self.dataset is None:
            self.dataset = QuestionImageDataset(self.remaining(), self.benchmark.image_loader)

    def predict_dataloader(self) -> DataLoader:
        rank, world = rank_and_world(self.trainer)
        sampler = ResumableSampler(len(self.dataset), shuffle=False, rank=rank, world_size=world, pad=False)
        return DataLoader(self.dataset, batch_size=self.batch_size, sampler=sampler,
                          num_workers=self.benchmark.config.num_workers,
                          collate_fn=partial(collate_samples, drop_missing_images=True))

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Count image skips seen in DataLoader workers (the benchmark module keeps the counter)."""
        return self.benchmark.on_after_batch_transfer(batch, dataloader_idx)
