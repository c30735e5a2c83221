"""Issue 44 class 2: image-encoder options and sizes checked before any embedding, in one line naming the option."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from qkvqa.components import build_component
from qkvqa.errors import ConfigError
from qkvqa.retrieval.tiny import write_tiny_clip, write_tiny_evaclip


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["evaclip_hf", "clip_hf", "timm_image"])
def test_an_unknown_option_is_refused_naming_the_nearest_valid_one(kind):
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \{'preproces': \['preprocess'"):
        build_component({"kind": kind, "tiny": True, "device": "cpu", "options": {"preproces": "targetpad"}})


def test_preprocessor_config_mean_and_std_are_used(tmp_path):
    write_tiny_clip(tmp_path / "clip", seed=0)
    image = Image.fromarray(np.full((40, 40, 3), 200, dtype=np.uint8))
    spec = {"kind": "clip_hf", "pretrained": str(tmp_path / "clip"), "device": "cpu"}
    default = build_component(spec)
    (tmp_path / "clip" / "preprocessor_config.json").write_text(
        json.dumps({"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})
    )
    own = build_component(spec)
    assert own.preprocess.mean == (0.5, 0.5, 0.5) and own.preprocess.std == (0.5, 0.5, 0.5)
    assert not np.allclose(own.embed_images([image]), default.embed_images([image]))


def test_a_text_tower_with_fewer_positions_than_max_text_tokens_is_refused(tmp_path):
    write_tiny_evaclip(tmp_path / "eva", seed=0)
    spec = {"kind": "evaclip_hf", "pretrained": str(tmp_path / "eva"), "device": "cpu"}
    with pytest.raises(ConfigError, match=r"options.max_text_tokens=100 .* text tower has 77 positions"):
        build_component({**spec, "options": {"max_text_tokens": 100}})


def test_an_image_size_the_vision_tower_cannot_take_is_refused_naming_the_option(tmp_path):
    write_tiny_clip(tmp_path / "clip", seed=0)
    spec = {"kind": "clip_hf", "pretrained": str(tmp_path / "clip"), "device": "cpu", "options": {"image_size": 64}}
    with pytest.raises(ConfigError, match=r"options.image_size=64 but the checkpoint's vision tower takes 224 x 224"):
        build_component(spec)
