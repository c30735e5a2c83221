"""The doctor's system checks: the torch build against the driver, the devices the config asks for, faiss, and free disk against the caches a run writes."""

from __future__ import annotations

import re
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any, Optional

from qkvqa.components.hardware import cpu_fallback_warning, gpu_status
from qkvqa.doctor.report import Check

# Sizes from docs/performance.md's full-scale runs: the 2M-article store is 22.4 GiB from a 19.7 GiB JSON (x1.14);
# per question a run directory holds its prediction and trace rows (~20 KB with traces); a ViT-g feature cache
# holds ~0.7 MB per image in fp16 (qff.vit_cache_shard_size's comment).
STORE_PER_SOURCE_BYTE = 1.14
RUN_BYTES_PER_QUESTION = 20_000
VIT_CACHE_BYTES_PER_IMAGE = 700_000
KB_JSON_BYTES_PER_ARTICLE = 10_500  # the synthetic 2M KB of the measurement (10.5 KB per entry)
DIMS = {"BAAI/EVA-CLIP-8B": 1280}  # stage-1 vector width of the real encoders (docs/retrieval.md)


def gpu_checks(cfg: Any, names: list[str]) -> list[Check]:
    """The torch build's CUDA against the driver, the GPUs seen, a component or trainer asking for CUDA without one
    (fail), real models on `device: auto` that would run on the CPU (warn, the line evaluation logs)."""
    status = gpu_status()
    checks = []
    build = (
        f"torch {status['torch']} (CUDA {status['cuda_build']})"
        if status["cuda_build"]
        else f"torch {status['torch']} (CPU only)"
    )
    if status["available"]:
        gpus = ", ".join(f"{d['name']} {d['memory_gib']} GiB" for d in status["devices"])
        checks.append(
            Check(
                "gpu",
                "torch / driver",
                "ok",
                f"{build}, driver {status['driver']} (needs >= "
                f"{status['min_driver']}): {len(status['devices'])} GPU(s): {gpus}",
            )
        )
    else:
        checks.append(
            Check(
                "gpu",
                "torch / driver",
                "fail" if status["driver_ok"] is False else "warn",
                f"{build}, driver {status['driver'] or 'none'}: no usable GPU ({status['reason']})",
            )
        )
    asked = [
        f"components.{n}.device={cfg.components[n].device}"
        for n in names
        if str(cfg.components[n].device or "").startswith("cuda")
    ]
    if cfg.trainer.accelerator in ("gpu", "cuda") and cfg.task == "train":
        asked.append(f"trainer.accelerator={cfg.trainer.accelerator}")
    if asked and not status["available"]:
        checks.append(
            Check(
                "gpu",
                "devices asked for",
                "fail",
                f"{', '.join(asked)}, but no usable GPU: the run stops at start-up (use a GPU node, or preset=cpu)",
            )
        )
    line = cpu_fallback_warning(cfg, names, status)
    if line:
        checks.append(Check("gpu", "device: auto", "warn", line))
    checks.append(_faiss_check(cfg, status))
    return checks


def _distributions(prefix: str) -> list[str]:
    found = []
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith(prefix):
            found.append(f"{name} {dist.version}")
    return sorted(set(found))


def _faiss_check(cfg: Any, status: dict) -> Check:
    """faiss imports; which builds are installed (faiss-cpu and a faiss-gpu side by side shadow each other); GPUs."""
    try:
        import faiss
    except ImportError as e:
        return Check(
            "gpu",
            "faiss",
            "fail",
            f"faiss does not import ({e}): pip install 'qkvqa[cpu]' (faiss-cpu) or "
            "'qkvqa[gpu]' (faiss-gpu), README 'GPU install'",
        )
    installed = _distributions("faiss")
    gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    has_gpu_build = hasattr(faiss, "StandardGpuResources")
    detail = f"faiss {faiss.__version__} ({', '.join(installed) or 'unknown distribution'}): " + (
        f"GPU build, {gpus} GPU(s) visible" if has_gpu_build else "CPU build"
    )
    cpu_and_gpu = any(d.startswith("faiss-cpu") for d in installed) and any(
        d.startswith("faiss-gpu") for d in installed
    )
    if cpu_and_gpu:
        return Check(
            "gpu",
            "faiss",
            "warn",
            detail + "; faiss-cpu and faiss-gpu are both installed and overwrite each "
            "other's files: pip uninstall -y faiss-cpu faiss-gpu && pip install 'qkvqa[gpu]'",
        )
    if cfg.retrieval.index_gpu and status["available"] and not has_gpu_build:
        return Check(
            "gpu",
            "faiss",
            "warn",
            detail + "; retrieval.index_gpu is on and a GPU is here, but this faiss "
            "searches on the CPU (pip install 'qkvqa[gpu]' for faiss-gpu)",
        )
    return Check("gpu", "faiss", "ok", detail)


