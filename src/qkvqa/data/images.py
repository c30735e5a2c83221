"""Image resolvers (iNaturalist, GLDv2, InfoSeek folders or shards, KB article images) and a loader that counts every
skipped image."""
from __future__ import annotations

import csv
import glob
import io
import json
import os
import stat
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Optional
from urllib.parse import unquote, urlsplit

from PIL import Image

from qkvqa.data.config import ImagesConfig
from qkvqa.data.shards import ShardIndex, shard_paths
from qkvqa.errors import ConfigError, DataError
from qkvqa.utils.io import atomic_write_json
from qkvqa.utils.logging import get_logger, global_rank
from qkvqa.utils.progress import progress

log = get_logger(__name__)

DECODED_CACHE_SIZE = 64          # article images kept decoded between questions
# A query image with a side under this many pixels is a counted skip: a 1-pixel image crashes the
# image processors, and one 3 pixels high is read as channels-first by their layout inference.
MIN_IMAGE_SIDE = 8

LAYOUTS = {"inaturalist": ("id2name", "flat"), "landmarks": ("abc_sharded", "flat"), "infoseek": ("flat",)}
SKIPPED_IMAGES_FILE = "skipped_images.json"
# Individual skips logged as warnings before only the counts are reported.
MAX_LOGGED_SKIPS = 5
# The members of a webdataset sample that hold its image, tried in order.
SHARD_IMAGE_EXTENSIONS = ("img.jpg", "jpg", "jpeg", "png", "img.png")


def _under(root: Optional[str | os.PathLike], path: Optional[str | os.PathLike]) -> Optional[Path]:
    """`path` made absolute against `root` (the DataConfig root) unless it already is."""
    if path is None:
        return None
    path = Path(path).expanduser()
    return path if path.is_absolute() or root is None else Path(root).expanduser() / path


MISSING = "missing"          # the file entry of an image that is not on disk


