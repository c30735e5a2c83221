"""OMGM's targetpad transform against hand-computed pixels, and the squash alternative."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image

from qkvqa.errors import ConfigError
from qkvqa.qff.image_processing import TargetPadImageProcessor, blip2_image_processor, target_pad

MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073])
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711])
WHITE, BLACK = (1 - MEAN) / STD, (0 - MEAN) / STD


# Issue 32 item 4: OMGM's TargetPad (data_utils.py) pads the short side by int((long / 1.25 - short) / 2) on each
# side, to about 1.25:1, not to a square; then Resize(224) (short side to 224, long int(224 * long / short)),
# CenterCrop(224) (offsets int(round((size - 224) / 2))). Each case: (width, height) -> the padded size, and the
# rows / columns of the 224 x 224 output that are black pad, computed by hand.
GEOMETRY = [
    # 1:1: no pad; 224 x 224 as it is
    ((300, 300), (300, 300), "none"),
    # 4:3 = 1.333 >= 1.25: 400 / 1.25 = 320, vp = int((320 - 300) / 2) = 10 -> 400 x 320; resize -> 280 x 224
    # (224 * 400 / 320 = 280), crop left int(round(28)) = 28; pad rows 10 / 320 * 224 = 7 at top and bottom
    ((400, 300), (400, 320), ("rows", 7)),
    # 3:2 = 1.5: 600 / 1.25 = 480, vp = int((480 - 400) / 2) = 40 -> 600 x 480; resize -> 280 x 224;
    # pad rows 40 / 480 * 224 = 18.67
    ((600, 400), (600, 480), ("rows", 18.67)),
    # portrait 3:4: 400 / 1.25 = 320, hp = int((320 - 300) / 2) = 10 -> 320 x 400; resize -> 224 x 280, crop top 28;
    # pad columns 7 at left and right
    ((300, 400), (320, 400), ("cols", 7)),
    # 2.5:1 (the old test's image): 50 / 1.25 = 40, vp = int((40 - 20) / 2) = 10 -> 50 x 40; resize -> 280 x 224;
    # pad rows 10 / 40 * 224 = 56 (the old full-square pad made them 67.2)
    ((50, 20), (50, 40), ("rows", 56)),
]


@pytest.mark.parametrize("size, padded_size, band", GEOMETRY)
def test_omgm_target_pad_geometry_by_hand(size, padded_size, band):
    image = Image.new("RGB", size, "white")
    padded = target_pad(image)
    assert padded.size == padded_size
    pixels = TargetPadImageProcessor(224)(images=[image])["pixel_values"][0]
    assert pixels.shape == (3, 224, 224)
    if band == "none":
        torch.testing.assert_close(pixels, WHITE[:, None, None].expand(3, 224, 224), atol=1e-5, rtol=0)
        return
    axis, width = band
    line = pixels[:, :, 112] if axis == "rows" else pixels[:, 112, :]  # across the bands
    # bicubic blurs two source pixels each way: two output pixels when shrinking, 2 * scale when enlarging
    blur = math.ceil(2 * max(1.0, 224 / min(padded_size))) + 1
    inside, outside = int(width) - blur, math.ceil(width) + blur
    for i in [*range(0, inside), *range(224 - inside, 224)]:
        torch.testing.assert_close(line[:, i], BLACK, atol=1e-5, rtol=0)
    for i in range(outside, 224 - outside):
        torch.testing.assert_close(line[:, i], WHITE, atol=1e-5, rtol=0)
    # along the bands nothing is padded: a white line through the middle from edge to edge
    along = pixels[:, 112, :] if axis == "rows" else pixels[:, :, 112]
    torch.testing.assert_close(along, WHITE[:, None].expand(3, 224), atol=1e-5, rtol=0)


def omgm_reference(image, side=224, ratio=1.25):
    """OMGM's targetpad_transform(1.25, side) written again from its data_utils.py with torchvision (the reference)."""
    import torchvision.transforms.functional as F
    from torchvision.transforms import CenterCrop, Compose, Normalize, Resize, ToTensor

    def target_pad_omgm(img):
        w, h = img.size
        if max(w, h) / min(w, h) < ratio:
            return img
        scaled = max(w, h) / ratio
        hp, vp = max(int((scaled - w) / 2), 0), max(int((scaled - h) / 2), 0)
        return F.pad(img, [hp, vp, hp, vp], 0, "constant")

    return Compose(
        [
            target_pad_omgm,
            Resize(side, interpolation=F.InterpolationMode.BICUBIC),
            CenterCrop(side),
            lambda img: img.convert("RGB"),
            ToTensor(),
            Normalize(MEAN.tolist(), STD.tolist()),
        ]
    )(image)


