"""faiss indexes over embedding sets: build by factory string, batched adds, article search, stale-index refusal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.errors import ConfigError, DataError, StaleArtifactError
from qkvqa.retrieval.embed import EmbeddingSet
from qkvqa.retrieval.index import build_index, import_index, load_index, search_articles

ENCODER = {"kind": "test_vectors", "weights": "random", "options": {}}


def _kb(tmp: Path, n: int, prefix: str = "A") -> KBStore:
    urls = [f"https://en.wikipedia.org/wiki/{prefix}{i}" for i in range(n)]
    entries = {
        u: {
            "url": u,
            "title": u.rsplit("/", 1)[1],
            "section_titles": ["lead"],
            "section_texts": ["text"],
            "image_urls": [],
            "image_reference_descriptions": [],
            "image_section_indices": [],
        }
        for u in urls
    }
    (tmp / f"kb_{prefix}{n}.json").write_text(json.dumps(entries), encoding="utf-8")
    build_kb_store(tmp / f"kb_{prefix}{n}.json", tmp / f"store_{prefix}{n}")
    return KBStore.open(tmp / f"store_{prefix}{n}")


def _clustered(n: int, dim: int, clusters: int, seed: int) -> np.ndarray:
    """Unit vectors around shared random centres, spread along a shared 8-d subspace plus a little isotropic
    noise (closer to real embeddings, which lie near a low-dimensional manifold, than isotropic noise)."""
    shared, rng = np.random.default_rng(12345), np.random.default_rng(seed)
    centres, basis = shared.normal(size=(clusters, dim)), shared.normal(size=(8, dim)) / np.sqrt(8)
    x = centres[rng.integers(0, clusters, n)] + 0.5 * rng.normal(size=(n, 8)) @ basis + 0.05 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _vector_set(
    path: Path,
    store: KBStore,
    vectors: np.ndarray,
    rows: np.ndarray,
    shard_size: int,
    kind: str = "kb_text",
    dtype: str = "float32",
) -> EmbeddingSet:
    """An embedding set written through the public shard API (as an import of precomputed vectors would)."""
    n_rows = len(store) if kind == "kb_text" else len(vectors)
    emb = EmbeddingSet.create(
        path,
        {
            "what": kind,
            "encoder": ENCODER,
            "dtype": dtype,
            "shard_size": shard_size,
            "source": {
                "kb_url_checksum": store.url_checksum,
                "kb_articles": len(store),
                "summary_source": "lead_section",
            },
        },
        n_rows,
    )
    ids = [int(r) if kind == "kb_text" else [int(r), f"img{j}"] for j, r in enumerate(rows)]
    for i in range(emb.n_shards):
        start, stop = emb.shard_rows(i)
        emb.write_shard(i, vectors[start:stop], ids[start:stop])
    return emb


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """20,000 clustered 32-d article vectors, their KB store and a Flat index over them."""
    tmp = tmp_path_factory.mktemp("big")
    store = _kb(tmp, 20000)
    vectors = _clustered(20000, 32, 64, seed=0)
    emb = _vector_set(tmp / "set", store, vectors, np.arange(20000), shard_size=6000, dtype="float16")
    build_index(emb, tmp / "flat", kb_store=store, factory="Flat", query_encoder=ENCODER, add_batch=5000)
    return tmp, store, emb, load_index(tmp / "flat", kb_store=store)


def _overlap(a, b, k=20) -> float:
    return float(np.mean([len({r for r, _ in x[:k]} & {r for r, _ in y[:k]}) / k for x, y in zip(a, b)]))


@pytest.mark.parametrize(
    "factory,params",
    [("IVF128,Flat", {"nprobe": 16}), pytest.param("HNSW32", {"ef_search": 128}, marks=pytest.mark.slow)],
)
def test_approximate_indexes_reach_flat_recall(big, factory, params):
    tmp, store, emb, flat = big
    queries = _clustered(200, 32, 64, seed=1)
    manifest = build_index(
        emb, tmp / factory, kb_store=store, factory=factory, query_encoder=ENCODER, train_size=8000, add_batch=3000
    )
    assert manifest["count"] == 20000 and manifest["trained_on"] == (8000 if factory.startswith("IVF") else 0)
    approx = load_index(tmp / factory, kb_store=store, mode="image_to_summary")
    exact = search_articles(flat, queries, 20)
    assert _overlap(search_articles(approx, queries, 20, **params), exact) >= 0.9
    if factory.startswith("IVF"):
        assert _overlap(search_articles(approx, queries, 20, nprobe=1), exact) < 0.9  # nprobe is applied


@pytest.mark.slow
def test_ivf_pq_builds_and_searches(big):
    tmp, store, emb, flat = big
    build_index(emb, tmp / "ivfpq", kb_store=store, factory="IVF32,PQ16", query_encoder=ENCODER, train_size=2560)
    ivfpq = load_index(tmp / "ivfpq", kb_store=store)
    queries = _clustered(100, 32, 64, seed=2)
    assert _overlap(search_articles(ivfpq, queries, 20, nprobe=32), search_articles(flat, queries, 20)) > 0.6


def test_flat_finds_each_stored_vector_first_and_maps_rows(big):
    _, _, emb, flat = big
    vectors, ids = emb.shard(1)
    hits = search_articles(flat, np.asarray(vectors[:5], np.float32), 3)
    assert [h[0][0] for h in hits] == ids[:5]
    assert all(h[0][1] > 0.999 and h[0][1] >= h[1][1] >= h[2][1] for h in hits)


def test_image_mode_deduplicates_by_article_and_widens_the_search(tmp_path):
    store = _kb(tmp_path, 10)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(10, 16))
    rows = np.repeat(np.arange(10), 30)  # 30 near-identical images per article
    vectors = centres[rows] + 0.01 * rng.normal(size=(300, 16))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    emb = _vector_set(tmp_path / "set", store, vectors, rows, shard_size=64, kind="kb_images")
    manifest = build_index(emb, tmp_path / "index", kb_store=store, query_encoder=ENCODER, add_batch=50)
    assert manifest["mode"] == "image_to_image" and manifest["text_source"] is None
    index = load_index(tmp_path / "index", kb_store=store, mode="image_to_image")
    np.testing.assert_array_equal(index.vector_rows, rows)
    hits = search_articles(index, vectors[[0, 45]], 5, image_search_factor=1)
    for hit, first in zip(hits, (0, 1)):
        articles = [row for row, _ in hit]
        assert len(articles) == 5 == len(set(articles)) and articles[0] == first
        assert [s for _, s in hit] == sorted((s for _, s in hit), reverse=True)
    assert len(search_articles(index, vectors[:1], 50)[0]) == 10  # never more articles than the KB has


def test_stale_or_mismatched_index_is_refused_with_what_differs(tmp_path):
    store = _kb(tmp_path, 50)
    emb = _vector_set(tmp_path / "set", store, _clustered(50, 8, 4, seed=0), np.arange(50), shard_size=20)
    build_index(emb, tmp_path / "index", kb_store=store, query_encoder=ENCODER)
    hint = "qkvqa index build experiment=x"
    other = _kb(tmp_path, 51, prefix="B")
    with pytest.raises(
        StaleArtifactError, match="KB URL checksum.*KB article count: index 50, KB store 51.*index build"
    ):
        load_index(tmp_path / "index", kb_store=other, rebuild_hint=hint)
    with pytest.raises(StaleArtifactError, match="mode: index image_to_summary, config image_to_image"):
        load_index(tmp_path / "index", kb_store=store, mode="image_to_image")
    changed = dict(ENCODER, weights="other")
    with pytest.raises(StaleArtifactError, match="query encoder"):
        load_index(tmp_path / "index", kb_store=store, encoders={"kb": ENCODER, "query": changed})
    loaded = load_index(tmp_path / "index", kb_store=store, encoders={"kb": ENCODER, "query": ENCODER})
    with pytest.raises(StaleArtifactError, match="dim 4 but the index"):
        loaded.search(np.ones((1, 4), np.float32), 3)
    np.save(tmp_path / "index" / "vector_rows.npy", np.arange(49))
    with pytest.raises(DataError, match=r"vector_rows\.npy: corrupt index file \(sha256.*qkvqa index build"):
        load_index(tmp_path / "index", kb_store=store, rebuild_hint="qkvqa index build")
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    del manifest["sha256"]  # an index built before hashes were recorded
    (tmp_path / "index" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StaleArtifactError, match="vector count"):
        load_index(tmp_path / "index", kb_store=store)
    with pytest.raises(StaleArtifactError, match="another KB"):
        build_index(emb, tmp_path / "index2", kb_store=other, query_encoder=ENCODER)


def test_incomplete_or_corrupt_sets_and_bad_factories_are_refused(tmp_path):
    store = _kb(tmp_path, 60)
    emb = _vector_set(tmp_path / "set", store, _clustered(60, 8, 4, seed=0), np.arange(60), shard_size=25)
    with pytest.raises(ConfigError, match="IVF lists"):
        build_index(emb, tmp_path / "i1", kb_store=store, factory="IVF100,Flat", query_encoder=ENCODER)
    with pytest.raises(ConfigError, match="cannot build 'Nonsense12'"):
        build_index(emb, tmp_path / "i2", kb_store=store, factory="Nonsense12", query_encoder=ENCODER)
    with open(emb.shard_file(1, ".npy"), "r+b") as f:  # flip bytes inside the vectors of shard 1
        f.seek(-8, 2)
        f.write(b"\x00" * 8)
    assert emb.pending() == [1]
    with pytest.raises(StaleArtifactError, match=r"incomplete: 1 of 3 shards missing or corrupt \(1\).*qkvqa embed"):
        build_index(emb, tmp_path / "i3", kb_store=store, query_encoder=ENCODER, rebuild_hint="qkvqa embed x")


def test_a_flipped_byte_in_an_index_file_is_refused_at_first_load_naming_the_file(tmp_path):
    """Issue 14 item 6: a flipped byte in index.faiss changed rankings in silence; now the first load re-hashes it."""
    store = _kb(tmp_path, 40)
    emb = _vector_set(tmp_path / "set", store, _clustered(40, 8, 4, seed=0), np.arange(40), shard_size=40)
    build_index(emb, tmp_path / "index", kb_store=store, query_encoder=ENCODER)
    load_index(tmp_path / "index", kb_store=store)
    assert (tmp_path / "index" / ".index.faiss.verified").is_file()  # later loads skip the re-hash
    path = tmp_path / "index" / "index.faiss"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # inside the vectors: faiss would read it fine
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"index\.faiss: corrupt index file"):
        load_index(tmp_path / "index", kb_store=store)
    path.write_bytes(bytes(data[:100]))
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    del manifest["sha256"]
    (tmp_path / "index" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"index\.faiss: not a readable faiss index"):
        load_index(tmp_path / "index", kb_store=store)


def _foreign(tmp: Path, vectors: np.ndarray, urls: list) -> tuple[Path, Path]:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(tmp / "knn.index"))
    (tmp / "knn.json").write_text(json.dumps([[u, "summary text"] for u in urls]))
    return tmp / "knn.index", tmp / "knn.json"


def test_an_imported_index_maps_each_vector_to_its_kb_row_by_url(tmp_path):
    store = _kb(tmp_path, 200)
    vectors = _clustered(200, 16, 8, seed=1)
    order = np.random.default_rng(0).permutation(200)  # the foreign index holds the articles shuffled
    urls = list(store.urls())
    knn, values = _foreign(tmp_path, vectors[order], [urls[i] for i in order])
    encoders = {"kb": ENCODER, "query": ENCODER}
    manifest = import_index(
        knn, values, tmp_path / "imported", kb_store=store, mode="image_to_summary", encoders=encoders
    )
    assert manifest["count"] == 200 and manifest["imported"]["unmapped_vectors"] == 0
    loaded = load_index(tmp_path / "imported", kb_store=store, mode="image_to_summary", encoders=encoders)
    hits = search_articles(loaded, vectors[:50], k=1)
    assert [h[0][0] for h in hits] == list(range(50))  # each article finds itself, by KB row
    # one URL the KB lacks (0.5%, under the 1% bound) maps to -1 and is never returned
    gone = [urls[i] if i != order[0] else "https://en.wikipedia.org/wiki/Elsewhere" for i in order]
    knn, values = _foreign(tmp_path, vectors[order], gone)
    manifest = import_index(
        knn, values, tmp_path / "partial", kb_store=store, mode="image_to_summary", encoders=encoders
    )
    assert manifest["imported"]["unmapped_vectors"] == 1
    loaded = load_index(tmp_path / "partial", kb_store=store, mode="image_to_summary", encoders=encoders)
    assert all(row != order[0] for hit in search_articles(loaded, vectors, k=5) for row, _ in hit)
    with pytest.raises(StaleArtifactError, match="query encoder"):
        load_index(tmp_path / "partial", kb_store=store, encoders={"query": dict(ENCODER, weights="other")})


def test_an_import_over_another_kb_or_with_a_wrong_url_list_is_refused(tmp_path):
    store = _kb(tmp_path, 100)
    vectors = _clustered(100, 8, 4, seed=2)
    urls = list(store.urls())
    enc = {"kb": ENCODER, "query": ENCODER}
    knn, values = _foreign(tmp_path, vectors, [u.replace("/A", "/B") if i < 5 else u for i, u in enumerate(urls)])
    with pytest.raises(DataError, match=r"knn\.json: 5 of 100 URLs are not in the KB store"):
        import_index(knn, values, tmp_path / "x", kb_store=store, mode="image_to_summary", encoders=enc)
    values.write_text(json.dumps([[u] for u in urls[:99]]))
    with pytest.raises(DataError, match=r"knn\.json: 99 entries, but the index holds 100 vectors"):
        import_index(knn, values, tmp_path / "x", kb_store=store, mode="image_to_summary", encoders=enc)
    values.write_text(json.dumps([[u] for u in urls[:99]] + [[7]]))
    with pytest.raises(DataError, match=r"knn\.json: row 99: expected \[URL, \.\.\.\]"):
        import_index(knn, values, tmp_path / "x", kb_store=store, mode="image_to_summary", encoders=enc)
    knn.write_bytes(b"garbage")
    with pytest.raises(DataError, match=r"knn\.index: not a readable faiss index"):
        import_index(knn, values, tmp_path / "x", kb_store=store, mode="image_to_summary", encoders=enc)
