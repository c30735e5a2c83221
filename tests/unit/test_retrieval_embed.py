"""Embedding shard sets on the synthetic world: resume recomputes exactly the missing or corrupt shards, skips are counted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf

from qkvqa.components import build_component
from qkvqa.config.load import compose
from qkvqa.data.benchmark import build_benchmark
from qkvqa.errors import ConfigError, DataError
from qkvqa.retrieval import embed

TINY = {"kind": "evaclip_hf", "tiny": True, "device": "cpu", "dtype": "fp32"}


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core box their barriers cost 10x."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QKVQA_TINY_DIR", str(tmp_path_factory.mktemp("tiny")))
        return build_component(TINY)


def world_cfg(world: dict, tmp: Path, **retrieval):
    """A config on the world's E-VQA data with tiny EVA-CLIP encoders and caches under `tmp`."""
    data = yaml.safe_load((Path(world["dir"]) / "data_evqa.yaml").read_text(encoding="utf-8"))
    return OmegaConf.merge(
        compose(),
        {
            "data": data,
            "components": {"image_encoder": TINY, "text_encoder": TINY},
            "paths": {"cache_dir": str(tmp / "cache"), "checkpoints_root": str(tmp / "runs")},
            "retrieval": {"shard_size": 10, **retrieval},
        },
    )


def embed_set(cfg, kind: str, **options):
    """`qkvqa.retrieval.embed.embed_set` over the benchmark of `cfg` as it is now (as `qkvqa embed` builds it)."""
    return embed.embed_set(cfg, kind, benchmark=build_benchmark(cfg.data), **options)


def Embedder(cfg, kind: str, split=None):
    return embed.Embedder(cfg, kind, split, benchmark=build_benchmark(cfg.data))


def _mtimes(emb) -> dict[int, int]:
    return {i: emb.shard_file(i, ".npy").stat().st_mtime_ns for i in range(emb.n_shards)}


