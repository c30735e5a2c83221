"""Released stage-1 indexes import as released (issue 30 item 5); non-finite vectors and a factory other than the
config's are refused (issue 31 item 5).

The files are written here exactly as their owners' code writes them:
- EchoSight (Go2Heart/EchoSight, model/retriever.py `prepare_faiss_index` and `save_faiss_index`, lines 403-405):
  `faiss.IndexFlatIP` over L2-normalised image vectors, `write_index(index, path + "kb_index.faiss")` and
  `pickle.dump(self.faiss_index_ids, f)` to `kb_index_ids.pkl`, where `faiss_index_ids` is a plain list of Python
  ints, the KB entry index of each vector (`[i for i in range(len(kb)) for j in range(len(kb[i].score))]`, so the
  rows of one entry are contiguous). `load_faiss_index` reads it back with plain `pickle.load` (line 420).
- OMGM (ChaoLinAViy/OMGM, model/retriever.py `load_entity_faiss_index`, `I2T_faiss`; test/step1_img2sum.py):
  `summary_llama3.index`, one summary vector per KB entry; a hit's id is the KB entry index itself
  (`self.knowledge_base[index_id]`), with no id file.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.errors import ConfigError, DataError, StaleArtifactError
from qkvqa.retrieval.embed import EmbeddingSet
from qkvqa.retrieval.index import build_index, import_index, load_index, read_id_list, search_articles

ENCODER = {"kind": "test_vectors", "weights": "random", "options": {}}
ENCODERS = {"kb": ENCODER, "query": ENCODER}
N, DIM = 60, 16


@pytest.fixture(scope="module")
def kb(tmp_path_factory) -> KBStore:
    tmp = tmp_path_factory.mktemp("released")
    urls = [f"https://en.wikipedia.org/wiki/E{i}" for i in range(N)]
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
    (tmp / "kb.json").write_text(json.dumps(entries), encoding="utf-8")
    build_kb_store(tmp / "kb.json", tmp / "store")
    return KBStore.open(tmp / "store")


def _unit(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _echosight_files(out: Path, vectors: np.ndarray, ids: list[int]) -> Path:
    """kb_index.faiss + kb_index_ids.pkl as EchoSight's save_faiss_index writes them (note its `path + name`)."""
    import faiss

    out.mkdir(parents=True, exist_ok=True)
    index = faiss.IndexFlatIP(vectors.shape[1])
    scores = np.array(vectors).astype(np.float32)
    faiss.normalize_L2(scores)
    index.add(scores)
    faiss.write_index(index, str(out) + "/" + "kb_index.faiss")
    with open(out / "kb_index_ids.pkl", "wb") as f:
        pickle.dump(ids, f)
    return out


def _brute_force(queries: np.ndarray, vectors: np.ndarray, rows: list[int], k: int) -> list[list[int]]:
    """Articles by their best vector, best first: what EchoSight's image search returns after deduplication."""
    out = []
    for q in queries:
        order = np.argsort(-(vectors @ q), kind="stable")
        ranked = list(dict.fromkeys(rows[i] for i in order))
        out.append(ranked[:k])
    return out


def test_echosights_kb_index_and_id_pickle_import_and_rank_like_the_index(kb, tmp_path):
    images_per_entry = [1 + i % 3 for i in range(N)]
    ids = [i for i in range(N) for _ in range(images_per_entry[i])]  # EchoSight's score_ids, contiguous rows
    vectors = _unit(len(ids), seed=0)
    src = _echosight_files(tmp_path / "evqa_2M_faiss_index", vectors, ids)
    manifest = import_index(
        src / "kb_index.faiss",
        None,
        tmp_path / "index",
        kb_store=kb,
        mode="image_to_image",
        encoders=ENCODERS,
        ids_file=src / "kb_index_ids.pkl",
    )
    assert manifest["count"] == len(ids) and manifest["imported"]["format"] == "id_pickle"
    assert manifest["factory_equivalent"] == "Flat" and manifest["imported"]["unmapped_vectors"] == 0
    loaded = load_index(tmp_path / "index", kb_store=kb, mode="image_to_image", encoders=ENCODERS, factory="Flat")
    assert loaded.vector_rows.tolist() == ids
    queries = _unit(25, seed=1)
    got = [[row for row, _ in hit] for hit in search_articles(loaded, queries, 10)]
    assert got == _brute_force(queries, vectors, ids, 10)


def test_omgms_summary_index_imports_in_kb_order_and_ranks_like_it(kb, tmp_path):
    import faiss

    vectors = _unit(N, seed=2)
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "summary_llama3.index"))
    manifest = import_index(
        tmp_path / "summary_llama3.index",
        None,
        tmp_path / "index",
        kb_store=kb,
        mode="image_to_summary",
        encoders=ENCODERS,
        kb_order=True,
    )
    assert manifest["imported"]["format"] == "kb_order" and "ids" not in manifest["imported"]
    loaded = load_index(tmp_path / "index", kb_store=kb, mode="image_to_summary", encoders=ENCODERS, factory="Flat")
    queries = _unit(20, seed=3)
    got = [[row for row, _ in hit] for hit in search_articles(loaded, queries, 10)]
    D, I = index.search(queries, 10)  # noqa: E741                      # OMGM's I2T_faiss: I is the KB entry index
    assert got == I.tolist()
    fewer = faiss.IndexFlatIP(DIM)
    fewer.add(vectors[: N - 1])
    faiss.write_index(fewer, str(tmp_path / "other.index"))
    with pytest.raises(DataError, match=rf"holds {N - 1} vectors but the KB store .* has {N} articles"):
        import_index(
            tmp_path / "other.index",
            None,
            tmp_path / "index2",
            kb_store=kb,
            mode="image_to_summary",
            encoders=ENCODERS,
            kb_order=True,
        )


