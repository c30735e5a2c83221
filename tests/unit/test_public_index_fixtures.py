"""The public conformance fixtures of the released indexes and OMGM's wiki-image folder (tests/fixtures/public/,
written from the owners' code; README.md there names the source lines) read through qkvqa's importers."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from qkvqa.data.config import ImagesConfig
from qkvqa.data.images import ArticleImageIndex
from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.retrieval.index import import_index, load_index, search_articles

PUBLIC = Path(__file__).resolve().parents[1] / "fixtures" / "public"
ENCODER = {"kind": "fixture", "weights": "released", "options": {}}
ENCODERS = {"kb": ENCODER, "query": ENCODER}


@pytest.fixture(scope="module")
def evqa_kb(tmp_path_factory) -> KBStore:
    out = tmp_path_factory.mktemp("public_kb") / "store"
    build_kb_store(PUBLIC / "evqa/encyclopedic_kb_wiki.json", out)
    return KBStore.open(out)


def _queries(index) -> np.ndarray:
    vectors = index.reconstruct_n(0, index.ntotal)
    return vectors + 0.01 * np.random.default_rng(0).normal(size=vectors.shape).astype(np.float32)


def test_echosights_kb_index_fixture_imports_and_ranks_like_itself(evqa_kb, tmp_path):
    import faiss

    source = faiss.read_index(str(PUBLIC / "echosight/kb_index.faiss"))
    ids = pickle.load(open(PUBLIC / "echosight/kb_index_ids.pkl", "rb"))  # trusted: our own fixture
    manifest = import_index(
        PUBLIC / "echosight/kb_index.faiss",
        None,
        tmp_path / "index",
        kb_store=evqa_kb,
        mode="image_to_image",
        encoders=ENCODERS,
        ids_file=PUBLIC / "echosight/kb_index_ids.pkl",
    )
    assert manifest["imported"]["format"] == "id_pickle" and manifest["factory_equivalent"] == "Flat"
    loaded = load_index(tmp_path / "index", kb_store=evqa_kb, mode="image_to_image", factory="Flat")
    queries = _queries(source)
    _, rows = source.search(queries, int(source.ntotal))
    expected = [list(dict.fromkeys(ids[r] for r in row)) for row in rows]  # EchoSight: faiss_index_ids[I]
    assert [[r for r, _ in hit] for hit in search_articles(loaded, queries, len(evqa_kb))] == expected


def test_omgms_summary_index_fixture_imports_in_kb_order(evqa_kb, tmp_path):
    import faiss

    source = faiss.read_index(str(PUBLIC / "omgm/summary_llama3.index"))
    import_index(
        PUBLIC / "omgm/summary_llama3.index",
        None,
        tmp_path / "index",
        kb_store=evqa_kb,
        mode="image_to_summary",
        encoders=ENCODERS,
        kb_order=True,
    )
    loaded = load_index(tmp_path / "index", kb_store=evqa_kb, mode="image_to_summary", factory="Flat")
    queries = _queries(source)
    _, rows = source.search(queries, 3)
    assert [[r for r, _ in hit] for hit in search_articles(loaded, queries, 3)] == rows.tolist()


def test_omgms_wiki_image_fixture_reads_with_the_preset_layout():
    index = ArticleImageIndex.from_config(
        ImagesConfig(kb_image_csvs=["output/wiki_image_url_part_*_processed.csv"], kb_image_root="."),
        root=PUBLIC / "omgm",
    )
    kept = index.images("Grey-crested warbler")
    assert kept and kept[0].path.name == "Grey_crested_warbler.jpg" and kept[0].path.is_file()
    counts = index.missing_counts()
    assert counts["missing"] >= 1  # Warbler_nest.jpg is left missing on purpose