class QueryImageResolver:
    """Maps (dataset_name, image_id) to candidate files, per the configured layout (data-formats.md section 4)."""

    def __init__(self, config: ImagesConfig, root: Optional[str | os.PathLike] = None):
        self.config = config
        self.roots = {"inaturalist": _under(root, config.inaturalist_root),
                      "landmarks": _under(root, config.landmarks_root),
                      "infoseek": _under(root, config.infoseek_root)}
        self.layouts = {"inaturalist": config.inaturalist_layout, "landmarks": config.landmarks_layout,
                        "infoseek": "flat"}
        for dataset, layout in self.layouts.items():
            if layout not in LAYOUTS[dataset]:
                raise ConfigError(f"data.images.{dataset}_layout: {layout!r} is not one of "
                                  f"{', '.join(LAYOUTS[dataset])}")
        self.id2name_files = [p for p in [_under(root, config.inaturalist_id2name)] if p is not None]
        self.id2name_files += [_under(root, p) for p in config.inaturalist_id2name_extra]
        self._id2name: Optional[dict[str, str]] = None
        self.data_root = root
        self.shard_patterns = {"infoseek": config.infoseek_shards} if config.infoseek_shards else {}
        self._shards: dict[str, ShardIndex] = {}
        self._entries: dict[tuple[str, str], str] = {}    # file_entry, one stat per image and process

    def shards(self, pattern: str | os.PathLike) -> ShardIndex:
        """The index of the webdataset shards of `pattern` (relative to data.root), scanned once per pattern."""
        key = str(_under(self.data_root, pattern))       # questions and images name the same shards once
        if key not in self._shards:
            self._shards[key] = ShardIndex.from_pattern(key)
        return self._shards[key]

    def image_shards(self, dataset_name: str) -> Optional[ShardIndex]:
        """The shards `dataset_name`'s query images are read from (data.images.infoseek_shards), or None."""
        pattern = self.shard_patterns.get(dataset_name)
        return None if pattern is None else self.shards(pattern)

    def shard_member(self, dataset_name: str, image_id: str):
        """The shard member holding `image_id`'s image (the first of SHARD_IMAGE_EXTENSIONS), or None."""
        shards = self.image_shards(dataset_name)
        return next((m for m in (shards.member(image_id, ext) for ext in SHARD_IMAGE_EXTENSIONS) if m), None)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_shards": {}}          # DataLoader workers rescan rather than copy the index

    def _root(self, dataset_name: str) -> Path:
        if dataset_name not in self.roots:
            raise DataError(f"unknown dataset_name {dataset_name!r}; expected one of {', '.join(self.roots)}")
        root = self.roots[dataset_name]
        if root is None:
            raise ConfigError(f"data.images.{dataset_name}_root is not set, but a question uses a {dataset_name} "
                              f"image")
        return root

    def check_images(self, questions, split: str = "") -> dict:
        """Before any work: the image roots exist (`check_roots`) and at most `max_missing_fraction` of the questions'
        images are missing (existence only, no decoding); DataError with the counts and examples otherwise.
        Returns {"questions", "missing", "max_missing_fraction"} for the run's report."""
        self.check_roots(questions)
        missing = []
        for q in progress(questions, desc=f"check images {split}".strip(), unit="question"):
            if self.file_entry(q.dataset_name, q.image_id) == MISSING:
                missing.append(q)
        bound = float(self.config.max_missing_fraction)
        if questions and len(missing) > bound * len(questions):
            examples = ", ".join(f"{q.image_id} ({(self.candidates(q.dataset_name, q.image_id) or ['no path'])[0]})"
                                 if q.dataset_name not in self.shard_patterns else q.image_id for q in missing[:3])
            raise DataError(f"{len(missing)} of {len(questions)} {split} query images are missing "
                            f"({100 * len(missing) / len(questions):.1f}%, more than data.images.max_missing_fraction="
                            f"{bound}), e.g. {examples}: check data.images.*_root and data.root (or raise the bound)")
        return {"questions": len(questions), "missing": len(missing), "max_missing_fraction": bound}

    def check_roots(self, questions) -> None:
        """Before any work: every image root the questions use is set and is a folder (one line naming the
        folder and an example id otherwise; a wrong root would turn every image into a counted skip)."""
        first = {}
        for q in questions:
            first.setdefault(q.dataset_name, q.image_id)
        for dataset_name, image_id in first.items():
            if dataset_name in self.shard_patterns:
                shard_paths(self.shard_patterns[dataset_name], self.data_root)   # DataError naming a missing shard
                continue
            root = self._root(dataset_name)
            if not root.is_dir():
                raise DataError(f"{root}: the {dataset_name} image folder (data.images.{dataset_name}_root) does not "
                                f"exist; questions need it, e.g. image {image_id!r}. Fix the path or data.root")

    def id2name(self) -> dict[str, str]:
        """The merged iNaturalist id -> relative path maps (loaded on first use)."""
        if self._id2name is None:
            if not self.id2name_files:
                raise ConfigError("data.images.inaturalist_id2name is not set, but inaturalist_layout is id2name")
            merged: dict[str, str] = {}
            for path in self.id2name_files:
                try:
                    with open(path, encoding="utf-8") as f:
                        merged.update(json.load(f))
                except FileNotFoundError as e:
                    raise DataError(f"{path}: id2name map not found") from e
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {e.lineno}: malformed JSON ({e.msg})") from e
            self._id2name = merged
        return self._id2name

    def candidates(self, dataset_name: str, image_id: str) -> list[Path]:
        """The files tried for an image, in order; empty for an id the id2name map lacks or too short to shard."""
        root = self._root(dataset_name)
        layout = self.layouts[dataset_name]
        if layout == "id2name":
            name = self.id2name().get(image_id)
            return [] if name is None else [root / name]
        if layout == "abc_sharded":
            if len(image_id) < 3:
                return []
            stem = root / image_id[0] / image_id[1] / image_id[2] / image_id
        else:
            stem = root / image_id
        return [stem.with_name(stem.name + ext) for ext in self.config.extensions]

    def resolve(self, dataset_name: str, image_id: str) -> Optional[Path]:
        """The first existing candidate file, or None."""
        return next((path for path in self.candidates(dataset_name, image_id) if path.is_file()), None)

    def file_entry(self, dataset_name: str, image_id: str) -> str:
        """`path:size:mtime` of an image's file (a shard member: `shard:offset:size`), or MISSING; one stat per image
        and process: the start-up check and the caches' identity (`image_files_checksum`) share it."""
        key = (dataset_name, image_id)
        entry = self._entries.get(key)
        if entry is None:
            if dataset_name in self.shard_patterns:
                member = self.shard_member(dataset_name, image_id)
                entry = MISSING if member is None else f"{member.shard}:{member.offset}:{member.size}"
            else:
                entry = MISSING
                for path in self.candidates(dataset_name, image_id):
                    try:
                        st = path.stat()
                    except OSError:
                        continue
                    if stat.S_ISREG(st.st_mode):
                        entry = f"{path}:{st.st_size}:{st.st_mtime_ns}"
                        break
            self._entries[key] = entry
        return entry