class _Payload:
    """Anything a pickle would have to import to build."""

    def __reduce__(self):
        return (Path.touch, (Path("/tmp/qkvqa-pickle-payload-ran"),))


@pytest.mark.parametrize(
    "content, message",
    [
        ([_Payload()], r"the pickle names pathlib\."),
        (np.arange(N), r"the pickle names numpy"),
        ({"ids": list(range(N))}, r"holds a dict; expected a list"),
        ([float(i) for i in range(N)], r"entry 0: float"),
        (list(range(N - 1)), rf"{N - 1} ids, but the index holds {N} vectors"),
        (list(range(1, N + 1)), rf"entry {N - 1}: {N} is not a row of the KB store"),
    ],
)
def test_an_id_pickle_with_anything_but_lists_strings_and_ints_is_refused_naming_the_file(
    kb, tmp_path, content, message
):
    marker = Path("/tmp/qkvqa-pickle-payload-ran")
    marker.unlink(missing_ok=True)
    src = _echosight_files(tmp_path / "src", _unit(N, seed=4), list(range(N)))
    with open(src / "kb_index_ids.pkl", "wb") as f:
        pickle.dump(content, f)
    with pytest.raises(DataError, match=message) as error:
        import_index(
            src / "kb_index.faiss",
            None,
            tmp_path / "index",
            kb_store=kb,
            mode="image_to_image",
            encoders=ENCODERS,
            ids_file=src / "kb_index_ids.pkl",
        )
    assert str(src / "kb_index_ids.pkl") in str(error.value) and not marker.exists()
    assert not (tmp_path / "index" / "manifest.json").exists()


def test_an_id_pickle_of_urls_is_read_and_exactly_one_id_source_is_required(kb, tmp_path):
    urls = list(kb.urls())
    src = _echosight_files(tmp_path / "src", _unit(N, seed=5), list(range(N)))
    with open(src / "urls.pkl", "wb") as f:
        pickle.dump(urls[::-1], f, protocol=2)
    assert read_id_list(src / "urls.pkl", N) == urls[::-1]
    manifest = import_index(
        src / "kb_index.faiss",
        None,
        tmp_path / "index",
        kb_store=kb,
        mode="image_to_image",
        encoders=ENCODERS,
        ids_file=src / "urls.pkl",
    )
    assert np.load(tmp_path / "index/vector_rows.npy").tolist() == list(range(N))[::-1] and manifest["count"] == N
    with pytest.raises(ConfigError, match="exactly one of --urls"):
        import_index(
            src / "kb_index.faiss",
            None,
            tmp_path / "index2",
            kb_store=kb,
            mode="image_to_image",
            encoders=ENCODERS,
            ids_file=src / "urls.pkl",
            kb_order=True,
        )


def _set(path: Path, kb: KBStore, vectors: np.ndarray) -> EmbeddingSet:
    emb = EmbeddingSet.create(
        path,
        {
            "what": "kb_text",
            "encoder": ENCODER,
            "dtype": "float32",
            "shard_size": N,
            "source": {"kb_url_checksum": kb.url_checksum, "kb_articles": len(kb), "summary_source": "lead_section"},
        },
        N,
    )
    return emb


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_vectors_are_refused_when_a_shard_is_written(kb, tmp_path, bad):
    """NaN or Inf rows once went into the index and changed 2 of 30 rankings, exit 0."""
    vectors = _unit(N, seed=6)
    vectors[7, 3] = bad
    emb = _set(tmp_path / "set", kb, vectors)
    with pytest.raises(DataError, match=r"shard-00000\.npy: 1 of 60 vectors hold NaN or Inf \(first: row 7, id 7\)"):
        emb.write_shard(0, vectors, list(range(N)))
    assert emb.done_record(0) is None
    half = _set(tmp_path / "half", kb, vectors).manifest
    emb16 = EmbeddingSet.create(tmp_path / "f16", {**half, "dtype": "float16"}, N)
    big = _unit(N, seed=7)
    big[2] *= 1e6  # finite in float32, Inf in float16
    with pytest.raises(DataError, match=r"first: row 2"):
        emb16.write_shard(0, big, list(range(N)))


