"""QFF training DataModule: a question with its query image, the positive section and hard negatives drawn per (seed, epoch, sample).

A training sample is (query image, question, positive, `num_negatives` negatives), each candidate a
(section string, article image) pair, the positive first. The pools come from `qkvqa mine`
(`qkvqa.qff.mining`, OMGM's rule); negatives are drawn from a sample's pool with a generator seeded
by (seed, epoch, sample index), so an epoch's draws are the same on every rank, with any number of
workers and after a resume. Samples the rule drops are left out at setup and counted.

The collate (`QFFCollator`, in the DataLoader workers) tokenises with dynamic padding (at most
`max_text_tokens`, 512), and gathers the DISTINCT images of the batch once: `pixel_values [U, 3, S, S]`
(or, with a ViT feature cache, `image_features [U, P, D]`) plus `question_image_index [B]` and
`section_image_index [B * (1 + num_negatives)]`. A sample whose query or article image cannot be
loaded is dropped from its batch and listed in `batch["dropped"]`; a batch in which every sample was
dropped has `size == 0`, which the trainer skips.

Validation batches carry, besides the same contrastive group (section R@1), every candidate section
of the stage-1 top-`val_top_k` articles of each question (`batch["rerank"]`), for the article R@1
after fusion.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch.utils.data import DataLoader, Dataset

from qkvqa.config.schema import QFFConfig
from qkvqa.data.benchmark import Benchmark, build_benchmark
from qkvqa.data.kb import kb_content
from qkvqa.data.questions import Question, is_training_question
from qkvqa.data_modules.base import KBVQADataModule
from qkvqa.data_modules.samplers import (
    ResumableDataLoader,
    ResumableSampler,
    batches_per_epoch,
    private_generator,
    rank_and_world,
    trainer_batches_done,
    worker_options,
)
from qkvqa.errors import ConfigError, DataError
from qkvqa.qff.mining import ArticleFactsSource, Candidate, PoolFile, SamplePool, image_key, image_paths_for
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

# Large odd multipliers that spread (seed, epoch, index) over the generator's seed space.
_EPOCH_STRIDE = 1_000_003
_SEED_STRIDE = 7_919_000_011


def query_image_id(dataset_name: str, image_id: str) -> str:
    """The id of a query image in batches and in the ViT feature cache."""
    return f"query/{dataset_name}/{image_id}"


def article_image_id(stored_path: str) -> str:
    """The id of an article image (by its stored path) in batches and in the ViT feature cache."""
    return f"article/{stored_path}"


def draw_negatives(
    pool: SamplePool, count: int, seed: int, epoch: int, index: int, keep_gold: bool = False
) -> list[Candidate]:
    """`count` negatives drawn without replacement from `pool`, determined by (seed, epoch, sample index).
    `keep_gold`: the gold article's other sections are always among them and only the rest is drawn (OMGM draws all
    at random, so a few sibling sections among a hundred others are rarely in a sample)."""
    rng = random.Random(seed * _SEED_STRIDE + epoch * _EPOCH_STRIDE + index)
    if not keep_gold:
        return rng.sample(list(pool.negatives), count)
    gold = [c for c in pool.negatives if c.url == pool.positive.url][:count]
    return gold + rng.sample([c for c in pool.negatives if c.url != pool.positive.url], count - len(gold))


@dataclass
class QFFDataSettings:
    """What the QFF DataModule needs beyond the `data:` section: the `qff:` section whole (the one `QFFConfig` the
    component and the trainer read: pools, negatives, sample caps, ViT cache, rerank chunk), the run's seed, the
    built component's text limits (`qff.max_text_tokens` within the model's positions) and its ViT fingerprint."""

    qff: QFFConfig = field(default_factory=QFFConfig)
    seed: int = 0
    max_text_tokens: int = 512  # the component's
    question_max_tokens: int = 64  # the component's
    vision_fingerprint: Optional[str] = None  # the model's ViT fingerprint, checked against the cache


@dataclass(frozen=True)
class SampleRef:
    """A kept sample: its question and the pool key of its query image."""

    question: Question
    key: str


class QFFSampleDataset(Dataset):
    """Samples of one split; item `(epoch, index)` (or `index`, epoch 0) draws the negatives of that epoch."""

    def __init__(
        self, samples: list[SampleRef], pools: PoolFile, store, settings: QFFDataSettings, with_rerank: bool = False
    ):
        self.samples = samples
        self.pools = pools
        self.store = store
        self.settings = settings
        self.with_rerank = with_rerank

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, item) -> dict[str, Any]:
        epoch, index = item if isinstance(item, tuple) else (0, item)
        ref = self.samples[index]
        s = self.settings
        pool = self.pools.pool(
            ref.question, ref.key, gold_sections=s.qff.mining_gold_sections, num_negatives=s.qff.num_negatives
        )
        candidates = [pool.positive] + draw_negatives(
            pool, s.qff.num_negatives, s.seed, epoch, index, keep_gold=s.qff.keep_gold_negatives
        )
        articles = {url: self.store.get_by_url(url) for url in dict.fromkeys(c.url for c in candidates)}
        question = ref.question
        sample = {
            "data_id": question.data_id,
            "question": question.question,
            "query_image": (question.dataset_name, question.image_id),
            "texts": [articles[c.url].section_string(c.section_index) for c in candidates],
            "images": [c.image for c in candidates],
            "candidates": [(c.url, c.section_index) for c in candidates],
        }
        if self.with_rerank:
            sample["rerank"] = self._rerank_candidates(ref)
        return sample

    def _rerank_candidates(self, ref: SampleRef) -> dict[str, Any]:
        """Every candidate section of the stage-1 top-K articles (articles without image or sections score 0)."""
        urls, sims = self.pools.ranking(ref.key)
        urls, sims = urls[: self.settings.qff.val_top_k], sims[: self.settings.qff.val_top_k]
        articles = []
        for url, sim in zip(urls, sims):
            facts = self.pools.facts(url)
            if facts is None or facts.image is None or not facts.sections:
                articles.append({"url": url, "similarity": sim, "image": None, "texts": [], "sections": []})
                continue
            article = self.store.get_by_url(url)
            articles.append(
                {
                    "url": url,
                    "similarity": sim,
                    "image": facts.image,
                    "sections": list(facts.sections),
                    "texts": [article.section_string(i) for i in facts.sections],
                }
            )
        return {
            "gold_urls": list(ref.question.gold_urls),
            "evidence_section_id": ref.question.evidence_section_id,
            "articles": articles,
        }


class EpochTaggedSampler(ResumableSampler):
    """A ResumableSampler that yields `(epoch, index)`, so that the dataset draws that epoch's negatives."""

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch = self.epoch
        for index in super().__iter__():
            yield epoch, index


