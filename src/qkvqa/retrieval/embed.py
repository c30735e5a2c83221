"""Resumable embedding shard sets: KB article texts, KB images and query images, written shard by shard, atomically.

A set lives in `{embed_root}/{name}-{fingerprint}/` (`name` = kb_text, kb_images or
query_images-{split}; the fingerprint hashes everything the vectors depend on: encoder identity,
KB URL checksum or question file, text source, dtype, shard size):

    manifest.json            what the set holds (written first; same content from every process)
    shard-00000.npy          float16/float32 [n, dim] unit vectors (written to a temp file, then renamed)
    shard-00000.ids.json     one id per vector: KB row (kb_text), [KB row, image_url] (kb_images),
                             [dataset_name, image_id] (query_images)
    shard-00000.done.json    written last: count, dim, sha256 and size of the .npy, skipped images, text fallbacks

Shard i covers source rows [i * shard_size, (i + 1) * shard_size): KB rows in KB order for the KB
sets, unique query images (first appearance in the split's question order) for the query sets. A
shard counts as done only when its done record exists and the .npy matches its size and sha256, so
a rerun recomputes exactly the shards that are missing, partial or corrupt. Several processes (one
per GPU) split the shards with `shard_index` / `num_shards` (process p takes shards i with
i % num_shards == p).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from qkvqa.data.kb import kb_content  # noqa: F401 (re-exported: the index and the evaluation read it here too)
from qkvqa.errors import ConfigError, DataError, StaleArtifactError
from qkvqa.utils.io import atomic_write_json, read_json, sha256_file
from qkvqa.utils.logging import get_logger
from qkvqa.utils.own_files import check_own_dir, refuse_link
from qkvqa.utils.progress import progress

log = get_logger(__name__)

SET_FORMAT = 1
MODES = ("image_to_summary", "image_to_image")
SET_KINDS = ("kb_text", "kb_images", "query_images")
EMBED_TARGETS = ("kb",) + SET_KINDS
SUMMARY_SOURCES = ("lead_section", "summaries")
SHARD_DTYPES = ("float16", "float32")
KB_IMAGE_DATASET = "kb"  # dataset_name of KB images in skip records


def check_mode(mode: str) -> str:
    """`mode` if it is a retrieval mode, else a ConfigError."""
    if mode not in MODES:
        raise ConfigError(f"retrieval.mode must be one of {list(MODES)}, got {mode!r}")
    return mode


def kb_set_kind(mode: str) -> str:
    """The KB embedding set a mode indexes: kb_text (image_to_summary) or kb_images (image_to_image)."""
    return "kb_text" if check_mode(mode) == "image_to_summary" else "kb_images"


def embed_root(cfg) -> Path:
    """Root directory of the embedding sets: retrieval.embed_dir, else {paths.cache_dir}/embeddings."""
    return Path(cfg.retrieval.embed_dir or Path(cfg.paths.cache_dir) / "embeddings").expanduser()


# --------------------------------------------------------------------------------------------- sources


@dataclass
class _Item:
    """One thing to embed: its id in the shard's id map and what to load (a text, or candidate image files)."""

    id: Any
    text: Optional[str] = None
    candidates: tuple = ()  # image files tried in order
    dataset_name: str = ""
    image_id: str = ""