def image_files_checksum(resolver: QueryImageResolver, keys: Iterable[tuple[str, str]]) -> str:
    """sha256 over each (dataset, image id)'s resolved file, size and mtime (one stat per image; shard members by
    their shard position): a query image replaced or mended in place changes it, so a cache keyed on it is not reused."""
    import hashlib

    digest = hashlib.sha256()
    for dataset_name, image_id in keys:
        entry = resolver.file_entry(dataset_name, image_id)
        digest.update(f"{dataset_name}\0{image_id}\0{entry}\n".encode())
    return "sha256:" + digest.hexdigest()


def file_identity(path: Path) -> dict | list:
    """Path, size and mtime of a file; of each shard for a webdataset pattern (`val-{0000..0014}.tar`)."""
    from qkvqa.data.shards import expand_braces, is_shard_pattern

    if is_shard_pattern(path) and not path.is_file():
        return [file_identity(Path(name)) for name in expand_braces(str(path))]
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime": st.st_mtime}


def query_images_identity(data) -> dict:
    """The query-image settings of a DataConfig with each configured file's size and mtime (an id2name map
    that changes, or does not exist, changes the identity); the query-image embeddings and the ViT cache record it."""
    from qkvqa.data.config import resolve_data_path

    images = data.images
    keys = ("inaturalist_root", "inaturalist_layout", "inaturalist_id2name", "inaturalist_id2name_extra",
            "landmarks_root", "landmarks_layout", "infoseek_root", "infoseek_shards", "extensions")
    out = {key: list(getattr(images, key)) if isinstance(getattr(images, key), (list, tuple)) else getattr(images, key)
           for key in keys}
    maps = [images.inaturalist_id2name, *images.inaturalist_id2name_extra]
    files = [resolve_data_path(data, name) for name in maps if name]
    out["id2name_files"] = [file_identity(f) if f.is_file() else {"path": str(f), "missing": True} for f in files]
    if images.infoseek_shards:
        out["infoseek_shard_files"] = file_identity(resolve_data_path(data, images.infoseek_shards))
    return out


@dataclass(frozen=True)
class SkippedImage:
    """An image that could not be used: why, and which file was tried."""

    image_id: str
    dataset_name: str
    reason: str              # missing | corrupt
    path: Optional[str]
    detail: str = ""