class QFFCollator:
    """Tokenises, de-duplicates the batch's images and loads them once (pixels or cached ViT features); drops unusable samples."""

    def __init__(
        self, tokenizer, settings: QFFDataSettings, image_paths, query_loader, image_processor=None, feature_cache=None
    ):
        if image_processor is None and feature_cache is None:
            raise ConfigError("the QFF collate needs an image processor or a ViT feature cache")
        self.tokenizer = tokenizer
        self.settings = settings
        self.image_paths = image_paths
        self.query_loader = query_loader
        self.image_processor = image_processor
        self.feature_cache = feature_cache

    def _text(self, text: str) -> str:
        if self.settings.qff.blip_text_preprocess:
            from qkvqa.data.sections import blip_caption

            return blip_caption(text)
        return text

    def _tokenize(self, texts: Sequence[str], max_length: int) -> dict[str, torch.Tensor]:
        batch = self.tokenizer(
            [self._text(t) for t in texts],
            padding="longest",
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}

    def load_image(self, image_id: str):
        """One image by id (PIL RGB, or cached features with a cache), None when it cannot be read (counted)."""
        return self.load_images([image_id])[0].get(image_id)

    def load_images(self, image_ids: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
        """Loaded images (PIL or feature rows) by id, and the reason of each id that could not be loaded."""
        loaded, failed = {}, {}
        if self.feature_cache is not None:
            for image_id in image_ids:
                row = self.feature_cache.get(image_id)
                if row is None:
                    failed[image_id] = self.feature_cache.skip_reason(image_id)
                else:
                    loaded[image_id] = row
            return loaded, failed
        for image_id in image_ids:
            kind, _, rest = image_id.partition("/")
            if kind == "query":
                dataset_name, _, raw_id = rest.partition("/")
                image = self.query_loader.load(dataset_name, raw_id)
            else:
                image = self.query_loader.load_file(self.image_paths.resolve(rest), rest, "kb")
            if image is None:
                failed[image_id] = f"{'query' if kind == 'query' else 'article'}_image_unreadable"
            else:
                loaded[image_id] = image
        return loaded, failed

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        wanted = {}
        for sample in samples:
            wanted[query_image_id(*sample["query_image"])] = None
            for path in sample["images"]:
                wanted[article_image_id(path)] = None
            for article in sample.get("rerank", {}).get("articles", ()):
                if article["image"] is not None:
                    wanted[article_image_id(article["image"])] = None
        loaded, failed = self.load_images(list(wanted))
        kept, dropped = [], []
        for sample in samples:
            ids = [query_image_id(*sample["query_image"])] + [article_image_id(p) for p in sample["images"]]
            bad = next((i for i in ids if i in failed), None)
            if bad is None:
                kept.append(sample)
            else:
                dropped.append({"data_id": sample["data_id"], "reason": failed[bad], "image": bad})
        batch: dict[str, Any] = {
            "size": len(kept),
            "dropped": dropped,
            "data_ids": [s["data_id"] for s in kept],
            "num_candidates": 1 + self.settings.qff.num_negatives,
        }
        if not kept:
            return batch
        order: dict[str, int] = {}

        def position(image_id: str) -> int:
            return order.setdefault(image_id, len(order))

        batch["question_image_index"] = torch.tensor([position(query_image_id(*s["query_image"])) for s in kept])
        batch["section_image_index"] = torch.tensor([position(article_image_id(p)) for s in kept for p in s["images"]])
        batch["question"] = self._tokenize([s["question"] for s in kept], self.settings.question_max_tokens)
        batch["sections"] = self._tokenize([t for s in kept for t in s["texts"]], self.settings.max_text_tokens)
        batch["candidates"] = [s["candidates"] for s in kept]
        if "rerank" in kept[0]:
            batch["rerank"] = self._rerank(kept, position, loaded)
        images = list(order)
        batch["image_ids"] = images
        if self.feature_cache is not None:
            batch["image_features"] = torch.from_numpy(self.feature_cache.stack([loaded[i] for i in images]))
        else:
            batch["pixel_values"] = self.image_processor(images=[loaded[i] for i in images], return_tensors="pt")[
                "pixel_values"
            ]
        return batch

    def _rerank(self, kept: list[dict[str, Any]], position, loaded) -> dict[str, Any]:
        """All candidate sections of the questions' top-K articles, in padded chunks sorted by length."""
        flat = []  # (question row, article row, section position, text, image position)
        questions = []
        for row, sample in enumerate(kept):
            rerank = sample["rerank"]
            articles = []
            for a_row, article in enumerate(rerank["articles"]):
                usable = article["image"] is not None and article_image_id(article["image"]) in loaded
                articles.append(
                    {
                        "url": article["url"],
                        "similarity": article["similarity"],
                        "sections": article["sections"] if usable else [],
                    }
                )
                if usable:
                    image = position(article_image_id(article["image"]))
                    flat.extend((row, a_row, j, text, image) for j, text in enumerate(article["texts"]))
            questions.append(
                {
                    "gold_urls": rerank["gold_urls"],
                    "evidence_section_id": rerank["evidence_section_id"],
                    "articles": articles,
                }
            )
        ids = (
            self.tokenizer([self._text(f[3]) for f in flat], truncation=True, max_length=self.settings.max_text_tokens)[
                "input_ids"
            ]
            if flat
            else []
        )
        by_length = sorted(range(len(flat)), key=lambda n: len(ids[n]))
        chunks = []
        pad = self.tokenizer.pad_token_id
        for start in range(0, len(by_length), self.settings.qff.section_batch_size):
            rows = by_length[start : start + self.settings.qff.section_batch_size]
            length = max(len(ids[n]) for n in rows)
            input_ids = torch.full((len(rows), length), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), length), dtype=torch.long)
            for r, n in enumerate(rows):
                input_ids[r, : len(ids[n])] = torch.tensor(ids[n])
                mask[r, : len(ids[n])] = 1
            chunks.append(
                {
                    "input_ids": input_ids,
                    "attention_mask": mask,
                    "image_index": torch.tensor([flat[n][4] for n in rows]),
                    "question_index": torch.tensor([flat[n][0] for n in rows]),
                    "slot": torch.tensor([[flat[n][0], flat[n][1], flat[n][2]] for n in rows]),
                }
            )
        return {"questions": questions, "chunks": chunks}