@pytest.mark.slow
def test_resume_computes_only_missing_partial_or_corrupt_shards(world, encoder, tmp_path):
    articles = world["counts"]["articles"]
    cfg = world_cfg(world, tmp_path, shard_size=-(-articles // 4))  # four shards
    first = embed_set(cfg, "kb_text", encoder=encoder, max_shards=2)
    assert (first.computed, first.pending, first.set.n_shards) == ([0, 1], [2, 3], 4)
    second = embed_set(cfg, "kb_text", encoder=encoder)
    assert (second.computed, second.reused, second.pending) == ([2, 3], [0, 1], [])
    emb = second.set
    vectors, ids = emb.load_all()
    assert ids == list(range(articles)) and vectors.shape == (articles, encoder.dim)
    assert emb.manifest["dtype"] == "float16"
    before = _mtimes(emb)
    emb.shard_file(1, ".npy").unlink()  # deleted
    with open(emb.shard_file(3, ".npy"), "r+b") as f:  # corrupted in place, same size
        f.seek(-4, 2)
        f.write(b"\xff\xff\xff\xff")
    emb.shard_file(2, ".done.json").unlink()  # died before its done record
    third = embed_set(cfg, "kb_text", encoder=encoder)
    assert (third.computed, third.reused) == ([1, 2, 3], [0])
    after = _mtimes(emb)
    assert after[0] == before[0] and all(after[i] != before[i] for i in (1, 2, 3))
    np.testing.assert_array_equal(emb.load_all()[0], vectors)  # the recomputed shards are identical
    assert embed_set(cfg, "kb_text", encoder=encoder).computed == []


@pytest.mark.slow
def test_processes_split_the_shards(world, encoder, tmp_path):
    cfg = world_cfg(world, tmp_path, shard_size=-(-world["counts"]["articles"] // 4))
    first = embed_set(cfg, "kb_text", encoder=encoder, shard_index=1, num_shards=2)
    assert (first.computed, first.pending) == ([1, 3], [0, 2])
    second = embed_set(cfg, "kb_text", encoder=encoder, shard_index=0, num_shards=2)
    assert (second.computed, second.pending) == ([0, 2], [])
    with pytest.raises(ConfigError, match="shard-index"):
        embed_set(cfg, "kb_text", encoder=encoder, shard_index=2, num_shards=2)


@pytest.mark.slow
def test_kb_images_are_counted_image_by_image(world, encoder, tmp_path):
    cfg = world_cfg(world, tmp_path, mode="image_to_image")
    report = embed_set(cfg, "kb_images", encoder=encoder)
    store = Embedder(cfg, "kb_images").benchmark.kb_store()
    image_urls = {a.row_id: a.image_urls for a in store}
    counts = report.set.counts()
    assert counts["vectors"] + counts["missing_images"] + counts["corrupt_images"] == sum(map(len, image_urls.values()))
    assert counts["articles_without_image_urls"] == sum(1 for urls in image_urls.values() if not urls)
    _, ids = report.set.load_all()
    assert all(url in image_urls[row] for row, url in ids)
    assert {s["reason"] for s in report.set.skipped()} <= {"missing", "corrupt"}
    assert report.summary()["missing_images"] == counts["missing_images"]


@pytest.mark.slow
def test_query_images_skip_the_worlds_deliberately_broken_images(world, encoder, tmp_path):
    cfg = world_cfg(world, tmp_path)
    report = embed_set(cfg, "query_images", split="test", encoder=encoder)
    expected = {
        (s["dataset_name"], s["image_id"], s["reason"])
        for s in world["deliberate_skips"]
        if s["file"] == "evqa/test.csv"
    }
    assert {(s["dataset_name"], s["image_id"], s["reason"]) for s in report.set.skipped()} == expected
    _, ids = report.set.load_all()
    assert len(ids) == len({tuple(i) for i in ids}) == report.set.manifest["n_rows"] - len(expected)
    assert report.set.path.name.startswith("query_images-test-")


@pytest.mark.slow
def test_summaries_replace_the_lead_section_and_change_the_set(world, encoder, tmp_path):
    lead = world_cfg(world, tmp_path)
    store = Embedder(lead, "kb_text").benchmark.kb_store()
    urls = list(store.urls())
    summaries = tmp_path / "summaries.jsonl"
    summaries.write_text(
        json.dumps({"url": urls[0], "summary": "a small grey bird of the Andes"})
        + "\n"
        + json.dumps({"row_id": 5, "summary": "an old stone tower"})
        + "\n",
        encoding="utf-8",
    )
    cfg = world_cfg(world, tmp_path, summary_source="summaries", summaries=str(summaries))
    with_summaries = embed_set(cfg, "kb_text", encoder=encoder)
    with_lead = embed_set(lead, "kb_text", encoder=encoder)
    assert with_summaries.set.path != with_lead.set.path
    assert with_summaries.set.manifest["source"]["summary_source"] == "summaries"
    assert with_summaries.set.counts()["lead_for_missing_summary"] == len(urls) - 2
    a, b = with_summaries.set.load_all()[0], with_lead.set.load_all()[0]
    changed = np.where(np.abs(a - b).max(axis=1) > 1e-3)[0]
    assert changed.tolist() == [0, 5]
    with pytest.raises(ConfigError, match="retrieval.summaries"):
        embed_set(world_cfg(world, tmp_path, summary_source="summaries"), "kb_text", encoder=encoder)


def test_an_encoder_that_is_not_the_configured_one_is_refused(world, tmp_path):
    other = build_component(dict(TINY, options={"seed": 1}))
    with pytest.raises(ConfigError, match="not the one the config names"):
        embed_set(world_cfg(world, tmp_path), "kb_text", encoder=other)


@pytest.mark.slow
def test_the_query_image_set_is_keyed_on_where_its_images_come_from(world, encoder, tmp_path):
    """A wrong image root once left a set full of skips that the fixed config then reused (R@10 44 vs 94)."""
    good = embed_set(world_cfg(world, tmp_path), "query_images", split="test", encoder=encoder)
    wrong = world_cfg(world, tmp_path)
    wrong.data.images.landmarks_root = str(tmp_path / "nowhere")
    with pytest.raises(DataError, match="landmarks image folder"):  # stopped before the encoder runs
        embed_set(wrong, "query_images", split="test", encoder=encoder)
    (tmp_path / "nowhere").mkdir()
    wrong.data.images.max_missing_fraction = 1.0  # raised on purpose: the skips are kept
    bad = embed_set(wrong, "query_images", split="test", encoder=encoder)
    assert bad.set.path != good.set.path and len(bad.set.skipped()) > len(good.set.skipped())
    again = embed_set(world_cfg(world, tmp_path), "query_images", split="test", encoder=encoder)
    assert again.set.path == good.set.path and len(again.set.skipped()) == len(good.set.skipped())
    # a query image mended (or damaged) in place, same path: another set, not the old rows
    import shutil

    shutil.copytree(Path(world["dir"]) / "evqa", tmp_path / "copy" / "evqa")
    copied = world_cfg(world, tmp_path)
    copied.data.root = str(tmp_path / "copy")
    before = Embedder(copied, "query_images", "test").description()
    dm = build_benchmark(copied.data)
    image = next(
        p
        for p in (dm.image_loader.resolver.resolve(q.dataset_name, q.image_id) for q in dm.questions("test"))
        if p is not None
    )
    image.write_bytes(image.read_bytes() + b"\0")
    assert Embedder(copied, "query_images", "test").description() != before
    no_map = world_cfg(world, tmp_path)
    no_map.data.images.inaturalist_id2name = "evqa/missing_id2name.json"
    with pytest.raises(DataError, match=r"missing_id2name\.json: id2name map not found"):
        Embedder(no_map, "query_images", "test").description()  # once "worked" from the cache