class ImageLoader:
    """Loads query images as PIL RGB, or returns None and records the skip (missing, corrupt or too small), never raising.

    Skips are kept per (dataset, image id), so recording the same skip twice (from a DataLoader
    worker's batch and in the main process) counts it once.
    """

    def __init__(self, resolver: QueryImageResolver):
        self.resolver = resolver
        self.skipped: dict[tuple[str, str], SkippedImage] = {}

    def load(self, dataset_name: str, image_id: str) -> Optional[Image.Image]:
        """The query image of `image_id` as RGB, or None (recorded as missing / corrupt)."""
        shards = self.resolver.image_shards(dataset_name)
        if shards is not None:
            return self._load_from_shards(shards, dataset_name, image_id)
        candidates = self.resolver.candidates(dataset_name, image_id)
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            tried = ", ".join(str(p) for p in candidates) or f"nothing: no {self.resolver.layouts[dataset_name]} path"
            self.record(SkippedImage(image_id, dataset_name, "missing", str(candidates[0]) if candidates else None,
                                     f"tried {tried}"))
            return None
        return self.load_file(path, image_id, dataset_name)

    def _load_from_shards(self, shards: ShardIndex, dataset_name: str, image_id: str) -> Optional[Image.Image]:
        member = self.resolver.shard_member(dataset_name, image_id)
        if member is None:
            self.record(SkippedImage(image_id, dataset_name, "missing", None,
                                     f"no {'/'.join(SHARD_IMAGE_EXTENSIONS)} member in the {len(shards.shards)} shards"))
            return None
        return self.load_file(io.BytesIO(shards.read(member)), image_id, dataset_name,
                              where=f"{member.shard}#{image_id}")

    def load_file(self, path: Path | io.BytesIO, image_id: str, dataset_name: str,
                  where: Optional[str] = None) -> Optional[Image.Image]:
        """Open `path` (a file, or bytes named by `where`) as RGB, or None (recorded as corrupt or missing)."""
        where = where or str(path)
        try:
            with Image.open(path) as image:
                if min(image.size) < MIN_IMAGE_SIDE:
                    self.record(SkippedImage(image_id, dataset_name, "too_small", where,
                                             f"{image.size[0]}x{image.size[1]} px; at least {MIN_IMAGE_SIDE} px a side"))
                    return None
                return image.convert("RGB")
        except FileNotFoundError:
            self.record(SkippedImage(image_id, dataset_name, "missing", where))
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
            self.record(SkippedImage(image_id, dataset_name, "corrupt", where, f"{type(e).__name__}: {e}"))
        return None

    def record(self, skip: SkippedImage) -> None:
        """Remember a skip (idempotent per dataset and id); the first few are logged one by one."""
        key = (skip.dataset_name, skip.image_id)
        if key in self.skipped:
            return
        self.skipped[key] = skip
        if len(self.skipped) <= MAX_LOGGED_SKIPS:
            log.warning("skipping %s image %s (%s): %s %s", skip.dataset_name, skip.image_id, skip.reason,
                        skip.path, skip.detail)

    def counts(self) -> dict[str, int]:
        """Number of distinct skipped image ids per reason."""
        counts = {"missing": 0, "corrupt": 0, "too_small": 0}
        for skip in self.skipped.values():
            counts[skip.reason] = counts.get(skip.reason, 0) + 1
        return counts

    def write_skipped(self, run_dir: str | os.PathLike) -> Path:
        """Write the skipped ids to `run_dir/skipped_images.json` (`skipped_images.rank{r}.json` off rank 0)."""
        rank = global_rank()
        name = SKIPPED_IMAGES_FILE if rank == 0 else f"skipped_images.rank{rank}.json"
        path = Path(run_dir) / name
        counts = self.counts()
        skipped = sorted(self.skipped.values(), key=lambda s: (s.dataset_name, s.image_id))
        atomic_write_json(path, {"counts": counts, "skipped": [asdict(s) for s in skipped]})
        log.info("skipped images: %d missing, %d corrupt, %d too small (ids in %s)", counts["missing"], counts["corrupt"],
                 counts["too_small"], path)
        return path


@dataclass(frozen=True)
class ArticleImage:
    """One image of a KB article from the OMGM title -> image CSVs."""

    path: Path
    caption: str
    image_url: str


def _expand_globs(patterns: Iterable[str], root: Optional[str | os.PathLike]) -> list[Path]:
    paths: list[Path] = []
    for pattern in patterns:
        pattern_path = _under(root, pattern)
        matches = sorted(glob.glob(str(pattern_path)))
        if not matches:
            raise DataError(f"{pattern_path}: no title -> image CSV matches")
        paths.extend(Path(m) for m in matches)
    return paths


def url_store_path(store: Path, url: str) -> Path:
    """Where the local pixel store keeps the file of `url`: {store}/{host}/{url path}."""
    parts = urlsplit(url)
    return store / parts.netloc / unquote(parts.path).lstrip("/")


