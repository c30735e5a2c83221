"""Frozen-ViT feature cache: fp16 `last_hidden_state` of every image the QFF training needs, in memory-mapped .npy shards.

Layout of a cache directory (`qff.vit_cache`):

    manifest.json           format, vision fingerprint, feature shape [P, D], dtype, shard size, image count
    images.json             the image ids in cache order (sorted); image i lives in shard i // shard_size, row i % shard_size
    shard-00000.npy         float16 [n, P, D], written through np.lib.format.open_memmap to a temp file, then renamed
    shard-00000.done.json   written last: rows, bytes, the ids that could not be read (zero rows) and why

Image ids are `query/{dataset_name}/{image_id}` and `article/{stored path}` (qkvqa.data_modules.qff_train).
A rerun skips the shards whose done record matches the .npy on disk, so an interrupted pass resumes.
Several processes split the shards (`shard_index` / `num_shards`: process p writes shards i with
i % num_shards == p); under torchrun / SLURM the rank and world size are read from the environment.
Training opens the cache with the ViT's fingerprint and the images it needs: a cache written by
another ViT (config, weights, dtype or preprocessing) or missing some of the images is refused with
StaleArtifactError, as is an incomplete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from qkvqa.errors import StaleArtifactError
from qkvqa.utils.io import atomic_write_json, read_json
from qkvqa.utils.logging import get_logger
from qkvqa.utils.own_files import check_own_dir, refuse_link
from qkvqa.utils.progress import progress

log = get_logger(__name__)

CACHE_FORMAT = 1
DTYPE = "float16"


def vision_fingerprint(model, image_processor) -> str:
    """What the cached features depend on: the ViT config, the bytes of its weights (so their dtype too) and the
    image preprocessing; the same on every device."""
    import torch

    vision = model.base.vision_model
    digest = hashlib.blake2b(digest_size=32)
    digest.update(json.dumps(vision.config.to_dict(), sort_keys=True, default=str).encode())
    processor = {
        k: getattr(image_processor, k, None)
        for k in (
            "size",
            "image_mean",
            "image_std",
            "resample",
            "do_rescale",
            "rescale_factor",
            "do_normalize",
            "transform",
            "target_ratio",
            "geometry",
        )
    }
    digest.update(json.dumps(processor, sort_keys=True, default=str).encode())
    with torch.no_grad():
        for name, tensor in sorted(vision.state_dict().items()):
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return "blake2b:" + digest.hexdigest()


def image_sources(data_config) -> dict:
    """Where the cached images are read from (query-image roots, layouts and id2name files; KB image CSVs and
    roots): the same ids under another root are other pixels, so a cache records this and refuses a change."""
    from qkvqa.data.images import query_images_identity

    images = data_config.images
    return {
        "root": data_config.root,
        "query": query_images_identity(data_config),
        "kb": {
            "kb_image_csvs": list(images.kb_image_csvs),
            "kb_image_root": images.kb_image_root,
            "kb_image_url_store": images.kb_image_url_store,
        },
    }


def image_set_checksum(image_ids: Sequence[str]) -> str:
    """sha256 of the image ids, one per line, in the given order."""
    digest = hashlib.sha256()
    for image_id in image_ids:
        digest.update(image_id.encode("utf-8") + b"\n")
    return "sha256:" + digest.hexdigest()


def env_shard_split() -> tuple[int, int]:
    """(rank, world size) from torchrun (RANK / WORLD_SIZE) or SLURM (SLURM_PROCID / SLURM_NTASKS); (0, 1) otherwise."""
    for rank_key, world_key in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS")):
        if rank_key in os.environ and world_key in os.environ:
            return int(os.environ[rank_key]), int(os.environ[world_key])
    return 0, 1


class ViTFeatureCache:
    """A cache directory (see the module docstring): create, fill shard by shard, open for reading."""

    def __init__(self, path: Path, manifest: dict, image_ids: list[str]):
        self.path = path
        self.manifest = manifest
        self.image_ids = image_ids
        self.position = {image_id: i for i, image_id in enumerate(image_ids)}
        self._shards: dict[int, np.ndarray] = {}
        self._skipped: Optional[dict[str, str]] = None

    # ------------------------------------------------------------------ creation
    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        image_ids: Iterable[str],
        fingerprint: str,
        feature_shape: Sequence[int],
        shard_size: int,
        sources: Optional[dict] = None,
    ) -> "ViTFeatureCache":
        """Start (or reopen) a cache for `image_ids` read from `sources` (`image_sources`); StaleArtifactError when
        the directory holds another cache."""
        path = Path(path)
        ids = sorted(set(image_ids))
        manifest = {
            "format": CACHE_FORMAT,
            "fingerprint": fingerprint,
            "dtype": DTYPE,
            "feature_shape": [int(d) for d in feature_shape],
            "shard_size": int(shard_size),
            "num_images": len(ids),
            "image_set": image_set_checksum(ids),
            "sources": sources,
        }
        check_own_dir(path, "ViT feature cache", "remove it, or set qff.vit_cache to a folder of your own")
        if refuse_link(path / "manifest.json").is_file():  # a link planted in a shared cache is never followed
            old = read_json(path / "manifest.json")
            changed = [
                k
                for k in ("format", "fingerprint", "dtype", "feature_shape", "shard_size", "image_set", "sources")
                if old.get(k) != manifest[k]
            ]
            if changed:
                raise StaleArtifactError(
                    f"{path} holds a ViT feature cache with another {', '.join(changed)}; "
                    f"delete it or set qff.vit_cache to another directory"
                )
            return cls(path, old, read_json(path / "images.json"))
        path.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path / "images.json", ids, indent=None)
        atomic_write_json(path / "manifest.json", {**manifest, "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return cls(path, manifest, ids)

    @property
    def shard_size(self) -> int:
        return int(self.manifest["shard_size"])

    @property
    def num_shards(self) -> int:
        return (len(self.image_ids) + self.shard_size - 1) // self.shard_size

    def shard_file(self, i: int, suffix: str) -> Path:
        """`shard-{i:05d}{suffix}` (suffix `.npy` or `.done.json`)."""
        return self.path / f"shard-{i:05d}{suffix}"

    def shard_ids(self, i: int) -> list[str]:
        """The image ids of shard i, in row order."""
        return self.image_ids[i * self.shard_size : (i + 1) * self.shard_size]

    def done_record(self, i: int) -> Optional[dict]:
        """Shard i's done record when the shard is complete on disk (size checked), else None."""
        done, npy = self.shard_file(i, ".done.json"), self.shard_file(i, ".npy")
        if not done.is_file() or not npy.is_file():
            return None
        try:
            record = read_json(done)
        except ValueError:
            return None
        return record if record.get("bytes") == npy.stat().st_size else None

    def pending(self, shard_index: int = 0, num_shards: int = 1) -> list[int]:
        """Shards of process `shard_index` of `num_shards` still to write."""
        return [i for i in range(self.num_shards) if i % num_shards == shard_index and self.done_record(i) is None]

    def write_shard(
        self, i: int, features: Callable[[list[str]], Iterable[tuple[int, np.ndarray, dict[str, str]]]]
    ) -> dict:
        """Fill shard i from `features(ids)`, which yields (first row, [n, P, D] block, {id: skip reason}) in row order."""
        ids = self.shard_ids(i)
        npy, tmp = self.shard_file(i, ".npy"), self.shard_file(i, f".npy.partial-{os.getpid()}")
        started = time.time()
        skipped: dict[str, str] = {}
        try:
            array = np.lib.format.open_memmap(
                tmp, mode="w+", dtype=DTYPE, shape=(len(ids), *self.manifest["feature_shape"])
            )
            for start, block, skips in features(ids):
                array[start : start + len(block)] = block.astype(DTYPE)
                skipped.update(skips)
            array.flush()
            del array
            os.replace(tmp, npy)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        record = {
            "shard": i,
            "rows": len(ids),
            "bytes": npy.stat().st_size,
            "skipped": skipped,
            "seconds": round(time.time() - started, 3),
        }
        atomic_write_json(self.shard_file(i, ".done.json"), record)
        return record

    # ------------------------------------------------------------------ reading
    @classmethod
    def open(
        cls, path: str | os.PathLike, fingerprint: Optional[str], needed: Sequence[str], sources: Optional[dict] = None
    ) -> "ViTFeatureCache":
        """Open a complete cache for reading; StaleArtifactError unless it was written by this ViT from `sources` and
        holds `needed`."""
        path = Path(path)
        hint = "write it with `qkvqa cache-vit` (same experiment and overrides as the training run)"
        if not refuse_link(path / "manifest.json").is_file():
            raise StaleArtifactError(f"{path}: no ViT feature cache there; {hint}")
        manifest = read_json(path / "manifest.json")
        if manifest.get("format") != CACHE_FORMAT:
            raise StaleArtifactError(
                f"{path}: ViT cache format {manifest.get('format')}, expected {CACHE_FORMAT}; delete it and {hint}"
            )
        if fingerprint is not None and manifest.get("fingerprint") != fingerprint:
            raise StaleArtifactError(
                f"{path}: the ViT cache was written by another vision model (fingerprint "
                f"{manifest.get('fingerprint', '?')[:19]}..., this model {fingerprint[:19]}...: "
                f"config, weights, dtype or preprocessing differ); delete it and {hint}"
            )
        if sources is not None and manifest.get("sources") != sources:
            old = manifest.get("sources") or {}
            differ = sorted(k for k in set(old) | set(sources) if old.get(k) != sources.get(k)) or ["(not recorded)"]
            raise StaleArtifactError(
                f"{path}: the ViT cache was read from other images (differing: "
                f"{', '.join(differ)}: data.root / data.images.*); delete it and {hint}"
            )
        cache = cls(path, manifest, read_json(path / "images.json"))
        missing = [i for i in needed if i not in cache.position]
        if missing:
            raise StaleArtifactError(
                f"{path}: the ViT cache lacks {len(missing)} of the {len(needed)} images this "
                f"training needs (e.g. {missing[:3]}); it was written for another image set — "
                f"delete it and {hint}"
            )
        incomplete = [i for i in range(cache.num_shards) if cache.done_record(i) is None]
        if incomplete:
            raise StaleArtifactError(
                f"{path}: the ViT cache is incomplete ({len(incomplete)} of {cache.num_shards} "
                f"shards missing, e.g. {incomplete[:5]}); finish it with `qkvqa cache-vit`"
            )
        return cache

    def __getstate__(self) -> dict:
        return {"path": self.path, "manifest": self.manifest, "image_ids": self.image_ids}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["manifest"], state["image_ids"])

    def skipped(self) -> dict[str, str]:
        """Ids whose image could not be read when the cache was written, with the reason."""
        if self._skipped is None:
            self._skipped = {}
            for i in range(self.num_shards):
                record = self.done_record(i) or {}
                self._skipped.update(record.get("skipped", {}))
        return self._skipped

    def skip_reason(self, image_id: str) -> str:
        """Why `get(image_id)` returned None."""
        return self.skipped().get(image_id, "image_not_in_vit_cache")

    def get(self, image_id: str) -> Optional[np.ndarray]:
        """The `[P, D]` fp16 features of an image (a memory-mapped view), or None when absent or unreadable."""
        position = self.position.get(image_id)
        if position is None or image_id in self.skipped():
            return None
        shard = position // self.shard_size
        if shard not in self._shards:
            self._shards[shard] = np.load(self.shard_file(shard, ".npy"), mmap_mode="r")
        return self._shards[shard][position % self.shard_size]

    @staticmethod
    def stack(rows: Sequence[np.ndarray]) -> np.ndarray:
        """Rows read by `get`, copied into one `[U, P, D]` array."""
        return np.stack([np.asarray(r) for r in rows])