@pytest.mark.parametrize(
    "size", [(300, 300), (400, 300), (600, 400), (300, 400), (641, 427), (333, 500), (50, 20), (500, 401), (257, 224)]
)
def test_the_processor_equals_omgm_s_torchvision_transform(size):
    generator = torch.Generator().manual_seed(sum(size))
    noise = (torch.rand((size[1], size[0], 3), generator=generator) * 255).to(torch.uint8).numpy()
    image = Image.fromarray(noise, "RGB")
    ours = TargetPadImageProcessor(224)(images=[image])["pixel_values"][0]
    torch.testing.assert_close(ours, omgm_reference(image), atol=1e-5, rtol=0)


def test_a_qff_trained_with_the_old_square_geometry_is_refused_by_name(tmp_path):
    import json

    from qkvqa.config.schema import QFFConfig
    from qkvqa.errors import StaleArtifactError
    from qkvqa.qff.builder import _check_preprocessing
    from qkvqa.qff.model import CHECKPOINT_CONFIG

    (tmp_path / CHECKPOINT_CONFIG).write_text(
        json.dumps({"preprocessing": {"image_transform": "targetpad", "blip_text_preprocess": True}})
    )  # no image_geometry
    with pytest.raises(
        StaleArtifactError,
        match=r"trained with image geometry targetpad_square .* OMGM's "
        r"omgm_targetpad_1\.25 .* Retrain the QFF",
    ):
        _check_preprocessing(tmp_path, QFFConfig())
    (tmp_path / CHECKPOINT_CONFIG).write_text(
        json.dumps(
            {
                "preprocessing": {
                    "image_transform": "targetpad",
                    "image_geometry": "omgm_targetpad_1.25",
                    "blip_text_preprocess": True,
                }
            }
        )
    )
    _check_preprocessing(tmp_path, QFFConfig())  # today's geometry loads


def test_a_nearly_square_image_is_resized_and_centre_cropped_without_padding():
    image = Image.new("RGB", (60, 50), "black")  # 1.2 : 1, below the ratio: no padding
    for x in [*range(15), *range(45, 60)]:  # white side stripes, 15 columns each
        for y in range(50):
            image.putpixel((x, y), (255, 255, 255))
    assert target_pad(image) is image
    pixels = TargetPadImageProcessor(100)(images=[image])["pixel_values"][0]
    # short side 50 -> 100, long side 60 -> 120; the centre 100 columns are image columns 5..55, so
    # 10 of each stripe's 15 columns remain: output columns 0..19 and 80..99
    assert pixels.shape == (3, 100, 100)
    torch.testing.assert_close(pixels[:, 0, 5], WHITE, atol=1e-5, rtol=0)  # a top row: no black band
    torch.testing.assert_close(pixels[:, 50, 50], BLACK, atol=1e-5, rtol=0)
    torch.testing.assert_close(pixels[:, 50, 94], WHITE, atol=1e-5, rtol=0)


def test_squash_stretches_and_an_unknown_transform_is_refused():
    image = Image.new("RGB", (50, 20), "white")
    squashed = blip2_image_processor(224, "squash")(images=[image], return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(squashed[0, :, 10, 112], WHITE, atol=1e-4, rtol=0)  # no black band
    with pytest.raises(ConfigError, match="image_transform"):
        blip2_image_processor(224, "letterbox")


def test_the_vit_cache_fingerprint_follows_the_image_geometry():
    """A ViT cache written with the earlier square pad has the same transform name and ratio; the geometry tells it
    apart, so such a cache is refused instead of feeding old-geometry features to training."""
    from qkvqa.qff.builder import build_qff_component
    from qkvqa.qff.vit_cache import vision_fingerprint

    component = build_qff_component({"kind": "blip2_qff", "tiny": True, "device": "cpu"})
    now = vision_fingerprint(component.model, component.image_processor)
    component.image_processor.geometry = "targetpad_square"
    assert vision_fingerprint(component.model, component.image_processor) != now
