"""CLIP preprocessing: the centre-crop path equals transformers' CLIPImageProcessor; targetpad pads, then resizes."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from qkvqa.errors import ConfigError
from qkvqa.retrieval.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, ClipPreprocess, preprocess_from_options


def _noise_image(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize("size", [(300, 200), (180, 410), (224, 224), (97, 61)])
def test_center_crop_matches_clip_image_processor(size):
    from transformers import CLIPImageProcessor

    image = _noise_image(*size)
    reference = CLIPImageProcessor(
        size={"shortest_edge": 224},
        crop_size={"height": 224, "width": 224},
        do_center_crop=True,
        resample=3,
        image_mean=list(OPENAI_CLIP_MEAN),
        image_std=list(OPENAI_CLIP_STD),
    )(images=[image], return_tensors="np")["pixel_values"]
    ours = ClipPreprocess()([image])
    assert ours.shape == reference.shape == (1, 3, 224, 224)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_targetpad_pads_the_short_side_with_the_pad_colour():
    wide = Image.new("RGB", (400, 100), (255, 255, 255))
    padded = ClipPreprocess(mode="targetpad", pad_color=(0, 0, 0)).pad(wide)
    assert padded.size == (400, 400)
    assert padded.getpixel((200, 0)) == (0, 0, 0) and padded.getpixel((200, 200)) == (255, 255, 255)
    pixels = ClipPreprocess(mode="targetpad", size=32)([wide])[0]
    black = (0 - np.asarray(OPENAI_CLIP_MEAN)) / np.asarray(OPENAI_CLIP_STD)
    np.testing.assert_allclose(pixels[:, 0, 16], black, atol=1e-5)  # top rows are padding
    assert pixels[:, 16, 16].mean() > 1.0  # the middle is the white image
    centre_crop = ClipPreprocess(size=32)([wide])[0]
    assert centre_crop[:, 0, 16].mean() > 1.0  # centre crop has no padding at all


def test_targetpad_leaves_images_within_the_target_ratio_alone():
    image = _noise_image(125, 100)
    assert ClipPreprocess(mode="targetpad", target_ratio=1.25).pad(image) is image
    assert ClipPreprocess(mode="targetpad", target_ratio=1.2).pad(image).size == (125, 105)


def test_options_and_errors():
    pre = preprocess_from_options({"image_size": 64, "preprocess": "targetpad", "pad_color": 255}, 224)
    assert pre.size == 64 and pre.pad_color == (255, 255, 255)
    assert pre.describe() == {"size": 64, "mode": "targetpad", "target_ratio": 1.0, "pad_color": [255, 255, 255]}
    with pytest.raises(ConfigError, match="center_crop"):
        ClipPreprocess(mode="squash")
    with pytest.raises(ConfigError, match="target_ratio"):
        ClipPreprocess(mode="targetpad", target_ratio=0.5)