# ---------------------------------------------------------------------------------------------- writing


class _ImageFiles:
    """Map-style dataset: (row, pixels [3, S, S] or None, skip reason) of the images of one shard."""

    def __init__(self, ids: list[str], load: Callable[[str], Any], image_processor):
        self.ids, self.load, self.image_processor = ids, load, image_processor

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, row: int):
        image = self.load(self.ids[row])
        if image is None:
            return row, None
        return row, self.image_processor(images=[image], return_tensors="pt")["pixel_values"][0]


def _collate(items):
    return items


def fill_cache(
    cache: ViTFeatureCache,
    model,
    image_processor,
    load: Callable[[str], Any],
    *,
    batch_size: int = 32,
    num_workers: int = 0,
    shard_index: int = 0,
    num_shards: int = 1,
) -> dict[str, int]:
    """Write this process's pending shards: images loaded (`load(id)` -> PIL or None) in workers, ViT in batches."""
    import torch
    from torch.utils.data import DataLoader

    pending = cache.pending(shard_index, num_shards)
    log.info(
        "ViT cache %s: %d of %d shards to write (process %d of %d)",
        cache.path,
        len(pending),
        cache.num_shards,
        shard_index,
        num_shards,
    )
    counts = {"shards_written": 0, "images": 0, "skipped": 0}

    def features(ids: list[str]):
        loader = DataLoader(
            _ImageFiles(ids, load, image_processor), batch_size=batch_size, num_workers=num_workers, collate_fn=_collate
        )
        for items in progress(loader, desc="ViT features", unit="batch"):
            rows = [row for row, pixels in items if pixels is not None]
            skips = {ids[row]: "unreadable_image" for row, pixels in items if pixels is None}
            block = np.zeros((len(items), *cache.manifest["feature_shape"]), dtype=DTYPE)
            if rows:
                with torch.inference_mode():
                    states = model.encode_image(torch.stack([pixels for _, pixels in items if pixels is not None]))
                block[[r - items[0][0] for r in rows]] = states.float().cpu().numpy()
            counts["images"] += len(items)
            counts["skipped"] += len(skips)
            yield items[0][0], block, skips

    for i in pending:
        cache.write_shard(i, features)
        counts["shards_written"] += 1
    return counts


def feature_shape(model) -> tuple[int, int]:
    """`[P, D]` of the ViT's last hidden state (patches + class token, hidden size)."""
    config = model.base.config.vision_config
    return (config.image_size // config.patch_size) ** 2 + 1, config.hidden_size