def test_non_finite_vectors_are_refused_when_an_index_is_built(kb, tmp_path):
    vectors = _unit(N, seed=8)
    emb = _set(tmp_path / "set", kb, vectors)
    emb.write_shard(0, vectors, list(range(N)))
    npy = emb.shard_file(0, ".npy")
    array = np.load(npy)
    array[11, 0] = np.nan  # a shard damaged after it was written (sha256 mended too)
    np.save(npy, array)
    record = json.loads(emb.shard_file(0, ".done.json").read_text())
    from qkvqa.utils.io import sha256_file

    record["sha256"], record["bytes"] = sha256_file(npy), npy.stat().st_size
    emb.shard_file(0, ".done.json").write_text(json.dumps(record))
    with pytest.raises(DataError, match=r"shard-00000\.npy: row 11 \(id 11\) holds NaN or Inf"):
        build_index(emb, tmp_path / "index", kb_store=kb, factory="Flat", query_encoder=ENCODER)
    assert not (tmp_path / "index" / "manifest.json").exists()


def test_an_index_of_another_factory_than_the_configs_is_refused(kb, tmp_path):
    """A Flat index_dir once served an HNSW32 config, and the run recorded HNSW32."""
    import faiss

    vectors = _unit(N, seed=9)
    emb = _set(tmp_path / "set", kb, vectors)
    emb.write_shard(0, vectors, list(range(N)))
    build_index(emb, tmp_path / "flat", kb_store=kb, factory="Flat", query_encoder=ENCODER)
    assert load_index(tmp_path / "flat", kb_store=kb, factory="Flat").manifest["factory"] == "Flat"
    with pytest.raises(StaleArtifactError, match=r"index factory: index Flat, config retrieval.index_factory=HNSW32"):
        load_index(tmp_path / "flat", kb_store=kb, factory="HNSW32")
    hnsw = faiss.index_factory(DIM, "HNSW32", faiss.METRIC_INNER_PRODUCT)
    hnsw.add(vectors)
    faiss.write_index(hnsw, str(tmp_path / "knn.index"))
    (tmp_path / "knn.json").write_text(json.dumps([[u, "s"] for u in kb.urls()]))
    manifest = import_index(
        tmp_path / "knn.index",
        tmp_path / "knn.json",
        tmp_path / "imported",
        kb_store=kb,
        mode="image_to_summary",
        encoders=ENCODERS,
    )
    assert manifest["factory_equivalent"] == "HNSW32"
    assert load_index(tmp_path / "imported", kb_store=kb, factory="HNSW32").index.ntotal == N
    with pytest.raises(
        StaleArtifactError,
        match=r"index factory: index HNSW32 \(imported imported \(IndexHNSWFlat\)\)"
        r", config retrieval.index_factory=Flat",
    ):
        load_index(tmp_path / "imported", kb_store=kb, factory="Flat")


@pytest.mark.slow
def test_stage_1_names_its_text_from_the_index_it_searched(kb, tmp_path):
    """Issue 32 item 3: the paper retrieves with OMGM's LLaMA-3 summary index; the card names what the index holds,
    and the lead sections (the default) are a reason for "no" while an imported OMGM index or summaries are not."""
    import faiss

    from qkvqa.config.load import compose
    from qkvqa.pipeline.protocol import not_comparable_because, used_components
    from qkvqa.retrieval.retrieve import index_text_source

    vectors = _unit(N, seed=10)
    emb = _set(tmp_path / "set", kb, vectors)
    emb.write_shard(0, vectors, list(range(N)))
    built = build_index(emb, tmp_path / "lead", kb_store=kb, factory="Flat", query_encoder=ENCODER)
    lead = index_text_source(built, str(tmp_path / "lead"))
    assert lead["text"] == "lead_section" and "lead section" in lead["detail"]
    index = faiss.IndexFlatIP(DIM)
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "summary_llama3.index"))
    imported = import_index(
        tmp_path / "summary_llama3.index",
        None,
        tmp_path / "omgm",
        kb_store=kb,
        mode="image_to_summary",
        encoders=ENCODERS,
        kb_order=True,
    )
    omgm = index_text_source(imported, str(tmp_path / "omgm"))
    assert omgm["text"] == "llama3_summaries" and "summary_llama3.index" in omgm["detail"]
    knn = import_index(
        tmp_path / "summary_llama3.index",
        None,
        tmp_path / "other",
        kb_store=kb,
        mode="image_to_summary",
        encoders=ENCODERS,
        ids_file=None,
        kb_order=True,
    )
    assert (
        index_text_source({**knn, "imported": {**knn["imported"], "format": "url_list"}}, "x")["text"]
        == "imported url_list"
    )

    cfg = compose("eval/evqa_qwen", [], ["qff.checkpoint=checkpoints/evqa_qff/qff"])
    scores = {
        "dataset": "evqa",
        "n_questions": 5750,
        "n_skipped": 0,
        "exclude_skipped": False,
        "two_hop_rows": True,
        "question_set": {},
        "benchmark": {"label": "BEM"},
    }
    because = not_comparable_because(cfg, {**scores, "stage1_text": lead}, used_components(cfg))
    assert because == [
        "stage 1 embeds lead_section where the row uses OMGM's LLaMA-3 article summaries (import "
        "OMGM's summary index, or `qkvqa summarize`; docs/retrieval.md)"
    ]
    assert not_comparable_because(cfg, {**scores, "stage1_text": omgm}, used_components(cfg)) == []