class KBTextSource:
    """One text per KB article: the lead section (`section_texts[0]`, the title when empty) or its summary."""

    def __init__(self, store, summary_source: str, summaries_path: Optional[Path]):
        if summary_source not in SUMMARY_SOURCES:
            raise ConfigError(
                f"retrieval.summary_source must be one of {list(SUMMARY_SOURCES)}, got {summary_source!r}"
            )
        if summary_source == "summaries" and summaries_path is None:
            raise ConfigError(
                "retrieval.summary_source=summaries needs retrieval.summaries (the JSONL written by "
                "`qkvqa summarize`); or use retrieval.summary_source=lead_section"
            )
        self.store = store
        self.summary_source = summary_source
        self.summaries_path = summaries_path
        self._summaries: Optional[dict[int, str]] = None

    @property
    def rows(self) -> int:
        return len(self.store)

    def identity(self) -> dict:
        out = {
            "kb_url_checksum": self.store.url_checksum,
            "kb_articles": len(self.store),
            "kb_content": kb_content(self.store),  # text edited under the same URLs: other vectors (issue 44)
            "summary_source": self.summary_source,
        }
        if self.summary_source == "summaries":
            out["summaries"] = {"path": str(self.summaries_path), "sha256": sha256_file(self.summaries_path)}
        return out

    def summaries(self) -> dict[int, str]:
        """Row -> summary from the JSONL (`{"url" or "row_id", "summary"}` per line); read on first use."""
        if self._summaries is None:
            if not self.summaries_path.is_file():
                raise DataError(f"{self.summaries_path}: summaries file not found (retrieval.summaries)")
            summaries: dict[int, str] = {}
            with open(self.summaries_path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{self.summaries_path}: line {lineno}: malformed JSON ({e.msg})") from e
                    if not isinstance(obj, dict) or not isinstance(obj.get("summary"), str):
                        raise DataError(
                            f"{self.summaries_path}: line {lineno}: field 'summary': missing or not a string"
                        )
                    try:
                        row = int(obj["row_id"]) if "row_id" in obj else self.store.row_of(obj["url"])
                    except KeyError as e:
                        raise DataError(f"{self.summaries_path}: line {lineno}: field 'url': {e.args[0]}") from e
                    summaries[row] = obj["summary"]
            self._summaries = summaries
        return self._summaries

    def items(self, start: int, stop: int, counts: dict) -> list[_Item]:
        """Items of rows [start, stop); fallbacks are counted in `counts`."""
        summaries = self.summaries() if self.summary_source == "summaries" else {}
        items = []
        for article in self.store.get_many(range(start, stop)):
            text = summaries.get(article.row_id)
            if text is None and self.summary_source == "summaries":
                counts["lead_for_missing_summary"] = counts.get("lead_for_missing_summary", 0) + 1
            if text is None:
                text = article.section_texts[0] if article.section_texts else ""
                if not text.strip():
                    counts["title_for_empty_lead"] = counts.get("title_for_empty_lead", 0) + 1
                    text = article.title
            items.append(_Item(id=article.row_id, text=text))
        return items


# Texts embedded in place of a missing one (counted per shard, not skipped): an article without a summary embeds
# its lead section, one with an empty lead its title.
FALLBACK_COUNTS = ("lead_for_missing_summary", "title_for_empty_lead")


class KBImageSource:
    """Every `image_urls` entry of every KB article (EchoSight: one vector per KB image). Its file is the
    title -> image CSV file with that image_URL, else the local URL store's copy; neither = a counted skip."""

    def __init__(
        self,
        store,
        article_images: Optional[Callable[[], Any]],
        url_store: Optional[Path],
        max_per_article: Optional[int],
        images_config: dict,
    ):
        self.store = store
        self.article_images = article_images  # loads the ArticleImageIndex on first use (None: no CSVs)
        self.url_store = url_store
        self.max_per_article = max_per_article
        self.images_config = images_config
        self._files: Optional[str] = None

    @property
    def rows(self) -> int:
        return len(self.store)

    def identity(self) -> dict:
        if self._files is None:
            self._files = self.image_files_checksum()
        return {
            "kb_url_checksum": self.store.url_checksum,
            "kb_articles": len(self.store),
            "kb_content": kb_content(self.store),
            "max_images_per_article": self.max_per_article,
            "images": self.images_config,
            "image_files": self._files,  # an image replaced in place: other vectors (issue 44)
        }

    def image_files_checksum(self, block: int = 4096) -> str:
        """sha256 over every article image's candidate files with their size and mtime (one stat per file, once per
        process): a KB image replaced in place changes it, so its set is not reused."""
        digest = hashlib.sha256()
        counts: dict = {}
        for start in range(0, self.rows, block):
            for item in self.items(start, min(start + block, self.rows), counts):
                digest.update(json.dumps(item.id, ensure_ascii=False).encode() + b"\0")
                for path in item.candidates:
                    try:
                        st = os.stat(path)
                        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
                    except OSError:
                        digest.update(f"{path}\0missing\n".encode())
        return "sha256:" + digest.hexdigest()

    def items(self, start: int, stop: int, counts: dict) -> list[_Item]:
        from qkvqa.data.images import inside_root, url_store_path

        article_images = self.article_images() if self.article_images is not None else None
        items = []
        for article in self.store.get_many(range(start, stop)):
            urls = article.image_urls[: self.max_per_article]
            if not urls:
                counts["articles_without_image_urls"] = counts.get("articles_without_image_urls", 0) + 1
            csv_files = (
                {image.image_url: image.path for image in article_images.images(article.title)}
                if article_images is not None
                else {}
            )
            for url in urls:
                candidates = [csv_files[url]] if url in csv_files else []
                if self.url_store is not None:
                    stored = url_store_path(self.url_store, url)
                    if inside_root(self.url_store, stored):  # a URL path with `..` is never followed
                        candidates.append(stored)
                items.append(
                    _Item(
                        id=[article.row_id, url],
                        candidates=tuple(candidates),
                        dataset_name=KB_IMAGE_DATASET,
                        image_id=url,
                    )
                )
        return items


class QueryImageSource:
    """The unique query images of a split's questions, in first-appearance order."""

    def __init__(
        self,
        questions: Sequence[Any],
        questions_file: Optional[Path],
        split: str,
        data_identity: dict,
        resolver: Any = None,
    ):
        self.keys = list(dict.fromkeys((q.dataset_name, q.image_id) for q in questions))
        self.questions_file = questions_file
        self.split = split
        self.data_identity = data_identity
        self.resolver = resolver
        self._identity: Optional[dict] = None

    @property
    def rows(self) -> int:
        return len(self.keys)

    def identity(self) -> dict:
        """What the rows depend on, down to each image file's size and mtime (computed once: one stat per image)."""
        from qkvqa.data.images import file_identity, image_files_checksum

        if self._identity is None:
            files = image_files_checksum(self.resolver, self.keys) if self.resolver is not None else None
            self._identity = {
                "split": self.split,
                "unique_images": len(self.keys),
                "image_files": files,
                "questions": file_identity(self.questions_file) if self.questions_file else None,
                **self.data_identity,
            }
        return self._identity

    def items(self, start: int, stop: int, counts: dict) -> list[_Item]:
        return [_Item(id=list(key), dataset_name=key[0], image_id=key[1]) for key in self.keys[start:stop]]


# ----------------------------------------------------------------------------------------- the set


def non_finite_rows(vectors: np.ndarray) -> np.ndarray:
    """The rows of `vectors` (one vector, or one per row) that hold NaN or Inf; empty when all are finite."""
    if not vectors.size:
        return np.zeros(0, dtype=np.int64)
    finite = np.isfinite(vectors).all(axis=1) if vectors.ndim == 2 else np.isfinite(vectors)
    return np.flatnonzero(~finite)


def check_finite(vectors: np.ndarray, ids: Sequence[Any], where: str) -> None:
    """DataError naming `where`, the first bad row and its id when a vector holds NaN or Inf (in the stored dtype: a
    float32 value beyond float16's range is Inf there); such a row would rank in faiss as nothing else does."""
    bad = non_finite_rows(vectors)
    if len(bad):
        raise DataError(
            f"{where}: {len(bad)} of {len(vectors)} vectors hold NaN or Inf (first: row {int(bad[0])}, id "
            f"{json.dumps(ids[int(bad[0])]) if len(ids) > bad[0] else '?'}); not written. The encoder "
            f"produced them (a half-precision overflow, a broken image or weights): fix that and rerun"
        )


def _save_npy_atomic(path: Path, array: np.ndarray) -> None:
    from qkvqa.utils.io import atomic_write

    atomic_write(path, lambda f: np.save(f, array))


@dataclass
class EmbeddingSet:
    """A shard set directory (see the module docstring)."""

    path: Path
    manifest: dict

    @classmethod
    def open(cls, path: str | os.PathLike) -> "EmbeddingSet":
        """Open an existing set; DataError when it has no manifest."""
        path = Path(path)
        if not refuse_link(path / "manifest.json").is_file():  # a link planted in a shared cache is never followed
            raise DataError(f"{path}: not an embedding set (no manifest.json); write it with `qkvqa embed`")
        return cls(path, read_json(path / "manifest.json"))

    @classmethod
    def create(cls, path: str | os.PathLike, description: dict, n_rows: int) -> "EmbeddingSet":
        """Start a set at `path` for `n_rows` source rows; `description` needs at least `what`, `encoder`,
        `dtype` and `shard_size` (plus `source` with the KB checksum for KB sets). Also how precomputed
        vectors (e.g. an EchoSight feature pickle) are imported: create, then `write_shard` each block."""
        size = int(description["shard_size"])
        manifest = {
            **description,
            "n_rows": int(n_rows),
            "n_shards": (int(n_rows) + size - 1) // size,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        atomic_write_json(Path(path) / "manifest.json", manifest)
        return cls(Path(path), manifest)

    def write_shard(
        self,
        i: int,
        vectors: np.ndarray,
        ids: Sequence[Any],
        *,
        skipped: Sequence[dict] = (),
        counts: Optional[dict] = None,
        preprocess: Optional[dict] = None,
        seconds: float = 0.0,
    ) -> dict:
        """Write shard i: the .npy (cast to the set's dtype) and the id map atomically, then its done record."""
        if len(vectors) != len(ids):
            raise ValueError(f"shard {i}: {len(vectors)} vectors but {len(ids)} ids")
        with np.errstate(over="ignore"):  # a value beyond float16's range becomes Inf: refused below
            array = np.asarray(vectors).astype(self.manifest["dtype"])
        check_finite(array, ids, f"{self.shard_file(i, '.npy')}")
        npy = self.shard_file(i, ".npy")
        _save_npy_atomic(npy, array)
        atomic_write_json(self.shard_file(i, ".ids.json"), list(ids), indent=None)
        start, stop = self.shard_rows(i)
        record = {
            "shard": i,
            "rows": [start, stop],
            "count": len(array),
            "dim": int(array.shape[1]),
            "dtype": str(array.dtype),
            "bytes": npy.stat().st_size,
            "sha256": sha256_file(npy),
            "preprocess": preprocess,
            "skipped": list(skipped),
            "counts": counts or {},
            "seconds": round(seconds, 3),
        }
        atomic_write_json(self.shard_file(i, ".done.json"), record)
        return record

    @property
    def kind(self) -> str:
        return self.manifest["what"]

    @property
    def n_shards(self) -> int:
        return int(self.manifest["n_shards"])

    def shard_file(self, i: int, suffix: str) -> Path:
        """`shard-{i:05d}{suffix}` in the set (suffix .npy, .ids.json or .done.json)."""
        return self.path / f"shard-{i:05d}{suffix}"

    def shard_rows(self, i: int) -> tuple[int, int]:
        """The source rows [start, stop) of shard i."""
        size = int(self.manifest["shard_size"])
        return i * size, min((i + 1) * size, int(self.manifest["n_rows"]))

    def done_record(self, i: int, verify: bool = True) -> Optional[dict]:
        """The done record of shard i when the shard is complete and intact (size and sha256 checked), else None."""
        done_path, npy = self.shard_file(i, ".done.json"), self.shard_file(i, ".npy")
        if not done_path.is_file() or not npy.is_file() or not self.shard_file(i, ".ids.json").is_file():
            return None
        try:
            record = read_json(done_path)
        except ValueError:
            return None
        if npy.stat().st_size != record.get("bytes") or (verify and sha256_file(npy) != record.get("sha256")):
            return None
        return record

    def done_records(self, verify: bool = True) -> dict[int, dict]:
        """Done records of every intact shard."""
        records = {}
        for i in range(self.n_shards):
            record = self.done_record(i, verify)
            if record is not None:
                records[i] = record
        return records

    def pending(self, verify: bool = True) -> list[int]:
        """Shards still to compute (missing, partial or corrupt)."""
        return [i for i in range(self.n_shards) if self.done_record(i, verify) is None]

    def require_complete(self, hint: str) -> dict[int, dict]:
        """Every shard's done record; StaleArtifactError naming the missing shards otherwise."""
        records = self.done_records()
        missing = [i for i in range(self.n_shards) if i not in records]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            raise StaleArtifactError(
                f"embedding set {self.path} is incomplete: {len(missing)} of {self.n_shards} "
                f"shards missing or corrupt ({shown}); finish it with `{hint}`"
            )
        return records

    def dim(self, records: dict[int, dict]) -> Optional[int]:
        """The vector size (None for a set without vectors)."""
        return next((int(r["dim"]) for r in records.values() if r.get("dim")), None)

    def shard(self, i: int, mmap: bool = True) -> tuple[np.ndarray, list]:
        """(vectors, ids) of shard i; vectors memory-mapped by default."""
        vectors = np.load(self.shard_file(i, ".npy"), mmap_mode="r" if mmap else None)
        ids = read_json(self.shard_file(i, ".ids.json"))
        if len(ids) != len(vectors):
            raise StaleArtifactError(
                f"{self.shard_file(i, '.ids.json')}: {len(ids)} ids for {len(vectors)} vectors; "
                "delete the shard's files and rerun `qkvqa embed`"
            )
        return vectors, ids

    def iter_shards(self) -> Iterator[tuple[int, np.ndarray, list]]:
        """(i, vectors, ids) of every shard in order."""
        for i in range(self.n_shards):
            vectors, ids = self.shard(i)
            yield i, vectors, ids

    def load_all(self) -> tuple[np.ndarray, list]:
        """Every vector (float32, in memory) and id, in shard order: for small sets such as query images."""
        vectors, ids = [], []
        for _, v, i in self.iter_shards():
            vectors.append(np.asarray(v, dtype=np.float32))
            ids.extend(i)
        dim = self.dim(self.done_records(verify=False)) or 0
        return (np.concatenate(vectors) if vectors else np.zeros((0, dim), np.float32)), ids

    def skipped(self, records: Optional[dict[int, dict]] = None) -> list[dict]:
        """Skipped images of every done shard."""
        records = self.done_records(verify=False) if records is None else records
        return [skip for i in sorted(records) for skip in records[i].get("skipped", [])]

    def skipped_and_fallbacks(self, records: Optional[dict[int, dict]] = None) -> tuple[dict[str, int], dict[str, int]]:
        """`counts` without the vectors, split into what was left out (images by reason, articles without image
        URLs) and what was embedded in place of a missing text (FALLBACK_COUNTS)."""
        counts = self.counts(records)
        del counts["vectors"]
        fallbacks = {k: counts.pop(k) for k in FALLBACK_COUNTS if k in counts}
        return counts, fallbacks

    def counts(self, records: Optional[dict[int, dict]] = None) -> dict[str, int]:
        """Vectors, skipped images by reason and text/image fallbacks summed over the done shards."""
        records = self.done_records(verify=False) if records is None else records
        out = {"vectors": sum(int(r["count"]) for r in records.values()), "missing_images": 0, "corrupt_images": 0}
        for record in records.values():
            for skip in record.get("skipped", []):
                out[f"{skip['reason']}_images"] = out.get(f"{skip['reason']}_images", 0) + 1
            for key, value in record.get("counts", {}).items():
                out[key] = out.get(key, 0) + value
        return out


# ----------------------------------------------------------------------------- image loading in workers


class _ImageItems:
    """Map-style dataset over image items: (position, pixels [3,S,S] or None, skip record or None)."""

    def __init__(self, items: list[_Item], preprocess, query_loader):
        from qkvqa.data.images import ImageLoader

        self.items = items
        self.preprocess = preprocess
        self.query_loader = query_loader
        self.kb_loader = ImageLoader(None)  # KB files are resolved here, not by a query resolver

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, position: int):
        from qkvqa.data.images import SkippedImage

        item = self.items[position]
        if item.dataset_name == KB_IMAGE_DATASET:
            loader = self.kb_loader
            path = next((p for p in item.candidates if Path(p).is_file()), None)
            if path is None:
                tried = ", ".join(map(str, item.candidates)) or "no CSV image and no url store configured"
                loader.record(
                    SkippedImage(
                        item.image_id,
                        KB_IMAGE_DATASET,
                        "missing",
                        str(item.candidates[0]) if item.candidates else None,
                        f"tried {tried}",
                    )
                )
                image = None
            else:
                image = loader.load_file(Path(path), item.image_id, KB_IMAGE_DATASET)
        else:
            loader = self.query_loader
            image = loader.load(item.dataset_name, item.image_id)
        if image is None:
            return position, None, asdict(loader.skipped[(item.dataset_name, item.image_id)])
        return position, self.preprocess.one(image), None


def _collate(batch):
    return batch


def _image_batches(items: list[_Item], preprocess, query_loader, batch_size: int, num_workers: int):
    """Yield lists of (position, pixels or None, skip or None), decoded in DataLoader workers."""
    from torch.utils.data import DataLoader

    loader = DataLoader(
        _ImageItems(items, preprocess, query_loader),
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        collate_fn=_collate,
    )
    yield from loader


# ------------------------------------------------------------------------------------------ embedding


@dataclass
class EmbedReport:
    """What one `embed_set` call did."""

    set: EmbeddingSet
    computed: list[int] = field(default_factory=list)  # shards computed now
    reused: list[int] = field(default_factory=list)  # shards already done (this process's share)
    pending: list[int] = field(default_factory=list)  # shards still missing afterwards (all processes)
    seconds: float = 0.0

    def summary(self) -> dict:
        """Flat counts for the run record."""
        counts = self.set.counts()
        return {
            "set": str(self.set.path),
            "what": self.set.kind,
            "shards_total": self.set.n_shards,
            "shards_computed": len(self.computed),
            "shards_reused": len(self.reused),
            "shards_pending": len(self.pending),
            "seconds": round(self.seconds, 2),
            **counts,
        }


class Embedder:
    """Plans and fills one embedding set from a config (see `embed_set`)."""

    def __init__(self, cfg, kind: str, split: Optional[str] = None, *, benchmark):
        if kind not in SET_KINDS:
            raise ConfigError(f"embedding target must be one of {list(EMBED_TARGETS)}, got {kind!r}")
        if cfg.retrieval.embed_dtype not in SHARD_DTYPES:
            raise ConfigError(
                f"retrieval.embed_dtype must be one of {list(SHARD_DTYPES)}, got {cfg.retrieval.embed_dtype!r}"
            )
        if cfg.retrieval.shard_size < 1:
            raise ConfigError(f"retrieval.shard_size must be >= 1, got {cfg.retrieval.shard_size}")
        self.cfg = cfg
        self.kind = kind
        self.split = split or cfg.retrieval.split
        self.benchmark = benchmark  # a qkvqa.data.benchmark.Benchmark (or a DataModule holding one)
        self.encoder_spec = cfg.components.text_encoder if kind == "kb_text" else cfg.components.image_encoder
        self.source = self._source()

    def _source(self):
        from qkvqa.data.config import reads_two_hop, resolve_data_path
        from qkvqa.data.images import query_images_identity

        data = self.benchmark.config
        if self.kind == "kb_text":
            summaries = Path(self.cfg.retrieval.summaries).expanduser() if self.cfg.retrieval.summaries else None
            return KBTextSource(self.benchmark.kb_store(), self.cfg.retrieval.summary_source, summaries)
        if self.kind == "kb_images":
            images = data.images
            article_images = self.benchmark.article_images if images.kb_image_csvs else None
            url_store = resolve_data_path(data, images.kb_image_url_store)
            if article_images is None and url_store is None:
                raise ConfigError(
                    "KB image embedding needs data.images.kb_image_csvs (OMGM title -> image CSVs) "
                    "and/or data.images.kb_image_url_store (local copies of the KB image_urls)"
                )
            images_identity = {
                "csvs": list(images.kb_image_csvs),
                "root": images.kb_image_root,
                "url_store": images.kb_image_url_store,
                "max_per_title": images.max_images_per_title,
            }
            return KBImageSource(
                self.benchmark.kb_store(),
                article_images,
                url_store,
                self.cfg.retrieval.max_images_per_article,
                images_identity,
            )
        questions = self.benchmark.questions(self.split)
        # every input that decides which pixels a row holds: the question set and where its images are read
        # from (a wrong landmarks root once left a set of skips that a fixed config then reused)
        data_identity = {
            "dataset": data.dataset,
            "max_questions": data.max_questions,
            "sample_questions": data.sample_questions,
            "sample_seed": data.sample_seed,
            "include_two_hop": reads_two_hop(data, evaluation=False),
            "root": data.root,
            "images": query_images_identity(data),
        }
        return QueryImageSource(
            questions,
            self.benchmark.path(f"{self.split}_questions"),
            self.split,
            data_identity,
            self.benchmark.image_loader.resolver,
        )

    def description(self) -> dict:
        """Everything the vectors depend on (hashed into the set's directory name)."""
        from qkvqa.retrieval.encoders import encoder_identity

        return {
            "format": SET_FORMAT,
            "what": self.kind,
            "encoder": encoder_identity(self.encoder_spec),
            "dtype": self.cfg.retrieval.embed_dtype,
            "shard_size": int(self.cfg.retrieval.shard_size),
            "source": self.source.identity(),
        }

    def set_path(self) -> Path:
        """`{embed_root}/{name}-{fingerprint}`."""
        description = self.description()
        digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:12]
        name = self.kind if self.kind != "query_images" else f"query_images-{self.split}"
        return embed_root(self.cfg) / f"{name}-{digest}"

    def open_or_create(self) -> EmbeddingSet:
        """The set of this config, with its manifest written if it is new."""
        path = self.set_path()
        check_own_dir(path, "embedding set", "remove it, or use a retrieval.embed_dir / paths.cache_dir of your own")
        if refuse_link(path / "manifest.json").is_file():
            return EmbeddingSet.open(path)
        return EmbeddingSet.create(path, self.description(), self.source.rows)

    def run(
        self, encoder=None, shard_index: int = 0, num_shards: int = 1, max_shards: Optional[int] = None
    ) -> EmbedReport:
        """Compute this process's missing shards (at most `max_shards`); the encoder is built only if needed."""
        if not 0 <= shard_index < num_shards:
            raise ConfigError(f"--shard-index must be in [0, {num_shards}), got {shard_index}")
        started = time.time()
        emb = self.open_or_create()
        mine = [i for i in range(emb.n_shards) if i % num_shards == shard_index]
        todo = [i for i in mine if emb.done_record(i) is None]
        report = EmbedReport(emb, reused=[i for i in mine if i not in todo])
        if max_shards is not None:
            todo = todo[:max_shards]
        if todo:
            log.info("embedding %s: %d of %d shards to compute in %s", self.kind, len(todo), emb.n_shards, emb.path)
        if todo:
            self.check_sources(emb, todo)
        if todo and encoder is None:
            encoder = _build_encoder(self.encoder_spec)
        if todo and encoder.identity != emb.manifest["encoder"]:
            raise ConfigError(
                f"the encoder passed in ({encoder.identity}) is not the one the config names for "
                f"{self.kind} ({emb.manifest['encoder']})"
            )
        for n, i in enumerate(todo, 1):
            self._embed_shard(emb, i, encoder, f"{n}/{len(todo)}")
            report.computed.append(i)
        report.pending = emb.pending(verify=False)
        report.seconds = time.time() - started
        if not report.pending:
            counts = emb.counts()
            if not counts["vectors"]:
                skipped = {k: v for k, v in counts.items() if k != "vectors" and v}
                raise DataError(
                    f"embedding set {emb.path} is complete but holds 0 vectors (of {emb.manifest['n_rows']} "
                    f"source rows; skipped: {skipped or 'none'}): nothing to index. Every {self.kind} item "
                    f"was skipped; see skipped_images.json, fix the image paths and rerun"
                )
        return report

    def check_sources(self, emb: EmbeddingSet, shards: Sequence[int]) -> dict:
        """Before the encoder is built: the images the shards need are there. Query images: the split's bound
        (`QueryImageResolver.check_images`). KB images: the title -> image CSVs' own bound (`article_images`), then
        at most data.images.max_missing_fraction of the shards' KB images without a file; DataError with the counts
        and the first paths tried otherwise. Returns {"images", "missing"} (empty for texts)."""
        if self.kind == "query_images":
            self.benchmark.image_loader.resolver.check_images(self.benchmark.questions(self.split), self.split)
            return {}
        if self.kind != "kb_images":
            return {}
        total, missing, examples = 0, 0, []
        for i in shards:
            start, stop = emb.shard_rows(i)
            for item in self.source.items(start, stop, {}):
                total += 1
                if not any(Path(p).is_file() for p in item.candidates):
                    missing += 1
                    if len(examples) < 3:
                        tried = ", ".join(map(str, item.candidates)) or "no CSV row with this image_URL, no url store"
                        examples.append(f"{item.image_id} ({tried})")
        bound = float(self.benchmark.config.images.max_missing_fraction)
        if total and missing > bound * total:
            raise DataError(
                f"{missing} of {total} KB images to embed have no file ({100 * missing / total:.1f}%, more "
                f"than data.images.max_missing_fraction={bound}); tried e.g. {'; '.join(examples)}. A KB image "
                f"is the title -> image CSV row with its image_URL (under data.images.kb_image_root, the "
                f"folder holding full/) or data.images.kb_image_url_store/HOST/PATH: fix those or data.root "
                f"(or raise the bound)"
            )
        return {"images": total, "missing": missing}

    def _embed_shard(self, emb: EmbeddingSet, i: int, encoder, position: str) -> None:
        started = time.time()
        start, stop = emb.shard_rows(i)
        counts: dict[str, int] = {}
        items = self.source.items(start, stop, counts)
        desc = f"embed {self.kind} shard {i} ({position})"
        skipped: list[dict] = []
        step = max(1, int(self.cfg.retrieval.embed_batch_size))
        if self.kind == "kb_text":
            vectors = []
            with progress(total=len(items), desc=desc, unit="text") as bar:
                for s in range(0, len(items), step):
                    vectors.append(encoder.embed_texts([item.text for item in items[s : s + step]]))
                    bar.update(len(items[s : s + step]))
            kept = items
        else:
            vectors, kept = [], []
            with progress(total=len(items), desc=desc, unit="img") as bar:
                for batch in _image_batches(
                    items, encoder.preprocess, self.benchmark.image_loader, step, int(self.benchmark.config.num_workers)
                ):
                    good = [(pos, pixels) for pos, pixels, _ in batch if pixels is not None]
                    skipped.extend(skip for _, pixels, skip in batch if pixels is None)
                    if good:
                        vectors.append(encoder.embed_pixels(np.stack([pixels for _, pixels in good])))
                        kept.extend(items[pos] for pos, _ in good)
                    bar.update(len(batch))
        array = np.concatenate(vectors) if vectors else np.zeros((0, encoder.dim), np.float32)
        emb.write_shard(
            i,
            array,
            [item.id for item in kept],
            skipped=skipped,
            counts=counts,
            preprocess=encoder.preprocess.describe(),
            seconds=time.time() - started,
        )
        if skipped:
            log.warning(
                "shard %d: %d images skipped (%s)",
                i,
                len(skipped),
                ", ".join(f"{s['reason']} {s['image_id']}" for s in skipped[:3]) + (" ..." if len(skipped) > 3 else ""),
            )


