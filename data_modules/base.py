"""Shared base of the qkvqa DataModules: questions per split, their query images, and a collate that keeps PIL images."""
from __future__ import annotations

import random
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, Optional

import lightning as L
from torch.utils.data import DataLoader, Dataset

from qkvqa.data.config import DataConfig, data_config_from_dict, resolve_data_path
from qkvqa.data.images import ArticleImageIndex, ImageLoader, QueryImageResolver, SkippedImage
from qkvqa.data.kb import KBStore
from qkvqa.data.questions import Question
from qkvqa.data_modules.samplers import worker_options
from qkvqa.errors import ConfigError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

SPLITS = ("train", "val", "test")
# The splits each Lightning stage reads; the QFF training DataModule adds "train" to "fit".
STAGE_SPLITS = {"fit": ("val",), "validate": ("val",), "test": ("test",), "predict": ("test",)}
# Keys of a sample that collate into per-key lists (plus "image", "image_skip").
SAMPLE_KEYS = ("data_id", "question", "answers", "question_type", "image_id", "dataset_name", "gold_urls",
               "gold_title", "evidence_section_id", "evidence_section_title", "split", "answer_eval", "data_split",
               "infoseek_question_type", "image")


def question_sample(question: Question) -> dict[str, Any]:
    """The plain-dict view of a question that batches carry (without the image)."""
    reference = question.reference
    return {
        "data_id": question.data_id, "question": question.question, "answers": list(question.answers),
        "question_type": question.question_type, "image_id": question.image_id,
        "dataset_name": question.dataset_name, "gold_urls": list(question.gold_urls),
        "gold_title": question.gold_title, "evidence_section_id": question.evidence_section_id,
        "evidence_section_title": question.evidence_section_title, "split": question.split,
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
    """Questions of one benchmark with their query images; subclasses say how a split's file is read.

    Order is the file order (no shuffling), so DDP ranks see a deterministic partition; with
    Lightning's padded distributed sampler a few questions repeat and the evaluator de-duplicates
    by `data_id`. Missing and corrupt images are counted (also from DataLoader workers, through the
    batches) and written by `write_skipped_images(run_dir)`.
    """

    dataset_name = ""

    def __init__(self, config: DataConfig | dict):
        super().__init__()
        self.config = data_config_from_dict(config)
        self.image_loader = ImageLoader(QueryImageResolver(self.config.images, self.config.root))
        self.datasets: dict[str, QuestionImageDataset] = {}
        self._questions: dict[str, list[Question]] = {}
        self._kb_store: Optional[KBStore] = None
        self._article_images: Optional[ArticleImageIndex] = None

    def path(self, name: str) -> Optional[Path]:
        """A config path (`kb_source`, `test_questions`, ...) resolved against `data.root`."""
        return resolve_data_path(self.config, getattr(self.config, name))

    def questions_identity(self, split: str) -> Optional[dict]:
        """The dataset and the question file (resolved path and size) of `split`: what results computed over its
        questions record, so that results of another split or question file are refused (E-VQA ids repeat per file)."""
        path = self.path(f"{split}_questions")
        if path is None:
            return None
        return {"dataset": self.config.dataset, "file": str(path.resolve()),
                "size": path.stat().st_size if path.is_file() else None}

    def read_questions(self, split: str, path: Path) -> list[Question]:
        """Read the question file of `split` (implemented per benchmark)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to read questions")

    def questions(self, split: str) -> list[Question]:
        """The questions of `split` (cached): a seeded random sample of `sample_questions` of them in file order
        (the paper's 1K InfoSeek subset), then at most the first `max_questions`; ConfigError when no file is set."""
        if split not in self._questions:
            path = self.path(f"{split}_questions")
            if path is None:
                raise ConfigError(f"data.{split}_questions is not set, but the {split} split was requested")
            questions = self.read_questions(split, path)
            wanted = self.config.sample_questions
            if wanted is not None:
                if not 0 < wanted <= len(questions):
                    raise ConfigError(f"data.sample_questions={wanted}, but {path} has {len(questions)} questions")
                chosen = set(random.Random(self.config.sample_seed).sample(range(len(questions)), wanted))
                questions = [q for i, q in enumerate(questions) if i in chosen]
                log.info("%s: a random sample of %d of its questions (data.sample_seed %d)", path, wanted,
                         self.config.sample_seed)
            if self.config.max_questions is not None:
                questions = questions[: self.config.max_questions]
            self._questions[split] = questions
        return self._questions[split]

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
        return DataLoader(self.datasets[split], batch_size=self.config.batch_size, shuffle=False,
                          **worker_options(self.config.num_workers),
                          collate_fn=partial(collate_samples, drop_missing_images=self.config.drop_missing_images))

    def val_dataloader(self) -> DataLoader:
        return self.dataloader("val")

    def test_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def predict_dataloader(self) -> DataLoader:
        return self.dataloader("test")

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count, in the main process, the image skips that DataLoader workers saw."""
        if isinstance(batch, dict):
            for skip in batch.get("skipped_images", ()):
                self.image_loader.record(SkippedImage(**skip))
        return batch

    def write_skipped_images(self, run_dir: str | Path) -> Path:
        """Write `run_dir/skipped_images.json` and log the counts."""
        return self.image_loader.write_skipped(run_dir)

    def kb_store(self) -> KBStore:
        """The KB store of `data.kb_store` (checked against `data.kb_source` when that is set)."""
        if self._kb_store is None:
            store = self.path("kb_store")
            if store is None:
                raise ConfigError("data.kb_store is not set; build one with `qkvqa kb build --source KB --out DIR`")
            root = self.config.root
            if (root is None or not Path(root).expanduser().is_dir()) and not store.exists() \
                    and not Path(self.config.kb_store).expanduser().is_absolute():
                where = (f"data.root is not set, so data.kb_store {str(store)!r} was looked up relative to {Path.cwd()}"
                         if root is None else f"data.root {root!r} is not a folder (data.kb_store {str(store)!r})")
                raise ConfigError(f"{where}; set data.root (the demo presets read it from paths.world_dir, "
                                  "${paths.world_dir}/evqa: paths.world_dir=DIR, a world written by `qkvqa synth "
                                  "--out DIR`)")
            source = self.path("kb_source")
            self._kb_store = KBStore.open(store, source=source if source is not None and source.exists() else None,
                                          reflectiva_passages=self.config.reflectiva_passages)
        return self._kb_store

    def article_images(self) -> ArticleImageIndex:
        """KB article images by title, from `data.images.kb_image_csvs`, checked on first use: when more than
        `data.images.max_missing_fraction` of the images the CSVs list for the KB store's articles are missing (a
        kb_image_root one folder off), or none of its articles has one, DataError before any stage uses them."""
        if self._article_images is None:
            if not self.config.images.kb_image_csvs:
                raise ConfigError("data.images.kb_image_csvs is not set (the OMGM title -> image CSVs)")
            index = ArticleImageIndex.from_config(self.config.images, self.config.root)
            titles = kb_titles(self.kb_store()) if self.config.kb_store is not None else None
            counts = index.check_missing(self.config.images.max_missing_fraction, titles,
                                         "the KB store's articles" if titles is not None else "their titles")
            if counts["missing"]:
                log.warning("%d of %d KB images the title -> image CSVs list are missing (under the bound "
                            "data.images.max_missing_fraction=%s): those articles use their next image or none",
                            counts["missing"], counts["tried"], self.config.images.max_missing_fraction)
            self._article_images = index
        return self._article_images


def kb_titles(store: KBStore) -> list[str]:
    """Every article title of a KB store (one column read, no article bodies parsed)."""
    titles = getattr(store, "titles", None)
    if callable(titles):
        return list(titles())
    return [title for (title,) in store._connection().execute("SELECT title FROM articles")]
