"""Issue 44 class 1: derived artifacts keyed on the content they were made from, not on names. Embedding sets and
indexes were keyed on the weights' last two path parts and on the KB's URL checksum: other weights at the same
names, KB text edited under the same URLs and KB images replaced in place reused stale vectors (R@1 8.57 reported
against 25.71 true; 0.0 against 14.29)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from qkvqa.components import ComponentSpec
from qkvqa.config.load import compose
from qkvqa.data.benchmark import build_benchmark
from qkvqa.retrieval import embed
from qkvqa.retrieval.encoders import encoder_identity
from qkvqa.retrieval.tiny import write_tiny_evaclip

TINY = {"kind": "evaclip_hf", "tiny": True, "device": "cpu"}


def _spec(path: Path) -> ComponentSpec:
    return ComponentSpec(kind="evaclip_hf", pretrained=str(path), device="cpu")


def test_two_checkpoints_with_the_same_last_two_path_parts_have_different_identities(tmp_path):
    write_tiny_evaclip(tmp_path / "a" / "x" / "clip", seed=0)
    write_tiny_evaclip(tmp_path / "b" / "x" / "clip", seed=1)
    a, b = (
        encoder_identity(_spec(tmp_path / "a" / "x" / "clip")),
        encoder_identity(_spec(tmp_path / "b" / "x" / "clip")),
    )
    assert a["weights"] == b["weights"] == "x/clip"  # the name, for people
    assert a != b and a["weights_sha256"] != b["weights_sha256"]  # the content, for the cache key
    write_tiny_evaclip(tmp_path / "c" / "x" / "clip", seed=0)
    assert encoder_identity(_spec(tmp_path / "c" / "x" / "clip")) == {**a}  # the same weights elsewhere: one key


def test_new_weights_downloaded_into_the_same_folder_change_the_identity(tmp_path):
    folder = tmp_path / "weights" / "BAAI" / "EVA-CLIP-8B"
    write_tiny_evaclip(folder, seed=0)
    before = encoder_identity(_spec(folder))
    time.sleep(0.01)
    shutil.rmtree(folder)
    write_tiny_evaclip(folder, seed=3)
    assert encoder_identity(_spec(folder))["weights_sha256"] != before["weights_sha256"]


@pytest.fixture
def own_world(world, tmp_path) -> tuple[Path, object]:
    """A copy of the world (its files are changed here) and a config on it with tiny encoders."""
    root = tmp_path / "world"
    shutil.copytree(world["dir"], root)
    data = yaml.safe_load((root / "data_evqa.yaml").read_text(encoding="utf-8"))
    data["root"] = str(root)
    cfg = OmegaConf.merge(
        compose(),
        {
            "data": data,
            "components": {"image_encoder": TINY, "text_encoder": TINY},
            "paths": {"cache_dir": str(tmp_path / "cache"), "checkpoints_root": str(tmp_path / "runs")},
            "retrieval": {"shard_size": 10},
        },
    )
    return root, cfg


def _set_path(cfg, kind: str) -> Path:
    return embed.Embedder(cfg, kind, None, benchmark=build_benchmark(cfg.data)).set_path()


@pytest.mark.slow
def test_kb_text_edited_under_the_same_urls_is_another_embedding_set(own_world):
    from qkvqa.data.kb import build_kb_store

    root, cfg = own_world
    before = _set_path(cfg, "kb_text")
    source = root / cfg.data.kb_source
    kb = json.loads(source.read_text(encoding="utf-8"))
    url = next(iter(kb))
    kb[url]["section_texts"][0] = "An edited lead section, under the same URL. " + kb[url]["section_texts"][0]
    source.write_text(json.dumps(kb), encoding="utf-8")
    shutil.rmtree(root / cfg.data.kb_store)
    build_kb_store(source, root / cfg.data.kb_store)
    assert _set_path(cfg, "kb_text") != before


@pytest.mark.slow
def test_a_kb_image_replaced_in_place_is_another_embedding_set(own_world):
    root, cfg = own_world
    before = _set_path(cfg, "kb_images")
    image = sorted((root / cfg.data.images.kb_image_root).rglob("*.jpg"))[0]
    data = image.read_bytes()
    time.sleep(0.01)
    image.write_bytes(data + b"\0")  # another file under the same name
    assert _set_path(cfg, "kb_images") != before
