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
from qkvqa.utils.io import atomic_write_json, path_within, real_path_within
from qkvqa.utils.logging import get_logger, global_rank
from qkvqa.utils.progress import progress

log = get_logger(__name__)

DECODED_CACHE_SIZE = 64  # article images kept decoded between questions
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


MISSING = "missing"  # the file entry of an image that is not on disk
OUTSIDE_ROOT = "outside_root"  # the skip reason of an image path that leaves its configured root
# What decoding does to pixels (`to_rgb`): part of every query-image identity, so a cache of images decoded the old
# way is not reused. 2: EXIF orientation applied, 16-bit and float modes scaled, alpha composited on white.
IMAGE_DECODE_VERSION = 2


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as 8-bit RGB, faithfully: EXIF orientation applied, 16-bit / 32-bit grey scaled to 0-255 (PIL's
    `convert("RGB")` clips them, so a 16-bit PNG turned all white), palette and alpha modes composited on white,
    CMYK and the rest through PIL's conversion.

    An RGB image is decoded once and returned as it is, turned in place when its EXIF says so: `exif_transpose`
    returned a copy even with nothing to turn, and `convert("RGB")` another, so a 144-Mpx photo was held three times
    over (3.3 GB at the peak, issue 44)."""
    from PIL import ImageOps

    image.load()
    ImageOps.exif_transpose(image, in_place=True)
    mode = image.mode
    if mode.startswith("I;16") or mode == "I":
        import numpy as np

        grey = np.asarray(image, dtype=np.float64)
        # I;16*: 16-bit samples. I: 32-bit samples, which PIL also uses for 16-bit PNG and TIFF grey; values above
        # 65535 only occur in true 32-bit files, whose range is then the full one.
        full = 65535.0 if mode != "I" or grey.max(initial=0) <= 65535 else float(2**32 - 1)
        grey = np.clip(grey, 0, None) if mode == "I" else grey
        return Image.fromarray(np.rint(grey * (255.0 / full)).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        import numpy as np

        grey = np.nan_to_num(np.asarray(image, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
        scale = 255.0 if grey.max(initial=0) <= 1.0 else 1.0  # [0, 1] floats, or already 0-255
        return Image.fromarray(np.rint(np.clip(grey * scale, 0, 255)).astype(np.uint8), "L").convert("RGB")
    if mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    elif mode == "PA":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")


def inside_root(root: Path, path: Path) -> bool:
    """Whether `path`, with symlinks and `..` resolved, is `root` (resolved) or below it (`qkvqa.utils.io.path_within`)."""
    return path_within(path, root)


class QueryImageResolver:
    """Maps (dataset_name, image_id) to candidate files, per the configured layout (data-formats.md section 4)."""

    def __init__(self, config: ImagesConfig, root: Optional[str | os.PathLike] = None):
        self.config = config
        self.roots = {
            "inaturalist": _under(root, config.inaturalist_root),
            "landmarks": _under(root, config.landmarks_root),
            "infoseek": _under(root, config.infoseek_root),
        }
        self.layouts = {
            "inaturalist": config.inaturalist_layout,
            "landmarks": config.landmarks_layout,
            "infoseek": "flat",
        }
        for dataset, layout in self.layouts.items():
            if layout not in LAYOUTS[dataset]:
                raise ConfigError(
                    f"data.images.{dataset}_layout: {layout!r} is not one of {', '.join(LAYOUTS[dataset])}"
                )
        self.id2name_files = [p for p in [_under(root, config.inaturalist_id2name)] if p is not None]
        self.id2name_files += [_under(root, p) for p in config.inaturalist_id2name_extra]
        self._id2name: Optional[dict[str, str]] = None
        self.data_root = root
        self.shard_patterns = {"infoseek": config.infoseek_shards} if config.infoseek_shards else {}
        self._shards: dict[str, ShardIndex] = {}
        self._entries: dict[tuple[str, str], str] = {}  # file_entry, one stat per image and process

    def shards(self, pattern: str | os.PathLike) -> ShardIndex:
        """The index of the webdataset shards of `pattern` (relative to data.root), scanned once per pattern."""
        key = str(_under(self.data_root, pattern))  # questions and images name the same shards once
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
        return {**self.__dict__, "_shards": {}}  # DataLoader workers rescan rather than copy the index

    def _root(self, dataset_name: str) -> Path:
        if dataset_name not in self.roots:
            raise DataError(f"unknown dataset_name {dataset_name!r}; expected one of {', '.join(self.roots)}")
        root = self.roots[dataset_name]
        if root is None:
            raise ConfigError(f"data.images.{dataset_name}_root is not set, but a question uses a {dataset_name} image")
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
            examples = ", ".join(
                f"{q.image_id} ({self._tried(q.dataset_name, q.image_id)})"
                if q.dataset_name not in self.shard_patterns
                else q.image_id
                for q in missing[:3]
            )
            raise DataError(
                f"{len(missing)} of {len(questions)} {split} query images are missing "
                f"({100 * len(missing) / len(questions):.1f}%, more than data.images.max_missing_fraction="
                f"{bound}), e.g. {examples}: check data.images.*_root and data.root (or raise the bound)"
            )
        return {"questions": len(questions), "missing": len(missing), "max_missing_fraction": bound}

    def _tried(self, dataset_name: str, image_id: str) -> str:
        """The first path tried for an image, for messages (one outside its root says so)."""
        paths = self.candidates(dataset_name, image_id)
        if paths:
            return str(paths[0])
        outside = self.outside(dataset_name, image_id)
        return f"{outside}: outside the root, never read" if outside is not None else "no path"

    def check_roots(self, questions) -> None:
        """Before any work: every image root the questions use is set and is a folder (one line naming the
        folder and an example id otherwise; a wrong root would turn every image into a counted skip)."""
        first = {}
        for q in questions:
            first.setdefault(q.dataset_name, q.image_id)
        for dataset_name, image_id in first.items():
            if dataset_name in self.shard_patterns:
                shard_paths(self.shard_patterns[dataset_name], self.data_root)  # DataError naming a missing shard
                continue
            root = self._root(dataset_name)
            if not root.is_dir():
                raise DataError(
                    f"{root}: the {dataset_name} image folder (data.images.{dataset_name}_root) does not "
                    f"exist; questions need it, e.g. image {image_id!r}. Fix the path or data.root"
                )

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
        """The files tried for an image, in order; empty for an id the id2name map lacks or too short to shard, and
        for a path that leaves the dataset's root (absolute, `..`, a symlink out: `outside`)."""
        return [p for p in self._paths(dataset_name, image_id) if inside_root(self._root(dataset_name), p)]

    def outside(self, dataset_name: str, image_id: str) -> Optional[Path]:
        """The first path of an image that resolves outside its dataset's root (never read), or None."""
        root = self._root(dataset_name)
        return next((p for p in self._paths(dataset_name, image_id) if not inside_root(root, p)), None)

    def _paths(self, dataset_name: str, image_id: str) -> list[Path]:
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
    keys = (
        "inaturalist_root",
        "inaturalist_layout",
        "inaturalist_id2name",
        "inaturalist_id2name_extra",
        "landmarks_root",
        "landmarks_layout",
        "infoseek_root",
        "infoseek_shards",
        "extensions",
    )
    out = {
        key: list(getattr(images, key)) if isinstance(getattr(images, key), (list, tuple)) else getattr(images, key)
        for key in keys
    }
    maps = [images.inaturalist_id2name, *images.inaturalist_id2name_extra]
    files = [resolve_data_path(data, name) for name in maps if name]
    out["decode_version"] = IMAGE_DECODE_VERSION
    out["id2name_files"] = [file_identity(f) if f.is_file() else {"path": str(f), "missing": True} for f in files]
    if images.infoseek_shards:
        out["infoseek_shard_files"] = file_identity(resolve_data_path(data, images.infoseek_shards))
    return out


