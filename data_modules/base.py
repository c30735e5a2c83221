"""Shared base of the qkvqa DataModules: questions per split, their query images, and a collate that keeps PIL images."""

from __future__ import annotations

from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, Optional

import lightning as L
from torch.utils.data import DataLoader, Dataset

from qkvqa.data.benchmark import Benchmark
from qkvqa.data.config import DataConfig
from qkvqa.data.images import ArticleImageIndex, ImageLoader, SkippedImage
from qkvqa.data.kb import KBStore
from qkvqa.data.questions import Question
from qkvqa.data_modules.samplers import worker_options
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

SPLITS = ("train", "val", "test")
# The splits each Lightning stage reads; the QFF training DataModule adds "train" to "fit".
STAGE_SPLITS = {"fit": ("val",), "validate": ("val",), "test": ("test",), "predict": ("test",)}
# Keys of a sample that collate into per-key lists (plus "image", "image_skip").
SAMPLE_KEYS = (
    "data_id",
    "question",
    "answers",
    "question_type",
    "image_id",
    "dataset_name",
    "gold_urls",
    "gold_title",
    "evidence_section_id",
    "evidence_section_title",
    "split",
    "answer_eval",
    "data_split",
    "infoseek_question_type",
    "image",
)


def question_sample(question: Question) -> dict[str, Any]:
    """The plain-dict view of a question that batches carry (without the image)."""
    reference = question.reference
    return {
        "data_id": question.data_id,
        "question": question.question,
        "answers": list(question.answers),
        "question_type": question.question_type,
        "image_id": question.image_id,
        "dataset_name": question.dataset_name,
        "gold_urls": list(question.gold_urls),
        "gold_title": question.gold_title,
        "evidence_section_id": question.evidence_section_id,
        "evidence_section_title": question.evidence_section_title,
        "split": question.split,
        "answer_eval": reference.answer_eval if reference else None,
        "data_split": reference.data_split if reference else None,
        "infoseek_question_type": reference.question_type if reference else None,
    }


class QuestionImageDataset(Dataset):
    """Questions in file order, each with its query image (PIL RGB) or None plus the recorded skip."""

    def __init__(self, questions: list[Question], image_loader: ImageLoader):
        self.questions = questions
        self.image_loader = image_loader

    def __len__(self) -> int:
        return len(self.questions)

    def __getitem__(self, index: int) -> dict[str, Any]:
        question = self.questions[index]
        sample = question_sample(question)
        sample["image"] = self.image_loader.load(question.dataset_name, question.image_id)
        skip = self.image_loader.skipped.get((question.dataset_name, question.image_id))
        sample["image_skip"] = asdict(skip) if sample["image"] is None and skip is not None else None
        return sample


def collate_samples(samples: list[dict[str, Any]], drop_missing_images: bool = True) -> dict[str, Any]:
    """Samples -> a dict of lists (PIL images stay a list); samples without an image are dropped and listed.

    The batch always has `size`, `skipped_images` (the skip records, for the main process to count)
    and `dropped_data_ids`; a batch in which every image was skipped has size 0 and empty lists.
    """
    kept = [s for s in samples if s["image"] is not None or not drop_missing_images]
    batch: dict[str, Any] = {key: [s[key] for s in kept] for key in SAMPLE_KEYS}
    batch["size"] = len(kept)
    batch["skipped_images"] = [s["image_skip"] for s in samples if s["image_skip"] is not None]
    batch["dropped_data_ids"] = [s["data_id"] for s in samples if s["image"] is None and drop_missing_images]
    return batch


class KBVQADataModule(L.LightningDataModule):
    """Questions of one benchmark with their query images, for a Lightning Trainer: the data itself is the
    `Benchmark` it holds (`self.benchmark`: KB store, article images, questions, image loader, paths), which the
    DataModule's own `questions`, `kb_store`, ... pass on to.

    Order is the file order (no shuffling), so DDP ranks see a deterministic partition; with
    Lightning's padded distributed sampler a few questions repeat and the evaluator de-duplicates
    by `data_id`. Missing and corrupt images are counted (also from DataLoader workers, through the
    batches) and written by `write_skipped_images(run_dir)`.
    """

    benchmark_class: type[Benchmark] = Benchmark

    def __init__(self, config: DataConfig | dict | Benchmark):
        super().__init__()
        self.benchmark = config if isinstance(config, Benchmark) else self.benchmark_class(config)
        self.config = self.benchmark.config
        self.image_loader = self.benchmark.image_loader
        self.datasets: dict[str, QuestionImageDataset] = {}

    @property
    def dataset_name(self) -> str:
        return self.benchmark.dataset_name

    def path(self, name: str) -> Optional[Path]:
        """A config path (`kb_source`, `test_questions`, ...) resolved against `data.root`."""
        return self.benchmark.path(name)

    def questions_identity(self, split: str) -> Optional[dict]:
        """The dataset and question file of `split` (`Benchmark.questions_identity`)."""
        return self.benchmark.questions_identity(split)

    def questions(self, split: str) -> list[Question]:
        """The questions of `split` (`Benchmark.questions`)."""
        return self.benchmark.questions(split)

    def kb_store(self) -> KBStore:
        """The KB store of `data.kb_store` (`Benchmark.kb_store`)."""
        return self.benchmark.kb_store()

    def article_images(self) -> ArticleImageIndex:
        """KB article images by title (`Benchmark.article_images`, checked on first use)."""
        return self.benchmark.article_images()

    def setup(self, stage: Optional[str] = None) -> None:
        """Build the datasets of the splits `stage` reads (all configured splits when stage is None)."""
        if stage is None:
            splits = [s for s in SPLITS if getattr(self.config, f"{s}_questions") is not None]
        else:
            splits = list(STAGE_SPLITS.get(stage, ()))
        for split in splits:
            if split not in self.datasets and getattr(self.config, f"{split}_questions") is not None:
                self.datasets[split] = QuestionImageDataset(self.questions(split), self.image_loader)
                log.info("%s %s: %d questions", self.dataset_name, split, len(self.datasets[split]))

    def dataloader(self, split: str) -> DataLoader:
        """A deterministic (unshuffled) loader over `split`."""
        if split not in self.datasets:
            self.datasets[split] = QuestionImageDataset(self.questions(split), self.image_loader)
        return DataLoader(
            self.datasets[split],
            batch_size=self.config.batch_size,
            shuffle=False,
            **worker_options(self.config.num_workers),
            collate_fn=partial(collate_samples, drop_missing_images=self.config.drop_missing_images),
        )

    def val_dataloader(self) -> DataLoader:
        return self.dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def predict_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count, in the main process, the image skips that DataLoader workers saw."""
        return record_batch_skips(self.image_loader, batch)

    def write_skipped_images(self, run_dir: str | Path) -> Path:
        """Write `run_dir/skipped_images.json` and log the counts."""
        return self.image_loader.write_skipped(run_dir)


def record_batch_skips(image_loader: ImageLoader, batch: Any) -> Any:
    """Count in `image_loader` (in the main process) the image skips a batch carries from DataLoader workers."""
    if isinstance(batch, dict):
        for skip in batch.get("skipped_images", ()):
            image_loader.record(SkippedImage(**skip))
    return batch
