"""Frozen-ViT feature cache: the same features as the ViT, resumable shards split over processes, stale caches refused."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from qkvqa.cli.cache_vit import build_cache_from_config
from qkvqa.config.load import compose
from qkvqa.data_modules.qff_train import QFFTrainDataModule, settings_from_config
from qkvqa.errors import StaleArtifactError
from qkvqa.qff.builder import build_qff_component
from qkvqa.qff.vit_cache import (
    ViTFeatureCache,
    env_shard_split,
    feature_shape,
    fill_cache,
    image_sources,
    vision_fingerprint,
)
from tests.helpers.qff_study import mine_world


@pytest.fixture(scope="module")
def setup(world, tmp_path_factory):
    """(overrides with mined pools, component, its ViT fingerprint, the images the samples need, a DataModule, work dir)."""
    work = tmp_path_factory.mktemp("vit_cache")
    overrides = mine_world(world, work)
    cfg = compose("demo/qff_per_layer", [], overrides)
    component = build_qff_component(cfg.components.qformer, cfg.qff)
    fingerprint = vision_fingerprint(component.model, component.image_processor)
    dm = QFFTrainDataModule(
        cfg.data, settings_from_config(cfg, component, fingerprint), component.tokenizer, component.image_processor
    )
    dm.setup("fit")
    return overrides, component, fingerprint, dm.needed_images(), dm, work


def write(path, setup, shard_size=16, **kwargs) -> ViTFeatureCache:
    _, component, fingerprint, needed, dm, _ = setup
    cache = ViTFeatureCache.create(
        path, needed, fingerprint, feature_shape(component.model), shard_size, sources=image_sources(dm.config)
    )
    fill_cache(cache, component.model, component.image_processor, dm.collator().load_image, batch_size=8, **kwargs)
    return cache


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_cached_features_equal_the_vit_and_training_batches_read_them(setup, tmp_path):
    _, component, _, needed, dm, _ = setup
    cache = write(tmp_path / "cache", setup)
    assert cache.num_shards == -(-len(needed) // 16) and cache.skipped() == {}
    assert json.loads((tmp_path / "cache/manifest.json").read_text())["dtype"] == "float16"
    assert np.load(tmp_path / "cache/shard-00000.npy", mmap_mode="r").dtype == np.float16
    cached = QFFTrainDataModule(
        dm.config,
        dataclasses.replace(dm.settings, qff=dataclasses.replace(dm.settings.qff, vit_cache=str(tmp_path / "cache"))),
        component.tokenizer,
    )
    cached.setup("fit")
    samples = [dm.dataset("train")[(0, i)] for i in range(3)]
    from_pixels, from_cache = dm.collator()(samples), cached.collator()(samples)
    assert from_cache["image_ids"] == from_pixels["image_ids"] and "pixel_values" not in from_cache
    with torch.no_grad():
        states = component.model.encode_image(from_pixels["pixel_values"])
    assert from_cache["image_features"].dtype == torch.float16
    torch.testing.assert_close(from_cache["image_features"].float(), states, atol=2e-3, rtol=1e-2)


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_a_rerun_writes_only_the_missing_shards_and_processes_split_the_shards(setup, tmp_path):
    path = tmp_path / "cache"
    first = write(path, setup, shard_index=0, num_shards=2)
    assert [i for i in range(first.num_shards) if first.done_record(i)] == list(range(0, first.num_shards, 2))
    with pytest.raises(StaleArtifactError, match="incomplete"):
        ViTFeatureCache.open(path, setup[2], setup[3])
    write(path, setup, shard_index=1, num_shards=2)
    stamps = {p.name: p.stat().st_mtime_ns for p in path.glob("shard-*.npy")}
    (path / "shard-00001.done.json").unlink()
    rerun = ViTFeatureCache.create(
        path, setup[3], setup[2], feature_shape(setup[1].model), 16, sources=image_sources(setup[4].config)
    )
    assert rerun.pending() == [1]
    write(path, setup)
    after = {p.name: p.stat().st_mtime_ns for p in path.glob("shard-*.npy")}
    assert [name for name in stamps if after[name] != stamps[name]] == ["shard-00001.npy"]
    assert ViTFeatureCache.open(path, setup[2], setup[3]).get(setup[3][0]) is not None


@pytest.mark.slow
def test_a_cache_of_another_vit_or_another_image_set_is_refused(setup, tmp_path):
    _, component, fingerprint, needed, _, _ = setup
    path = tmp_path / "cache"
    write(path, setup)
    with pytest.raises(StaleArtifactError, match="another vision model"):
        ViTFeatureCache.open(path, "sha256:" + "0" * 64, needed)
    with pytest.raises(StaleArtifactError, match="lacks 1 of"):
        ViTFeatureCache.open(path, fingerprint, needed + ["article/not/in/the/cache.jpg"])
    with pytest.raises(StaleArtifactError, match="another fingerprint"):
        ViTFeatureCache.create(path, needed, "sha256:other", feature_shape(component.model), 16)
    with pytest.raises(StaleArtifactError, match="another image_set"):
        ViTFeatureCache.create(path, needed[1:], fingerprint, feature_shape(component.model), 16)
    assert ViTFeatureCache.open(path, fingerprint, needed[:5]).get(needed[0]).shape == feature_shape(component.model)


@pytest.mark.slow
def test_a_cache_read_from_other_image_roots_is_refused(setup, tmp_path):
    """Issue 14 item 1: the same image ids under another data.images root are other pixels."""
    _, component, fingerprint, needed, dm, _ = setup
    sources = image_sources(dm.config)
    ViTFeatureCache.create(tmp_path / "c", needed, fingerprint, feature_shape(component.model), 16, sources=sources)
    moved = dataclasses.replace(dm.config, images=dataclasses.replace(dm.config.images, landmarks_root="elsewhere"))
    with pytest.raises(StaleArtifactError, match="another sources"):
        ViTFeatureCache.create(
            tmp_path / "c", needed, fingerprint, feature_shape(component.model), 16, sources=image_sources(moved)
        )
    write(tmp_path / "full", setup)
    ViTFeatureCache.open(tmp_path / "full", fingerprint, needed, sources=sources)
    with pytest.raises(StaleArtifactError, match=r"read from other images \(differing: query: data.root"):
        ViTFeatureCache.open(tmp_path / "full", fingerprint, needed, sources=image_sources(moved))


def test_the_fingerprint_changes_with_the_vit_weights_and_the_preprocessing(setup):
    _, component, fingerprint, _, _, _ = setup
    model = component.model
    with torch.no_grad():
        weight = model.base.vision_model.embeddings.patch_embedding.weight
        saved = weight.clone()
        weight.add_(1e-3)
        changed = vision_fingerprint(model, component.image_processor)
        weight.copy_(saved)
    assert changed != fingerprint
    processor = type(component.image_processor)(
        **{**component.image_processor.to_dict(), "image_mean": [0.5, 0.5, 0.5]}
    )
    assert vision_fingerprint(model, processor) != fingerprint == vision_fingerprint(model, component.image_processor)


@pytest.mark.slow
def test_cache_vit_from_a_config_mines_missing_pools_and_is_resumable(setup, tmp_path, monkeypatch):
    overrides = [o for o in setup[0] if not o.startswith(("qff.negatives", "qff.val_negatives"))]
    monkeypatch.delenv("RANK", raising=False)
    cfg = compose(
        "demo/qff_per_layer",
        [],
        [
            *overrides,
            f"qff.vit_cache={tmp_path / 'cache'}",
            f"retrieval.results={setup[5] / 'stage1_train.json'}",
            "data.val_questions=null",
        ],
    )
    done = build_cache_from_config(cfg, pools_dir=tmp_path / "run")
    assert done["complete"] and done["shards_written"] == done["shards_total"]
    assert (tmp_path / "run/hardneg_train.json").is_file() and not (tmp_path / "run/hardneg_val.json").exists()
    again = build_cache_from_config(cfg, pools_dir=tmp_path / "run")
    assert again["shards_written"] == 0 and again["complete"]


def test_processes_take_their_shards_from_torchrun_or_slurm(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(key, raising=False)
    assert env_shard_split() == (0, 1)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert env_shard_split() == (3, 8)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert env_shard_split() == (1, 2)
