"""OMGM's targetpad transform against hand-computed pixels, and the squash alternative."""
from __future__ import annotations

import pytest
import torch
from PIL import Image

from qkvqa.errors import ConfigError
from qkvqa.qff.image_processing import TargetPadImageProcessor, blip2_image_processor, target_pad

MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073])
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711])
WHITE, BLACK = (1 - MEAN) / STD, (0 - MEAN) / STD


def test_a_wide_image_is_padded_with_black_bands_to_a_centred_square():
    image = Image.new("RGB", (50, 20), "white")            # 2.5 : 1, above the 1.25 ratio
    padded = target_pad(image)
    assert padded.size == (50, 50) and padded.getpixel((25, 5)) == (0, 0, 0) and padded.getpixel((25, 25)) == (255,) * 3
    pixels = TargetPadImageProcessor(224)(images=[image])["pixel_values"]
    assert pixels.shape == (1, 3, 224, 224)
    # bands of 15 of 50 rows -> 67.2 of 224 rows above and below the image (bicubic blurs the edges)
    torch.testing.assert_close(pixels[0, :, 10, 112], BLACK, atol=1e-5, rtol=0)
    torch.testing.assert_close(pixels[0, :, 112, 112], WHITE, atol=1e-5, rtol=0)
    torch.testing.assert_close(pixels[0, :, 213, 112], BLACK, atol=1e-5, rtol=0)


def test_a_nearly_square_image_is_resized_and_centre_cropped_without_padding():
    image = Image.new("RGB", (60, 50), "black")             # 1.2 : 1, below the ratio: no padding
    for x in [*range(15), *range(45, 60)]:                  # white side stripes, 15 columns each
        for y in range(50):
            image.putpixel((x, y), (255, 255, 255))
    assert target_pad(image) is image
    pixels = TargetPadImageProcessor(100)(images=[image])["pixel_values"][0]
    # short side 50 -> 100, long side 60 -> 120; the centre 100 columns are image columns 5..55, so
    # 10 of each stripe's 15 columns remain: output columns 0..19 and 80..99
    assert pixels.shape == (3, 100, 100)
    torch.testing.assert_close(pixels[:, 0, 5], WHITE, atol=1e-5, rtol=0)    # a top row: no black band
    torch.testing.assert_close(pixels[:, 50, 50], BLACK, atol=1e-5, rtol=0)
    torch.testing.assert_close(pixels[:, 50, 94], WHITE, atol=1e-5, rtol=0)


def test_squash_stretches_and_an_unknown_transform_is_refused():
    image = Image.new("RGB", (50, 20), "white")
    squashed = blip2_image_processor(224, "squash")(images=[image], return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(squashed[0, :, 10, 112], WHITE, atol=1e-4, rtol=0)      # no black band
    with pytest.raises(ConfigError, match="image_transform"):
        blip2_image_processor(224, "letterbox")
