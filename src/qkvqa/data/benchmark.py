"""A benchmark's data, without Lightning: its KB store, article images, questions per split (and their identity),
the query image loader and the paths of its `data:` section.

Every stage reads the data through the `Benchmark` it is given (`retrieve_split(cfg, split, benchmark=...)`,
`Embedder`, the miner, the QFF reranker, the evaluation's filters); the LightningDataModules of
`qkvqa.data_modules` each hold one (`datamodule.benchmark`) and add the datasets and loaders on top. Only the
command line (`qkvqa.cli`) and the evaluation recipe (`qkvqa.pipeline.evaluate`) build one from a config
(`build_benchmark(cfg.data)`).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Optional

from qkvqa.data.config import DataConfig, data_config_from_dict, reads_two_hop, resolve_data_path
from qkvqa.data.images import ArticleImageIndex, ImageLoader, QueryImageResolver
from qkvqa.data.kb import KBStore
from qkvqa.data.questions import (
    InfoSeekReference,
    Question,
    attach_infoseek_references,
    read_evqa_csv,
    read_infoseek_csv,
    read_infoseek_jsonl_questions,
    read_infoseek_references,
    read_webdataset_questions,
)
from qkvqa.data.shards import is_shard_pattern
from qkvqa.errors import ConfigError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)


class Benchmark:
    """One benchmark's data under a `data:` section; subclasses say how a split's question file is read.

    Everything is read lazily and kept: the questions of each split, the KB store (checked against its source
    on open), the article images (checked on first use). Missing and corrupt query images are counted by
    `image_loader` (`image_loader.write_skipped(run_dir)` writes them).
    """

    dataset_name = ""

    def __init__(self, config: DataConfig | dict):
        self.config = data_config_from_dict(config)
        self.image_loader = ImageLoader(QueryImageResolver(self.config.images, self.config.root))
        self._questions: dict[str, list[Question]] = {}
        self._kb_store: Optional[KBStore] = None
        self._article_images: Optional[ArticleImageIndex] = None

    def __getstate__(self) -> dict:
        """A pickled copy (what a DataLoader worker started by the fork server unpickles, at every epoch) leaves the
        questions read behind: the copy reads them again if asked, and the workers do not ask."""
        return {**self.__dict__, "_questions": {}}

    def path(self, name: str) -> Optional[Path]:
        """A config path (`kb_source`, `test_questions`, ...) resolved against `data.root`."""
        return resolve_data_path(self.config, getattr(self.config, name))

    def questions_identity(self, split: str) -> Optional[dict]:
        """The dataset and the question file (resolved path and size) of `split`: what results computed over its
        questions record, so that results of another split or question file are refused (E-VQA ids repeat per file)."""
        path = self.path(f"{split}_questions")
        if path is None:
            return None
        return {
            "dataset": self.config.dataset,
            "file": str(path.resolve()),
            "size": path.stat().st_size if path.is_file() else None,
        }

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
                log.info(
                    "%s: a random sample of %d of its questions (data.sample_seed %d)",
                    path,
                    wanted,
                    self.config.sample_seed,
                )
            if self.config.max_questions is not None:
                questions = questions[: self.config.max_questions]
            self._questions[split] = questions
        return self._questions[split]

    def kb_store(self) -> KBStore:
        """The KB store of `data.kb_store` (checked against `data.kb_source` when that is set)."""
        if self._kb_store is None:
            store = self.path("kb_store")
            if store is None:
                raise ConfigError("data.kb_store is not set; build one with `qkvqa kb build --source KB --out DIR`")
            root = self.config.root
            if (
                (root is None or not Path(root).expanduser().is_dir())
                and not store.exists()
                and not Path(self.config.kb_store).expanduser().is_absolute()
            ):
                where = (
                    f"data.root is not set, so data.kb_store {str(store)!r} was looked up relative to {Path.cwd()}"
                    if root is None
                    else f"data.root {root!r} is not a folder (data.kb_store {str(store)!r})"
                )
                raise ConfigError(
                    f"{where}; set data.root (the demo presets read it from paths.world_dir, "
                    "${paths.world_dir}/evqa: paths.world_dir=DIR, a world written by `qkvqa synth "
                    "--out DIR`)"
                )
            source = self.path("kb_source")
            self._kb_store = KBStore.open(
                store,
                source=source if source is not None and source.exists() else None,
                reflectiva_passages=self.config.reflectiva_passages,
            )
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
            counts = index.check_missing(
                self.config.images.max_missing_fraction,
                titles,
                "the KB store's articles" if titles is not None else "their titles",
            )
            if counts["missing"]:
                log.warning(
                    "%d of %d KB images the title -> image CSVs list are missing (under the bound "
                    "data.images.max_missing_fraction=%s): those articles use their next image or none",
                    counts["missing"],
                    counts["tried"],
                    self.config.images.max_missing_fraction,
                )
            self._article_images = index
        return self._article_images


class EVQABenchmark(Benchmark):
    """E-VQA questions (`data_id` = E-VQA_{i} over single-hop rows, E-VQA_2hop_{j} over 2_hop rows when read)
    and their first query image (iNaturalist / GLDv2). 2_hop rows are read when `include_two_hop` is true, or for
    an evaluation (`qkvqa.data.config.for_evaluation` resolves null to true)."""

    dataset_name = "E-VQA"

    def read_questions(self, split: str, path: Path) -> list[Question]:
        return read_evqa_csv(path, split=split, include_two_hop=reads_two_hop(self.config, evaluation=False))


class InfoSeekBenchmark(Benchmark):
    """InfoSeek questions from EchoSight-style CSVs, the official JSONL or ReflectiVA's query shards; val/test
    questions carry their reference (answer_eval, data_split, String/Numerical/Time)."""

    dataset_name = "InfoSeek"

    def __init__(self, config):
        super().__init__(config)
        self._references: Optional[dict[str, InfoSeekReference]] = None
        self.reference_overlap: dict[str, dict[str, int]] = {}

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), "_references": None}  # read again if asked, as the questions

    def references(self) -> Optional[dict[str, InfoSeekReference]]:
        """The official references with question types, or None when `data.infoseek_references` is not set."""
        if self._references is None and self.config.infoseek_references is not None:
            self._references = read_infoseek_references(self.path("infoseek_references"), self.path("infoseek_qtypes"))
        return self._references

    def read_questions(self, split: str, path: Path) -> list[Question]:
        if is_shard_pattern(path):
            references = self.references()
            if references is None:
                raise ConfigError(
                    f"data.infoseek_references must be set to read questions from the shards {path}: "
                    "they hold no answers (the official infoseek_val.jsonl does)"
                )
            shards = self.image_loader.resolver.shards(path)
            return read_webdataset_questions(shards, references, name=str(path))
        if path.suffix == ".jsonl":
            qtypes = self.path("infoseek_qtypes")
            if qtypes is None:
                raise ConfigError(f"data.infoseek_qtypes must be set to read questions from {path}")
            return read_infoseek_jsonl_questions(path, qtypes)
        questions = read_infoseek_csv(path, split=split)
        references = self.references()
        if references is not None and split != "train":
            self.reference_overlap[split] = attach_infoseek_references(questions, references, name=f"{split} ({path})")
        return questions


BENCHMARKS = {"evqa": EVQABenchmark, "infoseek": InfoSeekBenchmark}


def build_benchmark(config) -> Benchmark:
    """The Benchmark of `config.dataset` (a DataConfig, dict or DictConfig `data:` section)."""
    config = data_config_from_dict(config)
    if config.dataset not in BENCHMARKS:
        raise ConfigError(f"data.dataset: {config.dataset!r} is not one of {', '.join(BENCHMARKS)}")
    return BENCHMARKS[config.dataset](config)


def kb_titles(store: KBStore) -> list[str]:
    """Every article title of a KB store (one column read, no article bodies parsed)."""
    titles = getattr(store, "titles", None)
    if callable(titles):
        return list(titles())
    return [title for (title,) in store._connection().execute("SELECT title FROM articles")]
