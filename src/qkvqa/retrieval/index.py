"""faiss indexes over KB embedding sets: factory-string builds (GPU when present), manifests, stale checks, article search.

An index directory holds `index.faiss`, `vector_rows.npy` (int64: vector row -> KB row, the KB
entry index both anchors use) and `manifest.json`, written last: mode, factory string, metric,
dim, vector count, KB URL checksum and article count, the encoders of both sides, the text source
(lead section or summaries), the embedding set it came from and the images skipped there.
"""

from __future__ import annotations

import os
import pickle
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from qkvqa.errors import ConfigError, DataError, StaleArtifactError
from qkvqa.retrieval.embed import EmbeddingSet, check_mode, kb_content, non_finite_rows
from qkvqa.utils.io import atomic_write_json, read_json
from qkvqa.utils.logging import get_logger
from qkvqa.utils.own_files import refuse_link
from qkvqa.utils.progress import progress

log = get_logger(__name__)

INDEX_FORMAT = 1
INDEX_FILE = "index.faiss"
ROWS_FILE = "vector_rows.npy"
MANIFEST_FILE = "manifest.json"
MODE_OF_SET = {"kb_text": "image_to_summary", "kb_images": "image_to_image"}


def factory_slug(factory: str) -> str:
    """A directory-safe form of a factory string (`IVF4096,PQ64` -> `IVF4096_PQ64`)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", factory).strip("_")


def gpu_available() -> bool:
    """True when this faiss build has GPU support and sees a GPU."""
    import faiss

    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def _ivf_nlist(index) -> Optional[int]:
    import faiss

    try:
        return int(faiss.extract_index_ivf(index).nlist)
    except RuntimeError:
        return None


def _skip_polysemous_training(index) -> None:
    """PQ indexes from index_factory run polysemous training (simulated annealing over the codes, for Hamming
    filtering we never use), which costs far more than the PQ k-means itself: switch it off."""
    import faiss

    candidates = [faiss.downcast_index(index)]
    try:
        candidates.append(faiss.downcast_index(faiss.extract_index_ivf(index)))
    except RuntimeError:
        pass
    for candidate in candidates:
        if hasattr(candidate, "do_polysemous_training"):
            candidate.do_polysemous_training = False


def _reserve_flat_storage(index, count: int) -> None:
    """Size the code vector of a flat-coded storage (Flat, the vectors of HNSW) once, up front.

    Batched adds grow it by doubling, which peaks at 1.5x the final size (measured); resizing it to the
    final size and back to 0 keeps the capacity, so the peak stays at the index's own size.
    """
    import faiss

    target = faiss.downcast_index(index)
    storage = faiss.downcast_index(target.storage) if isinstance(target, faiss.IndexHNSW) else target
    if isinstance(storage, faiss.IndexFlatCodes):
        storage.codes.resize(count * storage.code_size)
        storage.codes.resize(0)


def _to_gpu(index, what: str):
    """The index on every GPU, or the CPU index when this index type has no GPU version."""
    import faiss

    try:
        return faiss.index_cpu_to_all_gpus(index), True
    except RuntimeError as e:
        log.info("%s stays on CPU (no GPU version of this index type: %s)", what, str(e).splitlines()[0])
        return index, False


def _sample(emb: EmbeddingSet, records: dict[int, dict], n: int, seed: int) -> np.ndarray:
    """`n` vectors drawn uniformly without replacement (seeded), as float32."""
    counts = np.array([int(records[i]["count"]) for i in range(emb.n_shards)], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    chosen = np.sort(np.random.default_rng(seed).choice(int(offsets[-1]), size=n, replace=False))
    parts = []
    for i in range(emb.n_shards):
        local = chosen[(chosen >= offsets[i]) & (chosen < offsets[i + 1])] - offsets[i]
        if len(local):
            vectors, _ = emb.shard(i)
            parts.append(np.asarray(vectors[local], dtype=np.float32))
    return np.concatenate(parts)


def build_index(
    emb: EmbeddingSet,
    out_dir: str | os.PathLike,
    *,
    kb_store,
    factory: str = "Flat",
    query_encoder: dict,
    train_size: int = 262144,
    add_batch: int = 65536,
    use_gpu: bool = True,
    seed: int = 0,
    rebuild_hint: str = "qkvqa embed",
) -> dict:
    """Build a faiss index (inner product on unit vectors) over a complete KB embedding set; returns the manifest.

    Untrained index types (IVF, PQ) train on `train_size` vectors sampled with `seed`; vectors are then
    converted to float32, re-normalised and added `add_batch` at a time from memory-mapped shards, so
    the RAM beside the index itself stays one batch. `query_encoder` is the identity of the image
    encoder that will embed the queries (recorded and checked at load time).
    """
    import faiss

    started = time.time()
    mode = MODE_OF_SET.get(emb.kind)
    if mode is None:
        raise ConfigError(f"{emb.path} holds {emb.kind} vectors; an index is built over kb_text or kb_images")
    records = emb.require_complete(rebuild_hint)
    source = emb.manifest["source"]
    if source["kb_url_checksum"] != kb_store.url_checksum:
        raise StaleArtifactError(
            f"embedding set {emb.path} was computed for another KB (URL checksum "
            f"{source['kb_url_checksum']}, the KB store {kb_store.store_dir} has "
            f"{kb_store.url_checksum}); re-embed with `{rebuild_hint}`"
        )
    dim = emb.dim(records)
    count = sum(int(r["count"]) for r in records.values())
    if not count or dim is None:
        raise DataError(f"embedding set {emb.path} holds no vectors (skipped: {emb.counts(records)})")
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise ConfigError(
            f"retrieval.index_factory: faiss cannot build {factory!r} ({str(e).splitlines()[0]}); "
            "examples: Flat, IVF4096,Flat, IVF4096,PQ64, HNSW32"
        ) from None
    _skip_polysemous_training(index)
    nlist = _ivf_nlist(index)
    n_train = min(count, int(train_size))
    if nlist is not None and n_train < nlist:
        raise ConfigError(
            f"retrieval.index_factory={factory!r} has {nlist} IVF lists but only {n_train} training "
            f"vectors (faiss wants >= 39 per list); use Flat or IVF{max(1, n_train // 39)},..."
        )
    on_gpu = False
    if use_gpu and gpu_available():
        index, on_gpu = _to_gpu(index, factory)
    needs_training = not index.is_trained
    if needs_training:
        sample = _sample(emb, records, n_train, seed)
        faiss.normalize_L2(sample)
        log.info("training %s on %d vectors (dim %d)%s", factory, len(sample), dim, " on GPU" if on_gpu else "")
        try:
            index.train(sample)
        except RuntimeError as e:
            raise ConfigError(
                f"retrieval.index_factory={factory!r}: training on {len(sample)} vectors failed "
                f"({str(e).splitlines()[0]})"
            ) from None
        del sample
    if not on_gpu:
        _reserve_flat_storage(index, count)
    rows = np.empty(count, dtype=np.int64)
    filled = 0
    with progress(total=count, desc=f"index add {factory}", unit="vec") as bar:
        for shard, vectors, ids in emb.iter_shards():
            for start in range(0, len(vectors), max(1, int(add_batch))):
                chunk = np.array(vectors[start : start + add_batch], dtype=np.float32)
                _check_finite(chunk, start, emb.shard_file(shard, ".npy"), ids, rebuild_hint)
                faiss.normalize_L2(chunk)
                index.add(chunk)
                bar.update(len(chunk))
            rows[filled : filled + len(ids)] = [i if isinstance(i, int) else i[0] for i in ids]
            filled += len(ids)
    if on_gpu:
        index = faiss.index_gpu_to_cpu(index)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)  # the manifest, written last, marks a complete index
    _write_index_files(index, rows, out_dir)
    text_source = None
    if mode == "image_to_summary":
        text_source = {
            "summary_source": source["summary_source"],
            **({"summaries": source["summaries"]} if "summaries" in source else {}),
        }
    kb_skipped, kb_fallbacks = emb.skipped_and_fallbacks(records)
    manifest = {
        "sha256": _file_hashes(out_dir),
        "format": INDEX_FORMAT,
        "mode": mode,
        "factory": factory,
        "metric": "inner_product",
        "dim": int(dim),
        "count": int(count),
        "kb": {
            "url_checksum": kb_store.url_checksum,
            "articles": len(kb_store),
            "content": kb_content(kb_store),  # text edited under the same URLs is another KB (issue 44)
            "store": str(kb_store.store_dir),
        },
        "encoder": {"kb": emb.manifest["encoder"], "query": query_encoder},
        "text_source": text_source,
        "embeddings": {"path": str(emb.path), "what": emb.kind, "dtype": emb.manifest["dtype"]},
        "row_mapping": ROWS_FILE,
        "index_file": INDEX_FILE,
        "trained_on": n_train if needs_training else 0,
        "kb_skipped": kb_skipped,
        "kb_fallbacks": kb_fallbacks,
        "gpu": on_gpu,
        "faiss_version": faiss.__version__,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "build_seconds": round(time.time() - started, 3),
    }
    atomic_write_json(out_dir / MANIFEST_FILE, manifest)
    log.info(
        "index %s: %d vectors, dim %d, %s, %s, built in %.1fs",
        out_dir,
        count,
        dim,
        factory,
        mode,
        manifest["build_seconds"],
    )
    return manifest


def _check_finite(chunk: np.ndarray, start: int, shard: Path, ids: list, rebuild_hint: str) -> None:
    """DataError naming the shard and row of the first NaN or Inf vector (shards written before `write_shard` refused
    them, or edited since): faiss would rank it anywhere, and the run would say nothing."""
    bad = non_finite_rows(chunk)
    if len(bad):
        row = start + int(bad[0])
        raise DataError(
            f"{shard}: row {row} (id {ids[row] if row < len(ids) else '?'}) holds NaN or Inf, "
            f"{len(bad)} such vectors in rows {start}..{start + len(chunk) - 1}; no index is "
            f"built. Delete the shard and recompute it: {rebuild_hint}"
        )


def factory_of(index) -> Optional[str]:
    """The index_factory string an index's faiss type corresponds to (Flat, HNSW32, IVF4096,Flat, IVF4096,PQ64), or
    None for a type this does not know: what an imported index is checked against retrieval.index_factory by."""
    import faiss

    index = faiss.downcast_index(index)
    if isinstance(index, faiss.IndexFlat):
        return "Flat"
    if isinstance(index, faiss.IndexHNSWFlat):
        return f"HNSW{index.hnsw.nb_neighbors(1)}"
    if isinstance(index, faiss.IndexIVFPQ):
        return f"IVF{index.nlist},PQ{index.pq.M}"
    if isinstance(index, faiss.IndexIVFFlat):
        return f"IVF{index.nlist},Flat"
    return None


def _write_index_files(index, rows: np.ndarray, out_dir: Path) -> None:
    """Write index.faiss and vector_rows.npy, each to a partial file renamed into place (the manifest comes last)."""
    import faiss

    from qkvqa.utils.io import atomic_write, remove_dead_partials

    remove_dead_partials(out_dir)  # a SIGKILLed build's index-sized leftovers

    def write_index(f) -> None:
        writer = faiss.PyCallbackIOWriter(f.write)  # streamed: no in-memory copy of a large index
        faiss.write_index(index, writer)
        del writer  # flushes its buffer into f

    atomic_write(out_dir / INDEX_FILE, write_index)
    atomic_write(out_dir / ROWS_FILE, lambda f: np.save(f, rows))


def _file_hashes(out_dir: Path) -> dict:
    """sha256 of the index file and the row mapping, recorded in the manifest and checked at first load."""
    from qkvqa.utils.io import mark_verified, sha256_file

    hashes = {name: sha256_file(out_dir / name) for name in (INDEX_FILE, ROWS_FILE)}
    for name, sha in hashes.items():
        mark_verified(out_dir / name, sha)
    return hashes


def verify_index_files(path: Path, manifest: dict, rebuild_hint: str, force: bool = False) -> list[str]:
    """Check the index's files against the sha256 in its manifest (once per file version unless `force`; indexes
    built before hashes were recorded are not checked); returns the names checked."""
    from qkvqa.utils.io import verify_sha256_once

    hashes = manifest.get("sha256") or {}
    for name, wanted in hashes.items():
        verify_sha256_once(path / name, wanted, "index file", f"rebuild the index: {rebuild_hint}", force=force)
    return list(hashes)


# An imported index may hold vectors whose URL is not in the KB store (they never match); above this share
# the KB is another one than the index was built for, and the import is refused.
MAX_UNMAPPED_SHARE = 0.01


def read_url_list(path: Path, count: int) -> list[str]:
    """The URL of every vector of a foreign index from its JSON list (`values[row][0]` = URL, ReflectiVA's knn.json;
    a plain list of URLs is read too); DataError naming the file and the row otherwise."""
    import json

    try:
        with open(path, encoding="utf-8") as f:
            values = json.load(f)
    except FileNotFoundError:
        raise DataError(f"{path}: URL list not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: malformed JSON ({e}); expected a list with values[row][0] = URL") from None
    if isinstance(values, dict) and all(str(k).isdigit() for k in values):
        values = [values[k] for k in sorted(values, key=int)]
    if not isinstance(values, list):
        raise DataError(f"{path}: expected a JSON list with values[row][0] = URL, found a {type(values).__name__}")
    if len(values) != count:
        raise DataError(f"{path}: {len(values)} entries, but the index holds {count} vectors: not its URL list")
    urls = []
    for row, value in enumerate(values):
        url = value[0] if isinstance(value, (list, tuple)) and value else value
        if not isinstance(url, str) or not url:
            raise DataError(f"{path}: row {row}: expected [URL, ...] or a URL, found {json.dumps(value)[:80]}")
        urls.append(url)
    return urls


class _ListsStringsIntsOnly(pickle.Unpickler):
    """An unpickler that imports nothing: any class or function a pickle names (numpy arrays and ints, `os.system`,
    ...) is refused before it is looked up; `read_id_list` then accepts only a list of ints and strings."""

    def __init__(self, f, path: Path):
        super().__init__(f)
        self.path = path

    def find_class(self, module: str, name: str):
        raise DataError(
            f"{self.path}: the pickle names {module}.{name}; an id list holds only lists, strings and ints "
            f"(EchoSight's kb_index_ids.pkl is pickle.dump of a list of ints), so it is not loaded"
        )

    def persistent_load(self, pid):
        raise DataError(f"{self.path}: the pickle holds a persistent id; an id list holds only lists, strings and ints")


def read_id_list(path: Path, count: int) -> list:
    """EchoSight's `kb_index_ids.pkl` (model/retriever.py `save_faiss_index`: `pickle.dump(self.faiss_index_ids, f)`,
    a list with one KB entry index per vector, the rows of an entry contiguous), read with an unpickler that accepts
    only lists, strings and ints; a string entry is taken as the URL of the vector's article. DataError naming the
    file otherwise (another type, another length, a class or function in the pickle)."""
    try:
        with open(path, "rb") as f:
            values = _ListsStringsIntsOnly(f, path).load()
    except FileNotFoundError:
        raise DataError(f"{path}: id list not found") from None
    except DataError:
        raise
    except Exception as e:  # a truncated or foreign file: pickle's many error types
        raise DataError(f"{path}: not a readable pickle ({type(e).__name__}: {e}); re-download it") from None
    if not isinstance(values, list):
        raise DataError(f"{path}: the pickle holds a {type(values).__name__}; expected a list of KB entry indexes")
    if len(values) != count:
        raise DataError(f"{path}: {len(values)} ids, but the index holds {count} vectors: not its id list")
    for row, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise DataError(
                f"{path}: entry {row}: {type(value).__name__} {str(value)[:60]!r}; expected a KB entry "
                f"index (int) or a URL (str)"
            )
    return values


ID_SOURCES = ("urls", "ids", "kb_order")


def _rows_of_urls(urls: list[str], kb_store, source: Path) -> tuple[np.ndarray, list[str]]:
    rows = np.full(len(urls), -1, dtype=np.int64)
    unmapped = []
    for vector, url in enumerate(progress(urls, desc="index import: URLs -> KB rows", unit="url")):
        try:
            rows[vector] = kb_store.row_of(url)
        except KeyError:
            unmapped.append(url)
    if len(unmapped) > MAX_UNMAPPED_SHARE * len(urls):
        raise DataError(
            f"{source}: {len(unmapped)} of {len(urls)} URLs are not in the KB store {kb_store.store_dir} "
            f"(first: {unmapped[:3]}): the index was built over another KB; build the store from its KB"
        )
    return rows, unmapped


def import_rows(
    index, kb_store, *, urls_file: Optional[Path] = None, ids_file: Optional[Path] = None, kb_order: bool = False
) -> tuple[np.ndarray, list[str], str, Optional[Path]]:
    """(vector -> KB row, unmapped URLs, the source format, its file) of a foreign index, from exactly one of:
    a URL list (ReflectiVA's knn.json), EchoSight's id pickle (KB entry index per vector), or the KB order itself
    (OMGM's summary index: vector i is KB entry i, test/step1_img2sum.py via `self.knowledge_base[index_id]`)."""
    given = [name for name, value in (("urls", urls_file), ("ids", ids_file), ("kb_order", kb_order)) if value]
    if len(given) != 1:
        raise ConfigError(
            f"index import needs exactly one of --urls (a JSON URL list), --ids (EchoSight's "
            f"kb_index_ids.pkl) or --kb-order (OMGM's summary index); got {given or 'none'}"
        )
    count = int(index.ntotal)
    if kb_order:
        if count != len(kb_store):
            raise DataError(
                f"the index holds {count} vectors but the KB store {kb_store.store_dir} has {len(kb_store)} "
                f"articles: a summary index in KB order (OMGM's) has one vector per KB entry, so it was "
                f"built over another KB"
            )
        return np.arange(count, dtype=np.int64), [], "kb_order", None
    if urls_file is not None:
        urls_file = Path(urls_file)
        rows, unmapped = _rows_of_urls(read_url_list(urls_file, count), kb_store, urls_file)
        return rows, unmapped, "url_list", urls_file
    ids_file = Path(ids_file)
    values = read_id_list(ids_file, count)
    if all(isinstance(v, str) for v in values):
        rows, unmapped = _rows_of_urls(values, kb_store, ids_file)
        return rows, unmapped, "id_pickle", ids_file
    bad = next((row for row, v in enumerate(values) if not isinstance(v, int) or not 0 <= v < len(kb_store)), None)
    if bad is not None:
        raise DataError(
            f"{ids_file}: entry {bad}: {values[bad]!r} is not a row of the KB store {kb_store.store_dir} "
            f"({len(kb_store)} articles): the index was built over another KB, or the list mixes URLs "
            f"and indexes"
        )
    return np.asarray(values, dtype=np.int64), [], "id_pickle", ids_file


def import_index(
    index_file: str | os.PathLike,
    urls_file: Optional[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    kb_store,
    mode: str,
    encoders: dict,
    ids_file: Optional[str | os.PathLike] = None,
    kb_order: bool = False,
) -> dict:
    """Adopt a foreign faiss index as an index directory over `kb_store`: ReflectiVA's knn.index with knn.json
    (`urls_file`), EchoSight's kb_index.faiss with kb_index_ids.pkl (`ids_file`) or OMGM's summary index, whose rows
    are in KB order (`kb_order`).

    Each vector is mapped to its KB row; vectors whose URL the KB lacks map to -1 (never returned),
    counted in the manifest, and more than MAX_UNMAPPED_SHARE of them refuse the import. `encoders` are the
    identities the user declares the index was built with (the config's), checked at load time like a
    built index's; the source files' sha256 are recorded. Returns the manifest.
    """
    import faiss

    from qkvqa.utils.io import sha256_file

    started = time.time()
    index_file, out_dir = Path(index_file), Path(out_dir)
    if not index_file.is_file():
        raise DataError(f"{index_file}: faiss index not found")
    try:
        index = faiss.read_index(str(index_file))
    except RuntimeError as e:
        raise DataError(
            f"{index_file}: not a readable faiss index ({str(e).splitlines()[0]}); re-download it"
        ) from None
    rows, unmapped, source_format, source_file = import_rows(
        index,
        kb_store,
        urls_file=Path(urls_file) if urls_file else None,
        ids_file=Path(ids_file) if ids_file else None,
        kb_order=kb_order,
    )
    if unmapped:
        log.warning(
            "%d of %d vectors of %s have a URL the KB lacks (first: %s); they are never returned",
            len(unmapped),
            len(rows),
            index_file,
            unmapped[:3],
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)
    _write_index_files(index, rows, out_dir)
    metric = "inner_product" if index.metric_type == faiss.METRIC_INNER_PRODUCT else f"faiss metric {index.metric_type}"
    manifest = {
        "sha256": _file_hashes(out_dir),
        "format": INDEX_FORMAT,
        "mode": mode,
        "factory": f"imported ({type(faiss.downcast_index(index)).__name__})",
        "factory_equivalent": factory_of(index),
        "metric": metric,
        "dim": int(index.d),
        "count": int(index.ntotal),
        "kb": {
            "url_checksum": kb_store.url_checksum,
            "articles": len(kb_store),
            "content": kb_content(kb_store),  # text edited under the same URLs is another KB (issue 44)
            "store": str(kb_store.store_dir),
        },
        "encoder": dict(encoders),
        "text_source": None,
        "imported": {
            "index": {"path": str(index_file.resolve()), "sha256": sha256_file(index_file)},
            "format": source_format,
            **(
                {
                    "urls" if source_format == "url_list" else "ids": {
                        "path": str(source_file.resolve()),
                        "sha256": sha256_file(source_file),
                    }
                }
                if source_file is not None
                else {}
            ),
            "unmapped_vectors": len(unmapped),
            "unmapped_examples": unmapped[:5],
        },
        "row_mapping": ROWS_FILE,
        "index_file": INDEX_FILE,
        "trained_on": 0,
        "kb_skipped": {},
        "kb_fallbacks": {},
        "gpu": False,
        "faiss_version": faiss.__version__,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "build_seconds": round(time.time() - started, 3),
    }
    atomic_write_json(out_dir / MANIFEST_FILE, manifest)
    log.info(
        "index %s: imported %d vectors (dim %d, %s) from %s; %d URLs not in the KB",
        out_dir,
        index.ntotal,
        index.d,
        metric,
        index_file,
        len(unmapped),
    )
    return manifest


@dataclass
class LoadedIndex:
    """A faiss index with its manifest and vector -> KB row mapping."""

    path: Path
    index: Any
    manifest: dict
    vector_rows: np.ndarray

    @property
    def mode(self) -> str:
        return self.manifest["mode"]

    @property
    def dim(self) -> int:
        return int(self.manifest["dim"])

    def set_search_params(self, nprobe: Optional[int] = None, ef_search: Optional[int] = None) -> None:
        """nprobe for IVF indexes and efSearch for HNSW ones (ignored by index types without them)."""
        import faiss

        space = faiss.GpuParameterSpace() if "Gpu" in type(self.index).__name__ else faiss.ParameterSpace()
        for name, value in (("nprobe", nprobe), ("efSearch", ef_search)):
            if value is None:
                continue
            try:
                space.set_index_parameter(self.index, name, int(value))
            except RuntimeError:
                pass  # this index type has no such parameter

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, KB rows) [N, k] of the k nearest vectors; row -1 where fewer than k were found."""
        import faiss

        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dim:
            raise StaleArtifactError(
                f"query vectors have dim {queries.shape[-1]} but the index {self.path} has dim "
                f"{self.dim}: the query encoder is not the one the index was built for"
            )
        faiss.normalize_L2(queries)
        k = min(int(k), int(self.index.ntotal))
        scores, ids = self.index.search(queries, k)
        rows = np.where(ids >= 0, self.vector_rows[np.clip(ids, 0, None)], -1)  # -1: padding or an unmapped vector
        return scores, rows


def manifest_factory(manifest: dict) -> Optional[str]:
    """The factory string an index was built with (an imported one: the one its faiss type corresponds to), or None."""
    if manifest.get("imported"):
        return manifest.get("factory_equivalent")
    return manifest.get("factory")


def index_differences(
    manifest: dict,
    *,
    kb_store,
    mode: Optional[str] = None,
    encoders: Optional[dict] = None,
    factory: Optional[str] = None,
) -> list[str]:
    """What differs between an index manifest and the KB store / expected mode / encoders / `factory` (the config's
    retrieval.index_factory) (empty when it fits). An imported index of a faiss type `factory_of` does not know
    is not compared by factory."""
    diffs = []
    if manifest.get("format") != INDEX_FORMAT:
        diffs.append(f"index format {manifest.get('format')} (this qkvqa writes {INDEX_FORMAT})")
    kb = manifest.get("kb", {})
    if kb.get("url_checksum") != kb_store.url_checksum:
        diffs.append(f"KB URL checksum: index {kb.get('url_checksum')}, KB store {kb_store.url_checksum}")
    if kb.get("content") and kb_content(kb_store) and kb.get("content") != kb_content(kb_store):
        diffs.append(f"KB content (sha256): index {kb.get('content')[:12]}, KB store {kb_content(kb_store)[:12]}")
    if kb.get("articles") != len(kb_store):
        diffs.append(f"KB article count: index {kb.get('articles')}, KB store {len(kb_store)}")
    if mode is not None and manifest.get("mode") != mode:
        diffs.append(f"mode: index {manifest.get('mode')}, config {mode}")
    for side, expected in (encoders or {}).items():
        built = manifest.get("encoder", {}).get(side)
        if expected is not None and built != expected:
            diffs.append(f"{side} encoder: index {built}, config {expected}")
    built_factory = manifest_factory(manifest)
    if (
        factory is not None
        and built_factory is not None
        and re.sub(r"\s+", "", built_factory) != re.sub(r"\s+", "", factory)
    ):
        diffs.append(
            f"index factory: index {built_factory}"
            f"{' (imported ' + str(manifest.get('factory')) + ')' if manifest.get('imported') else ''}, "
            f"config retrieval.index_factory={factory}"
        )
    return diffs


def load_index(
    index_dir: str | os.PathLike,
    *,
    kb_store,
    mode: Optional[str] = None,
    encoders: Optional[dict] = None,
    factory: Optional[str] = None,
    use_gpu: bool = False,
    rebuild_hint: str = "qkvqa embed ... && qkvqa index build ...",
) -> LoadedIndex:
    """Open an index and refuse it (StaleArtifactError saying what differs and how to rebuild) when its
    manifest does not match the KB store, the expected `mode`, `encoders` ({"kb": id, "query": id}) or `factory`
    (retrieval.index_factory: a Flat index is not used, and recorded, as HNSW32), or its files disagree with the
    manifest (count, dim)."""
    import faiss

    path = Path(index_dir)
    if not refuse_link(path / MANIFEST_FILE).is_file():  # a link planted in a shared cache is never followed
        raise StaleArtifactError(f"no complete index at {path} (manifest.json missing); build it with `{rebuild_hint}`")
    manifest = read_json(path / MANIFEST_FILE)
    if mode is not None:
        check_mode(mode)
    diffs = index_differences(manifest, kb_store=kb_store, mode=mode, encoders=encoders, factory=factory)
    if not diffs:
        verify_index_files(path, manifest, rebuild_hint)
    index_file, rows_file = path / manifest.get("index_file", INDEX_FILE), path / manifest.get("row_mapping", ROWS_FILE)
    try:
        index = faiss.read_index(str(index_file))
    except RuntimeError as e:
        raise DataError(
            f"{index_file}: not a readable faiss index ({str(e).splitlines()[0]}); rebuild it: {rebuild_hint}"
        ) from None
    try:
        rows = np.load(rows_file)
    except (OSError, ValueError) as e:
        raise DataError(f"{rows_file}: unreadable row mapping ({e}); rebuild the index: {rebuild_hint}") from None
    if index.ntotal != manifest.get("count") or len(rows) != manifest.get("count"):
        diffs.append(
            f"vector count: manifest {manifest.get('count')}, {INDEX_FILE} {index.ntotal}, {ROWS_FILE} {len(rows)}"
        )
    if index.d != manifest.get("dim"):
        diffs.append(f"dim: manifest {manifest.get('dim')}, {INDEX_FILE} {index.d}")
    unmapped = int((manifest.get("imported") or {}).get("unmapped_vectors", 0))
    if len(rows) and (int((rows < 0).sum()) != unmapped or rows.max() >= len(kb_store)):
        diffs.append(
            f"KB rows out of range: {ROWS_FILE} spans {rows.min()}..{rows.max()} with {int((rows < 0).sum())} "
            f"unmapped (the manifest says {unmapped}), KB has {len(kb_store)}"
        )
    if diffs:
        raise StaleArtifactError(f"index {path} does not match: " + "; ".join(diffs) + f". Rebuild it: {rebuild_hint}")
    if use_gpu and gpu_available():
        index, _ = _to_gpu(index, str(path))
    return LoadedIndex(path, index, manifest, rows)


def search_articles(
    loaded: LoadedIndex,
    queries: np.ndarray,
    k: int,
    *,
    nprobe: Optional[int] = None,
    ef_search: Optional[int] = None,
    image_search_factor: int = 4,
    batch_size: int = 4096,
) -> list[list[tuple[int, float]]]:
    """Top-k (KB row, similarity) per query, best first, at most one entry per article.

    image_to_summary: one vector per article, the k nearest. image_to_image: vectors are images, so
    k * image_search_factor images are searched and deduplicated by article keeping each article's best
    image (EchoSight); queries left with fewer than k articles are searched again with 4x more images
    until k articles are found or the whole index is covered.
    """
    loaded.set_search_params(nprobe, ef_search)
    ntotal = int(loaded.index.ntotal)
    out: list[list[tuple[int, float]]] = []
    for start in range(0, len(queries), max(1, int(batch_size))):
        batch = queries[start : start + batch_size]
        if loaded.mode == "image_to_summary":
            scores, rows = loaded.search(batch, k)
            out.extend(_dedupe(r, s, k) for r, s in zip(rows, scores))
            continue
        width = min(ntotal, k * max(1, int(image_search_factor)))
        results: list[Optional[list]] = [None] * len(batch)
        todo = np.arange(len(batch))
        while len(todo):
            scores, rows = loaded.search(batch[todo], width)
            short = []
            for j, r, s in zip(todo, rows, scores):
                results[j] = _dedupe(r, s, k)
                if len(results[j]) < k and width < ntotal:
                    short.append(j)
            todo = np.array(short, dtype=np.int64)
            width = min(ntotal, width * 4)
        out.extend(results)
    return out


def _dedupe(rows: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The first (best) hit of each article, at most k, skipping faiss's -1 padding."""
    seen: dict[int, float] = {}
    for row, score in zip(rows.tolist(), scores.tolist()):
        if row >= 0 and row not in seen:
            seen[row] = score
            if len(seen) == k:
                break
    return list(seen.items())