def _existing_parent(path: Path) -> Path:
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _factory_bytes_per_vector(factory: str, dim: int) -> float:
    """Approximate stored bytes per vector of a faiss factory string (docs/retrieval.md's table)."""
    f = factory.replace(" ", "")
    if "PQ" in f:
        match = re.search(r"PQ(\d+)", f)
        return float(match.group(1)) if match else dim
    if "SQ8" in f:
        return float(dim)
    if "SQ4" in f:
        return dim / 2
    if "HNSW" in f:
        match = re.search(r"HNSW(\d+)", f)
        return 4.0 * dim + 8.0 * (int(match.group(1)) if match else 32)
    return 4.0 * dim


def disk_checks(cfg: Any, dm: Any, store: Optional[Any], questions: int, kb_images: int) -> list[Check]:
    """Free disk where the caches go (paths.cache_dir, the KB store, the run root) against what the run writes there,
    estimated from the KB's size: the KB store when not built yet, the KB and query embeddings (float16), the index
    (its factory), a ViT cache for training, the run directory."""
    articles = len(store) if store is not None else None
    source = dm.path("kb_source")
    if articles is None and source is not None and source.is_file():
        articles = int(source.stat().st_size / KB_JSON_BYTES_PER_ARTICLE)
    if not articles:
        return [Check("disk", "estimate", "warn", "no KB store or KB file to estimate the caches from")]
    encoder = cfg.components.image_encoder
    dim = DIMS.get(str(encoder.pretrained), 1280) if not encoder.tiny else 64
    vectors = kb_images if cfg.retrieval.mode == "image_to_image" and kb_images else articles
    width = 2 if cfg.retrieval.embed_dtype == "float16" else 4
    need: dict[Path, dict[str, float]] = {}

    def add(path: Path, what: str, size: float) -> None:
        need.setdefault(_existing_parent(path), {})[what] = size

    cache = Path(cfg.paths.cache_dir)
    store_dir = dm.path("kb_store")
    if store is None and source is not None and source.is_file() and store_dir is not None:
        add(store_dir, "KB store", STORE_PER_SOURCE_BYTE * source.stat().st_size)
    add(Path(cfg.retrieval.embed_dir or cache / "embeddings"), "KB embeddings", vectors * dim * width)
    add(Path(cfg.retrieval.embed_dir or cache / "embeddings"), "query embeddings", questions * dim * width)
    index_dir = Path(cfg.retrieval.index_dir) if cfg.retrieval.index_dir else cache / "indexes"
    if not (index_dir / "manifest.json").is_file():
        add(
            index_dir,
            f"index {cfg.retrieval.index_factory}",
            vectors * _factory_bytes_per_vector(cfg.retrieval.index_factory, dim),
        )
    if cfg.task == "train" and cfg.qff.vit_cache:
        add(Path(cfg.qff.vit_cache), "ViT cache", (questions + articles) * VIT_CACHE_BYTES_PER_IMAGE)
    add(Path(cfg.paths.checkpoints_root), "run directory", questions * RUN_BYTES_PER_QUESTION)
    checks = []
    by_device: dict[int, tuple[Path, dict[str, float]]] = {}
    for path, items in need.items():
        device = path.stat().st_dev
        folder, merged = by_device.setdefault(device, (path, {}))
        for what, size in items.items():
            merged[what] = merged.get(what, 0.0) + size
    for folder, items in by_device.values():
        total = sum(items.values())
        free = shutil.disk_usage(folder).free
        status = "fail" if total > free else "warn" if total > 0.8 * free else "ok"
        parts = ", ".join(f"{what} {_size(size)}" for what, size in items.items())
        checks.append(
            Check(
                "disk",
                str(folder),
                status,
                f"{_size(free)} free, the run writes ~{_size(total)} here "
                f"({parts}; from {articles:,} articles x {dim}-d, {questions:,} questions)",
            )
        )
    return checks


def _size(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