def _build_encoder(spec):
    from qkvqa.components.registry import build_component

    return build_component(spec)


def embed_set(
    cfg,
    kind: str,
    *,
    benchmark,
    split: Optional[str] = None,
    encoder=None,
    shard_index: int = 0,
    num_shards: int = 1,
    max_shards: Optional[int] = None,
) -> EmbedReport:
    """Fill the embedding set `kind` (kb_text | kb_images | query_images) of `cfg` over `benchmark` (its KB
    store, article images, questions), resuming finished shards.

    `encoder` is reused when given (the pipeline and the QFF trainer pass theirs); otherwise the
    config's components.text_encoder (kb_text) or components.image_encoder is built, and only when a
    shard is left to compute. `split` (query_images) defaults to retrieval.split.
    """
    return Embedder(cfg, kind, split, benchmark=benchmark).run(encoder, shard_index, num_shards, max_shards)


def resolve_target(cfg, target: Optional[str] = None) -> str:
    """The set kind of an `embed` target: `kb` means the KB side of retrieval.mode."""
    target = target or cfg.retrieval.embed_what
    if target not in EMBED_TARGETS:
        raise ConfigError(f"retrieval.embed_what must be one of {list(EMBED_TARGETS)}, got {target!r}")
    return kb_set_kind(cfg.retrieval.mode) if target == "kb" else target


def write_skipped_images(run_dir: str | os.PathLike, skips: Sequence[dict]) -> Path:
    """Write the skipped images of a set (all shards, earlier runs' included) to run_dir/skipped_images.json."""
    from qkvqa.data.images import ImageLoader, SkippedImage

    loader = ImageLoader(None)
    for skip in skips:
        loader.skipped[(skip["dataset_name"], skip["image_id"])] = SkippedImage(**skip)
    return loader.write_skipped(run_dir)