class FactsSourceOf:
    """A pool file's fallback facts (`ArticleFactsSource`) over a benchmark's KB store and article images, built when
    first asked for; picklable without the DataModule (its bound method took the DataModule, and through it the
    trainer, into what a fork-server DataLoader worker unpickles: data_modules.samplers.worker_start_context), and
    without the questions the benchmark read (`Benchmark.__getstate__`)."""

    def __init__(self, benchmark: Benchmark, image_paths):
        self.benchmark, self.image_paths = benchmark, image_paths

    def __call__(self) -> ArticleFactsSource:
        return ArticleFactsSource(self.benchmark.kb_store(), self.benchmark.article_images(), self.image_paths)


class QFFTrainDataModule(KBVQADataModule):
    """Training and validation samples of the QFF (see the module docstring); sharded per rank, resumable mid-epoch."""

    def __init__(
        self,
        config,
        settings: QFFDataSettings,
        tokenizer,
        image_processor=None,
        miner: Optional[Callable[[str, Path], Path]] = None,
        pools_dir: Optional[Path] = None,
    ):
        super().__init__(config if isinstance(config, Benchmark) else build_benchmark(config))
        self.settings = settings
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_paths = image_paths_for(self.config)
        self.miner = miner
        self.pools_dir = pools_dir
        self.samples: dict[str, list[SampleRef]] = {}
        self.pool_files: dict[str, PoolFile] = {}
        self.setup_drops: dict[str, dict[str, Any]] = {}
        self._feature_cache = None

    # ------------------------------------------------------------------ samples
    def splits(self) -> list[str]:
        """The splits this DataModule serves: train, and val when it has val pools or can mine them."""
        has_val = self.settings.qff.val_negatives is not None or (
            self.miner is not None and self.config.val_questions is not None
        )
        return ["train", "val"] if has_val else ["train"]

    def _mined_path(self, split: str) -> Path:
        """Where the pools of `split` are mined in-process: `hardneg_{split}.json` in the run directory."""
        where = self.pools_dir or (Path(self.trainer.default_root_dir) if self.trainer is not None else None)
        if where is None:
            raise ConfigError(
                f"qff.{'negatives' if split == 'train' else 'val_negatives'} is not set and there is "
                f"no run directory to mine into; mine the pools with `qkvqa mine split={split}`"
            )
        return Path(where) / f"hardneg_{split}.json"

    def pools_path(self, split: str) -> Path:
        """The pools file of `split`: qff.negatives / qff.val_negatives, else the one mined into the run directory."""
        configured = self.settings.qff.negatives if split == "train" else self.settings.qff.val_negatives
        if configured is not None:
            return Path(configured).expanduser()
        if self.miner is None:
            raise ConfigError(
                f"qff.{'negatives' if split == 'train' else 'val_negatives'} is not set; mine the "
                f"pools with `qkvqa mine split={split}`"
            )
        return self._mined_path(split)

    def prepare_data(self) -> None:
        """Mine the pools that are not configured (once per node; a resumed run reuses the ones it mined)."""
        for split in self.splits():
            path = self.pools_path(split)
            if not path.is_file() and self.miner is not None:
                log.info(
                    "qff.%s is not set: mining the %s pools into %s",
                    "negatives" if split == "train" else "val_negatives",
                    split,
                    path.parent,
                )
                self.miner(split, path.parent)

    def pool_file(self, split: str) -> PoolFile:
        """The pools of `split`, read once."""
        if split not in self.pool_files:
            self.pool_files[split] = PoolFile(
                self.pools_path(split),
                fallback=FactsSourceOf(self.benchmark, self.image_paths),
                kb_checksum=self.kb_store().url_checksum,
                kb_content=kb_content(self.kb_store()),  # text edited under the same URLs (issue 44)
            )
        return self.pool_files[split]

    def build_samples(self, split: str) -> list[SampleRef]:
        """The kept samples of `split` (rule drops counted in `setup_drops`), capped by max_*_samples (seeded subset)."""
        if split in self.samples:
            return self.samples[split]
        pools = self.pool_file(split)
        resolver = self.image_loader.resolver
        s = self.settings
        kept, reasons, dropped = [], Counter(), []
        for question in self.questions(split):
            if not is_training_question(question):
                reasons["not_training_type"] += 1
                continue
            key = image_key(resolver, question.dataset_name, question.image_id)
            if key not in pools.entries:
                reason = "not_in_pools"
            else:
                pool = pools.pool(
                    question, key, gold_sections=s.qff.mining_gold_sections, num_negatives=s.qff.num_negatives
                )
                reason = pool if isinstance(pool, str) else None
            if reason is None:
                kept.append(SampleRef(question, key))
            else:
                reasons[reason] += 1
                dropped.append({"data_id": question.data_id, "reason": reason})
        cap = s.qff.max_train_samples if split == "train" else s.qff.max_val_samples
        if cap is not None and cap < len(kept):
            chosen = sorted(random.Random(s.seed).sample(range(len(kept)), cap))
            kept = [kept[i] for i in chosen]
        self.setup_drops[split] = {"kept": len(kept), "dropped_by_reason": dict(reasons), "dropped": dropped}
        log.info(
            "QFF %s samples: %d kept; dropped %s",
            split,
            len(kept),
            ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) or "none",
        )
        if not kept:
            message = (
                f"QFF {split}: 0 of {sum(reasons.values())} questions give a training sample with the pools "
                f"{pools.path} (dropped: {', '.join(f'{r} {n}' for r, n in sorted(reasons.items())) or 'none'})"
            )
            if split == "train":
                raise DataError(
                    message + ": nothing to train on. `no_gold_image` for all is a KB image root or "
                    "title -> image CSVs that do not match the KB (data.images.kb_image_root is the folder "
                    "holding full/); `not_in_pools` is pools mined for other questions"
                )
            log.warning("%s: validation has no samples", message)
        self.samples[split] = kept
        return kept

    def check_article_images(self, splits: Sequence[str] = ("train",)) -> dict[str, int]:
        """Before fit: at most data.images.max_missing_fraction of the distinct article images the kept samples of
        `splits` use exist under data.images.kb_image_root (pools store them relative to it); DataError with the
        counts and the first paths tried otherwise (pools mined under another root, a root one folder off)."""
        stored: dict[str, None] = {}
        for split in (s for s in splits if s in self.splits()):
            pools = self.pool_file(split)
            s = self.settings
            for ref in self.build_samples(split):
                pool = pools.pool(
                    ref.question, ref.key, gold_sections=s.qff.mining_gold_sections, num_negatives=s.qff.num_negatives
                )
                if not isinstance(pool, str):
                    stored.update((c.image, None) for c in (pool.positive, *pool.negatives))
        missing = [
            (name, self.image_paths.resolve(name)) for name in stored if not self.image_paths.resolve(name).is_file()
        ]
        bound = float(self.config.images.max_missing_fraction)
        if stored and len(missing) > bound * len(stored):
            examples = ", ".join(str(path) for _, path in missing[:3])
            raise DataError(
                f"{len(missing)} of the {len(stored)} article images the QFF samples use are missing "
                f"({100 * len(missing) / len(stored):.1f}%, more than data.images.max_missing_fraction="
                f"{bound}); tried {examples}. Pools store them relative to data.images.kb_image_root (the "
                f"folder holding full/) or data.root: check those against the ones the pools were mined "
                f"under (or raise the bound)"
            )
        return {"images": len(stored), "missing": len(missing)}

    def needed_images(self, splits: Sequence[str] = ("train", "val")) -> list[str]:
        """Every image id the samples of `splits` can use (query images, pool and rerank article images), sorted."""
        ids: set[str] = set()
        for split in (s for s in splits if s in self.splits()):
            pools = self.pool_file(split)
            s = self.settings
            for ref in self.build_samples(split):
                ids.add(query_image_id(ref.question.dataset_name, ref.question.image_id))
                pool = pools.pool(
                    ref.question, ref.key, gold_sections=s.qff.mining_gold_sections, num_negatives=s.qff.num_negatives
                )
                ids.update(article_image_id(c.image) for c in (pool.positive, *pool.negatives))
                if split == "val":
                    for url in pools.ranking(ref.key)[0][: s.qff.val_top_k]:
                        facts = pools.facts(url)
                        if facts is not None and facts.image is not None:
                            ids.add(article_image_id(facts.image))
        return sorted(ids)

    def feature_cache(self):
        """The ViT feature cache (opened and checked against the samples' images and the ViT), or None."""
        if self.settings.qff.vit_cache is None:
            return None
        if self._feature_cache is None:
            from qkvqa.qff.vit_cache import ViTFeatureCache, image_sources

            self._feature_cache = ViTFeatureCache.open(
                self.settings.qff.vit_cache,
                self.settings.vision_fingerprint,
                self.needed_images(),
                sources=image_sources(self.config),
            )
        return self._feature_cache

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: Optional[str] = None) -> None:
        """Build the kept samples of train (and val when val pools are set) and open the ViT cache."""
        for split in self.splits():
            if split == "val" or stage in (None, "fit"):
                self.build_samples(split)
        if stage in (None, "fit"):
            self.check_article_images()
        self.feature_cache()

    def collator(self) -> QFFCollator:
        """The collate function (picklable: runs in the DataLoader workers)."""
        return QFFCollator(
            self.tokenizer,
            self.settings,
            self.image_paths,
            self.image_loader,
            image_processor=self.image_processor,
            feature_cache=self.feature_cache(),
        )

    def dataset(self, split: str) -> QFFSampleDataset:
        """The sample dataset of `split` (validation samples also carry the rerank candidates)."""
        return QFFSampleDataset(
            self.build_samples(split), self.pool_file(split), self.kb_store(), self.settings, with_rerank=split == "val"
        )

    def train_dataloader(self) -> DataLoader:
        rank, world = rank_and_world(self.trainer)
        dataset = self.dataset("train")
        sampler = EpochTaggedSampler(len(dataset), seed=self.settings.seed, shuffle=True, rank=rank, world_size=world)
        return ResumableDataLoader(
            dataset,
            sampler,
            trainer_batches_done(self.trainer),
            batch_size=self.config.batch_size,
            num_workers=self.config.num_workers,
            collate_fn=self.collator(),
            persistent_workers=False,
        )

    def train_batches_per_epoch(self, world_size: int) -> int:
        """Training batches of one rank per epoch (counted without building the loader: qkvqa.run.steps)."""
        return batches_per_epoch(len(self.build_samples("train")), self.config.batch_size, world_size)

    def val_dataloader(self) -> DataLoader:
        if "val" not in self.splits():
            return []
        rank, world = rank_and_world(self.trainer)
        dataset = self.dataset("val")
        sampler = ResumableSampler(
            len(dataset), seed=self.settings.seed, shuffle=False, rank=rank, world_size=world, pad=False
        )
        return DataLoader(
            dataset,
            sampler=sampler,
            batch_size=self.config.batch_size,
            generator=private_generator(),
            **worker_options(self.config.num_workers),
            collate_fn=self.collator(),
        )

    def test_dataloader(self) -> DataLoader:
        raise NotImplementedError("the QFF DataModule trains; evaluate reranking with `qkvqa rerank`")

    predict_dataloader = test_dataloader

    def sample_report(self) -> dict[str, Any]:
        """Kept and dropped samples per split (setup-time drops of the rule), for the run record."""
        return {
            split: {"kept": r["kept"], "dropped_by_reason": r["dropped_by_reason"]}
            for split, r in self.setup_drops.items()
        }


def settings_from_config(cfg, component, vision_fingerprint: Optional[str] = None) -> QFFDataSettings:
    """QFFDataSettings from a run config (its `qff:` section as the one `QFFConfig`, its seed) and the built QFF
    component (its text limits)."""
    from qkvqa.config.schema import qff_settings

    return QFFDataSettings(
        qff=qff_settings(cfg.qff),
        seed=int(cfg.seed),
        max_text_tokens=component.max_text_tokens,
        question_max_tokens=component.question_max_tokens,
        vision_fingerprint=vision_fingerprint,
    )