@dataclass(frozen=True)
class SkippedImage:
    """An image that could not be used: why, and which file was tried."""

    image_id: str
    dataset_name: str
    reason: str  # missing | corrupt
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
        outside = self.resolver.outside(dataset_name, image_id) if path is None else None
        if outside is not None:
            self.record(
                SkippedImage(
                    image_id,
                    dataset_name,
                    OUTSIDE_ROOT,
                    str(outside),
                    f"leaves data.images.{dataset_name}_root {self.resolver.roots[dataset_name]}; never read",
                )
            )
            return None
        if path is None:
            tried = ", ".join(str(p) for p in candidates) or f"nothing: no {self.resolver.layouts[dataset_name]} path"
            self.record(
                SkippedImage(
                    image_id, dataset_name, "missing", str(candidates[0]) if candidates else None, f"tried {tried}"
                )
            )
            return None
        return self.load_file(path, image_id, dataset_name)

    def _load_from_shards(self, shards: ShardIndex, dataset_name: str, image_id: str) -> Optional[Image.Image]:
        member = self.resolver.shard_member(dataset_name, image_id)
        if member is None:
            self.record(
                SkippedImage(
                    image_id,
                    dataset_name,
                    "missing",
                    None,
                    f"no {'/'.join(SHARD_IMAGE_EXTENSIONS)} member in the {len(shards.shards)} shards",
                )
            )
            return None
        return self.load_file(
            io.BytesIO(shards.read(member)), image_id, dataset_name, where=f"{member.shard}#{image_id}"
        )

    def load_file(
        self, path: Path | io.BytesIO, image_id: str, dataset_name: str, where: Optional[str] = None
    ) -> Optional[Image.Image]:
        """Open `path` (a file, or bytes named by `where`) as RGB, or None (recorded as corrupt or missing)."""
        where = where or str(path)
        try:
            with Image.open(path) as image:
                if min(image.size) < MIN_IMAGE_SIDE:
                    self.record(
                        SkippedImage(
                            image_id,
                            dataset_name,
                            "too_small",
                            where,
                            f"{image.size[0]}x{image.size[1]} px; at least {MIN_IMAGE_SIDE} px a side",
                        )
                    )
                    return None
                return to_rgb(image)
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
            log.warning(
                "skipping %s image %s (%s): %s %s",
                skip.dataset_name,
                skip.image_id,
                skip.reason,
                skip.path,
                skip.detail,
            )

    def counts(self) -> dict[str, int]:
        """Number of distinct skipped image ids per reason."""
        counts = {"missing": 0, "corrupt": 0, "too_small": 0, OUTSIDE_ROOT: 0}
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
        log.info(
            "skipped images: %d missing, %d corrupt, %d too small, %d outside their root (ids in %s)",
            counts["missing"],
            counts["corrupt"],
            counts["too_small"],
            counts[OUTSIDE_ROOT],
            path,
        )
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
            raise DataError(
                f"{pattern_path}: no title -> image CSV matches (data.images.kb_image_csvs; OMGM's release "
                f"keeps them in wiki_image/output/)"
            )
        paths.extend(Path(m) for m in matches)
    return paths