class ArticleImageIndex:
    """KB article images by title (OMGM `get_title2wikiimg`): at most N existing files per title, in CSV order.

    The main image of an article is its first listed image; without one, the KB's `image_urls[0]`
    from the local pixel store; articles that still have none are counted.
    """

    def __init__(self, by_title: dict[str, list[ArticleImage]], url_store: Optional[Path] = None):
        self.by_title = by_title
        self.url_store = url_store
        self.fallback_titles: set[str] = set()
        self.titles_without_image: set[str] = set()
        self.unreadable: set[str] = set()
        self._decoded: OrderedDict[str, Optional[Image.Image]] = OrderedDict()

    @classmethod
    def from_config(cls, config: ImagesConfig, root: Optional[str | os.PathLike] = None) -> "ArticleImageIndex":
        """Read the configured CSVs; `kb_image_root` (or the CSV's folder) is what `img_path` is relative to."""
        csv_paths = _expand_globs(config.kb_image_csvs, root)
        image_root = _under(root, config.kb_image_root)
        return cls.from_csvs(csv_paths, image_root, config.max_images_per_title,
                             _under(root, config.kb_image_url_store))

    @classmethod
    def from_csvs(cls, csv_paths: Iterable[Path], image_root: Optional[Path], max_per_title: int = 10,
                  url_store: Optional[Path] = None) -> "ArticleImageIndex":
        """Keep, per title, the first `max_per_title` rows whose file exists (row[0] title, row[2] img_path)."""
        by_title: dict[str, list[ArticleImage]] = {}
        missing_files = 0
        for csv_path in csv_paths:
            base = image_root if image_root is not None else csv_path.parent
            with open(csv_path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                for row in progress(reader, desc=f"article images {csv_path.name}", unit="row"):
                    if reader.line_num == 1 and len(row) > 2 and row[2] == "img_path":
                        continue
                    if len(row) < 4:
                        raise DataError(f"{csv_path}: line {reader.line_num}: {len(row)} fields; expected title, "
                                        f"image_URL, img_path, caption")
                    title, image_url, img_path, caption = row[0], row[1], row[2], row[3]
                    images = by_title.setdefault(title, [])
                    if len(images) >= max_per_title:
                        continue
                    path = base / img_path
                    if path.is_file():
                        images.append(ArticleImage(path, caption, image_url))
                    else:
                        missing_files += 1
        by_title = {title: images for title, images in by_title.items() if images}
        log.info("article images: %d titles with images; %d listed files missing on disk", len(by_title),
                 missing_files)
        return cls(by_title, url_store)

    def images(self, title: str) -> list[ArticleImage]:
        """The kept images of `title`, in CSV order (may be empty)."""
        return self.by_title.get(title, [])

    def main_image(self, title: str, image_urls: Iterable[str] = ()) -> Optional[Path]:
        """The article's main image file, or None (counted in `titles_without_image`)."""
        images = self.by_title.get(title)
        if images:
            return images[0].path
        first_url = next(iter(image_urls), None)
        if self.url_store is not None and first_url is not None:
            path = url_store_path(self.url_store, first_url)
            if path.is_file():
                self.fallback_titles.add(title)
                return path
        self.titles_without_image.add(title)
        return None

    def load_main_image(self, title: str, image_urls: Iterable[str] = ()) -> Optional[Image.Image]:
        """The article's main image decoded as RGB (the last DECODED_CACHE_SIZE are kept: the top-20 articles
        of successive questions overlap), or None when it has none or its file is unreadable (counted)."""
        path = self.main_image(title, image_urls)
        if path is None:
            return None
        key = str(path)
        if key in self._decoded:
            self._decoded.move_to_end(key)
            return self._decoded[key]
        try:
            with Image.open(path) as image:
                loaded: Optional[Image.Image] = image.convert("RGB")
        except (OSError, ValueError) as e:
            log.warning("article image %s of %r unreadable (%s); the article is used as one without image",
                        path, title, e)
            self.unreadable.add(key)
            loaded = None
        self._decoded[key] = loaded
        if len(self._decoded) > DECODED_CACHE_SIZE:
            self._decoded.popitem(last=False)
        return loaded

    def coverage(self) -> dict[str, int]:
        """Counts for the run record: titles with CSV images, fallbacks used, titles without any image."""
        return {"titles_with_csv_images": len(self.by_title), "fallback_to_url_store": len(self.fallback_titles),
                "titles_without_image": len(self.titles_without_image), "unreadable_images": len(self.unreadable)}
