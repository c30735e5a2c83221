"""Issue 44 class 5: a 144-Mpx photo was held three times over (3.3 GB at the peak): `to_rgb`'s `exif_transpose`
returned a copy with nothing to turn, its `convert("RGB")` another, and the CLIP preprocessing a third. An RGB image is
now decoded once and never copied on its way to the resize; an EXIF-rotated one is still turned."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from qkvqa.data.images import to_rgb
from qkvqa.retrieval.preprocess import ClipPreprocess


def _jpeg(size=(300, 200), orientation=None) -> io.BytesIO:
    array = np.zeros((size[1], size[0], 3), dtype=np.uint8)
    array[:, : size[0] // 2] = (250, 10, 10)  # left half red
    buffer = io.BytesIO()
    image = Image.fromarray(array)
    if orientation is None:
        image.save(buffer, "JPEG")
    else:
        exif = Image.Exif()
        exif[0x0112] = orientation
        image.save(buffer, "JPEG", exif=exif.tobytes())
    buffer.seek(0)
    return buffer


def test_an_rgb_photo_is_decoded_once_and_never_copied(monkeypatch):
    copies = []
    real_copy, real_convert = Image.Image.copy, Image.Image.convert
    monkeypatch.setattr(Image.Image, "copy", lambda self: copies.append("copy") or real_copy(self))
    monkeypatch.setattr(
        Image.Image, "convert", lambda self, *a, **k: copies.append("convert") or real_convert(self, *a, **k)
    )
    with Image.open(_jpeg()) as opened:
        image = to_rgb(opened)
    assert image is opened and image.size == (300, 200) and copies == []
    pixels = ClipPreprocess(size=32)([image])
    assert pixels.shape == (1, 3, 32, 32) and copies == []


def test_an_exif_rotated_photo_is_still_turned():
    with Image.open(_jpeg(orientation=6)) as opened:  # 6: turn 90 degrees clockwise to view
        image = to_rgb(opened)
    assert image.size == (200, 300) and image.mode == "RGB"
    top = np.asarray(image)[:10, :, :].mean(axis=(0, 1))
    assert top[0] > 200 and top[1] < 60  # the red left half is on top once turned