def url_store_path(store: Path, url: str) -> Path:
    """Where the local pixel store keeps the file of `url`: {store}/{host}/{url path}."""
    parts = urlsplit(url)
    return store / parts.netloc / unquote(parts.path).lstrip("/")


MISSING_EXAMPLES = 1000  # (title, path) of the first missing CSV images kept for the bound's message


class _Containment:
    """Checks CSV `img_path`s against their root: lexically (absolute, `..`), then each distinct parent folder's real
    path once, and a symlinked file's target (the OMGM release has 13 image folders, so this costs one lstat a row)."""

    def __init__(self, base: Path):
        self.base = base
        self.real_base = os.path.realpath(base)
        self._parents: dict[str, bool] = {}

    def _under(self, real: str) -> bool:
        return real_path_within(real, self.real_base)

    def check(self, img_path: str) -> tuple[str, Path]:
        """("ok" | "missing" | OUTSIDE_ROOT, the path tried) of one CSV `img_path`."""
        relative = Path(img_path)
        if (
            relative.is_absolute()
            or img_path.startswith(("/", "\\"))
            or ".." in relative.parts
            or ".." in img_path.replace("\\", "/").split("/")
        ):
            return OUTSIDE_ROOT, relative
        path = self.base / relative
        parent = str(path.parent)
        inside_parent = self._parents.get(parent)
        if inside_parent is None:
            inside_parent = self._parents[parent] = self._under(os.path.realpath(parent))
        if not inside_parent:
            return OUTSIDE_ROOT, path
        try:
            st = os.lstat(path)
        except OSError:
            return "missing", path
        if stat.S_ISLNK(st.st_mode):
            if not self._under(os.path.realpath(path)):
                return OUTSIDE_ROOT, path
            return ("ok" if path.is_file() else "missing"), path
        return ("ok" if stat.S_ISREG(st.st_mode) else "missing"), path


