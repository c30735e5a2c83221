"""The evaluation DataModule: one split's questions in fixed batches, sharded across ranks, minus the batches answered."""

from __future__ import annotations

from functools import partial
from typing import Iterable, Optional

import lightning as L
from torch.utils.data import DataLoader, Sampler

from qkvqa.data.benchmark import Benchmark
from qkvqa.data_modules.base import QuestionImageDataset, collate_samples, record_batch_skips
from qkvqa.data_modules.samplers import rank_and_world, worker_options


class EvaluationDataModule(L.LightningDataModule):
    """A benchmark's split for `Trainer.predict`: each remaining question goes to exactly one rank.

    Questions go in FIXED batches, positions `[k*B, (k+1)*B)` of the split in file order, whatever the number of
    ranks and whatever was answered before: the stages batch across questions (the QFF scores a batch's sections
    in shared forwards, CDA's reranker and the generator take the batch at once), and floats depend on a batch's
    composition in the last bits. With fixed batches, a run on one rank, on N ranks and a run resumed after a
    kill (a batch is written at once; a batch with any question unanswered is run again whole, and only its
    unanswered rows are written: `done_ids`) put every question in the same batch, so they give the same
    numbers bit for bit. Ranks take whole batches in turn (rank r: batches r, r + N, ...).
    """

    def __init__(
        self, benchmark: Benchmark, split: str, done_ids: Iterable[str] = (), batch_size: Optional[int] = None
    ):
        super().__init__()
        self.benchmark = benchmark
        self.split = split
        self.done_ids = set(done_ids)
        self.batch_size = batch_size or benchmark.config.batch_size
        self.dataset: Optional[QuestionImageDataset] = None
        self.batches: list[list[int]] = []  # the remaining fixed batches, as positions in `dataset`

    def remaining_batches(self) -> list[list]:
        """The split's fixed batches (see the class docstring) that hold at least one unanswered question."""
        questions = self.benchmark.questions(self.split)
        blocks = [questions[s : s + self.batch_size] for s in range(0, len(questions), self.batch_size)]
        return [block for block in blocks if any(q.data_id not in self.done_ids for q in block)]

    def setup(self, stage: Optional[str] = None) -> None:
        if self.dataset is None:
            blocks = self.remaining_batches()
            self.dataset = QuestionImageDataset([q for block in blocks for q in block], self.benchmark.image_loader)
            starts = [sum(len(b) for b in blocks[:k]) for k in range(len(blocks))]
            self.batches = [list(range(start, start + len(block))) for start, block in zip(starts, blocks)]

    def predict_dataloader(self) -> DataLoader:
        rank, world = rank_and_world(self.trainer)
        # This rank's batches back to back: each is full but the split's last, which comes last, so batch_size
        # cuts them exactly where they are (and Lightning's predict loop keeps its stock BatchSampler).
        mine = [i for batch in self.batches[rank::world] for i in batch]
        return DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            sampler=InOrder(mine),
            **worker_options(self.benchmark.config.num_workers),
            collate_fn=partial(collate_samples, drop_missing_images=True),
        )

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Count image skips seen in DataLoader workers (the benchmark's image loader keeps the counter)."""
        return record_batch_skips(self.benchmark.image_loader, batch)


class InOrder(Sampler[int]):
    """Given dataset positions, in the given order."""

    def __init__(self, indices: list[int]):
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self):
        return iter(self.indices)