class ArticleImageIndex:
    """KB article images by title (OMGM `get_title2wikiimg`): at most N existing files per title, in CSV order.

    `img_path` is relative to `data.images.kb_image_root`, the folder that holds `full/` (OMGM's
    `wiki_img_path_prefix`; the paths read `full/wiki_image_split/wiki_entity_image_N/FILE`). A path that is
    absolute or leaves that root (`..`, a symlink out) is never read: it counts as a missing image. The main
    image of an article is its first listed image; without one, the KB's `image_urls[0]` from the local pixel
    store; articles that still have none are counted. `check_missing` bounds the share of missing images.
    """

    def __init__(
        self,
        by_title: dict[str, list[ArticleImage]],
        url_store: Optional[Path] = None,
        image_root: Optional[Path] = None,
    ):
        self.by_title = by_title
        self.url_store = url_store
        self.image_root = image_root
        self.fallback_titles: set[str] = set()
        self.titles_without_image: set[str] = set()
        self.unreadable: set[str] = set()
        self._decoded: OrderedDict[str, Optional[Image.Image]] = OrderedDict()
        # What reading the CSVs found (filled by from_csvs): CSV rows tried per title (existing or not), missing per
        # title, the first missing (title, path, reason) in CSV order, and the CSV files read.
        self.tried_by_title: dict[str, int] = {}
        self.missing_by_title: dict[str, int] = {}
        self.missing_examples: list[tuple[str, str, str]] = []
        self.outside_root = 0
        self.csv_paths: list[Path] = []

    @classmethod
    def from_config(cls, config: ImagesConfig, root: Optional[str | os.PathLike] = None) -> "ArticleImageIndex":
        """Read the configured CSVs; `kb_image_root` (the folder holding `full/`; else the CSV's folder) is what
        `img_path` is relative to."""
        csv_paths = _expand_globs(config.kb_image_csvs, root)
        image_root = _under(root, config.kb_image_root)
        return cls.from_csvs(
            csv_paths, image_root, config.max_images_per_title, _under(root, config.kb_image_url_store)
        )

    @classmethod
    def from_csvs(
        cls,
        csv_paths: Iterable[Path],
        image_root: Optional[Path],
        max_per_title: int = 10,
        url_store: Optional[Path] = None,
    ) -> "ArticleImageIndex":
        """Keep, per title, the first `max_per_title` rows whose file exists (row[0] title, row[2] img_path);
        rows tried and missing are counted per title for `check_missing`."""
        by_title: dict[str, list[ArticleImage]] = {}
        tried: dict[str, int] = {}
        missing_by_title: dict[str, int] = {}
        examples: list[tuple[str, str, str]] = []
        outside = 0
        csv_paths = list(csv_paths)
        for csv_path in csv_paths:
            base = image_root if image_root is not None else csv_path.parent
            containment = _Containment(base)
            with open(csv_path, newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                for row in progress(reader, desc=f"article images {csv_path.name}", unit="row"):
                    if reader.line_num == 1 and len(row) > 2 and row[2] == "img_path":
                        continue
                    if len(row) < 4:
                        raise DataError(
                            f"{csv_path}: line {reader.line_num}: {len(row)} fields; expected title, "
                            f"image_URL, img_path, caption"
                        )
                    title, image_url, img_path, caption = row[0], row[1], row[2], row[3]
                    images = by_title.setdefault(title, [])
                    if len(images) >= max_per_title:
                        continue
                    status, path = containment.check(img_path)
                    if status == "ok" and any(i.path == path and i.caption == caption for i in images):
                        continue  # OMGM skips a repeated {caption, img_path} of a title (utils/utils.py:103)
                    tried[title] = tried.get(title, 0) + 1
                    if status == "ok":
                        images.append(ArticleImage(path, caption, image_url))
                        continue
                    missing_by_title[title] = missing_by_title.get(title, 0) + 1
                    outside += status == OUTSIDE_ROOT
                    if len(examples) < MISSING_EXAMPLES:
                        examples.append((title, str(path), status))
                    if status == OUTSIDE_ROOT and outside <= MAX_LOGGED_SKIPS:
                        log.warning(
                            "%s: line %d: field 'img_path': %r leaves the image root %s; not read (counted "
                            "as a missing image)",
                            csv_path,
                            reader.line_num,
                            img_path,
                            base,
                        )
        by_title = {title: images for title, images in by_title.items() if images}
        log.info(
            "article images: %d titles with images; %d of %d listed files tried missing on disk%s",
            len(by_title),
            sum(missing_by_title.values()),
            sum(tried.values()),
            f" ({outside} outside the image root)" if outside else "",
        )
        index = cls(by_title, url_store, image_root)
        index.tried_by_title, index.missing_by_title, index.missing_examples = tried, missing_by_title, examples
        index.outside_root, index.csv_paths = outside, csv_paths
        return index

    def missing_counts(self, titles: Optional[Iterable[str]] = None) -> dict[str, int]:
        """CSV images tried and missing (outside the root included), over `titles` (default: every CSV title)."""
        if titles is None:
            return {
                "tried": sum(self.tried_by_title.values()),
                "missing": sum(self.missing_by_title.values()),
                "titles_with_images": len(self.by_title),
            }
        tried = missing = with_images = 0
        for title in titles:
            tried += self.tried_by_title.get(title, 0)
            missing += self.missing_by_title.get(title, 0)
            with_images += title in self.by_title
        return {"tried": tried, "missing": missing, "titles_with_images": with_images}

    def check_missing(
        self, max_missing_fraction: float, titles: Optional[Iterable[str]] = None, what: str = "the KB's articles"
    ) -> dict[str, int]:
        """Before any work: at most `max_missing_fraction` of the CSV images listed for `titles` (the KB's) are missing,
        and at least one of them has an image (unless a url store may supply them); DataError with the counts, the
        first paths tried and, when a folder one level off holds them, that folder. Returns the counts."""
        titles = None if titles is None else set(titles)
        counts = self.missing_counts(titles)
        bound = float(max_missing_fraction)
        if counts["tried"] and counts["missing"] > bound * counts["tried"]:
            raise DataError(
                f"{counts['missing']} of {counts['tried']} KB images that the title -> image CSVs list for "
                f"{what} are missing ({100 * counts['missing'] / counts['tried']:.1f}%, more than "
                f"data.images.max_missing_fraction={bound}); tried {self._examples(titles)}. img_path is "
                f"relative to data.images.kb_image_root ({self.image_root}), the folder that holds full/ "
                f"(OMGM's wiki_img_path_prefix){self._one_folder_off(titles)}; fix it or data.root "
                f"(or raise the bound)"
            )
        if titles is not None and not counts["titles_with_images"] and self.url_store is None:
            listed = sum(1 for t in titles if t in self.tried_by_title)
            raise DataError(
                f"none of the {len(titles)} articles of {what} has an image: the title -> image CSVs "
                f"({', '.join(str(p) for p in self.csv_paths[:2])}{' ...' if len(self.csv_paths) > 2 else ''})"
                f" list {listed} of their titles; they are another KB's CSVs, or data.images.kb_image_csvs "
                f"names the wrong files"
            )
        return counts

    def _examples(self, titles: Optional[set[str]], count: int = 3) -> str:
        chosen = [e for e in self.missing_examples if titles is None or e[0] in titles][:count]
        return ", ".join(
            f"{path}{' (outside the image root)' if reason == OUTSIDE_ROOT else ''}" for _, path, reason in chosen
        )

    def _one_folder_off(self, titles: Optional[set[str]]) -> str:
        """`; the files are under X: set kb_image_root to X` when the first missing file exists one folder up or down."""
        if self.image_root is None:
            return ""
        for title, path, reason in self.missing_examples:
            if reason == OUTSIDE_ROOT or (titles is not None and title not in titles):
                continue
            relative = Path(path).relative_to(self.image_root)
            below = [p for p in self.image_root.iterdir() if p.is_dir()] if self.image_root.is_dir() else []
            for folder in (self.image_root.parent, *below):
                if (folder / relative).is_file():
                    return f"; {relative} exists under {folder}: kb_image_root should be that folder"
            return ""
        return ""

    def images(self, title: str) -> list[ArticleImage]:
        """The kept images of `title`, in CSV order (may be empty)."""
        return self.by_title.get(title, [])

    def url_store_file(self, url: str) -> Optional[Path]:
        """The url store's file of `url` when it exists inside the store (a URL whose path leaves it is never read)."""
        if self.url_store is None:
            return None
        path = url_store_path(self.url_store, url)
        return path if path.is_file() and inside_root(self.url_store, path) else None

    def main_image(self, title: str, image_urls: Iterable[str] = ()) -> Optional[Path]:
        """The article's main image file, or None (counted in `titles_without_image`)."""
        images = self.by_title.get(title)
        if images:
            return images[0].path
        first_url = next(iter(image_urls), None)
        if first_url is not None:
            path = self.url_store_file(first_url)
            if path is not None:
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
                loaded: Optional[Image.Image] = to_rgb(image)
        except (OSError, ValueError) as e:
            log.warning(
                "article image %s of %r unreadable (%s); the article is used as one without image", path, title, e
            )
            self.unreadable.add(key)
            loaded = None
        self._decoded[key] = loaded
        if len(self._decoded) > DECODED_CACHE_SIZE:
            self._decoded.popitem(last=False)
        return loaded

    def coverage(self) -> dict[str, int]:
        """Counts for the run record: titles with CSV images, fallbacks used, titles without any image."""
        return {
            "titles_with_csv_images": len(self.by_title),
            "fallback_to_url_store": len(self.fallback_titles),
            "titles_without_image": len(self.titles_without_image),
            "unreadable_images": len(self.unreadable),
        }
