"""Issue 31 items 2 and 5: query-image paths stay inside their roots; every PIL mode and EXIF orientation is decoded
to the pixels a person sees."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from qkvqa.data.config import ImagesConfig
from qkvqa.data.images import IMAGE_DECODE_VERSION, OUTSIDE_ROOT, ImageLoader, QueryImageResolver, to_rgb
from qkvqa.errors import DataError


def _photo(path, colour=(10, 200, 30), size=(40, 30)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return path


@pytest.fixture
def secret(tmp_path):
    """A photo outside every data root, that no run may read."""
    return _photo(tmp_path / "home" / "private" / "passport.jpg")


def test_an_absolute_or_dotdot_id2name_value_is_a_counted_skip_never_read(tmp_path, secret):
    root = tmp_path / "data"
    _photo(root / "inat" / "train" / "00001_Animalia" / "ok.jpg")
    (root / "inat").mkdir(exist_ok=True)
    (root / "train_id2name.json").write_text(
        json.dumps({"ok": "train/00001_Animalia/ok.jpg", "abs": str(secret), "up": "../../home/private/passport.jpg"})
    )
    config = ImagesConfig(inaturalist_root="inat", inaturalist_id2name="train_id2name.json")
    loader = ImageLoader(QueryImageResolver(config, root=root))
    assert loader.load("inaturalist", "ok").size == (40, 30)
    for image_id in ("abs", "up"):
        assert loader.load("inaturalist", image_id) is None
        assert loader.skipped[("inaturalist", image_id)].reason == OUTSIDE_ROOT
        assert loader.resolver.resolve("inaturalist", image_id) is None
    assert loader.counts()[OUTSIDE_ROOT] == 2


def test_a_dotdot_landmarks_id_is_a_counted_skip(tmp_path, secret):
    root = tmp_path / "data" / "landmarks"
    root.mkdir(parents=True)
    loader = ImageLoader(QueryImageResolver(ImagesConfig(landmarks_root=str(root), landmarks_layout="flat")))
    image_id = "../../home/private/passport"
    assert loader.load("landmarks", image_id) is None
    assert loader.skipped[("landmarks", image_id)].reason == OUTSIDE_ROOT


def test_a_symlink_out_of_the_root_is_not_followed_but_a_symlinked_root_is(tmp_path, secret):
    real = tmp_path / "disk" / "infoseek"
    _photo(real / "oven_1.jpg")
    (real / "oven_2.jpg").symlink_to(secret)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "infoseek").symlink_to(real)  # a root that is a symlink is the user's choice
    loader = ImageLoader(QueryImageResolver(ImagesConfig(infoseek_root="infoseek"), root=tmp_path / "data"))
    assert loader.load("infoseek", "oven_1") is not None
    assert loader.load("infoseek", "oven_2") is None
    assert loader.skipped[("infoseek", "oven_2")].reason == OUTSIDE_ROOT


def test_paths_outside_the_root_count_towards_the_missing_bound_and_name_the_path(tmp_path, secret):
    root = tmp_path / "imgs"
    _photo(root / "a.jpg")
    resolver = QueryImageResolver(ImagesConfig(infoseek_root=str(root), max_missing_fraction=0.1))
    questions = [
        SimpleNamespace(dataset_name="infoseek", image_id="a"),
        SimpleNamespace(dataset_name="infoseek", image_id="../home/private/passport"),
    ]
    with pytest.raises(DataError, match="1 of 2 .*passport.jpg: outside the root, never read"):
        resolver.check_images(questions)


def _pixels(image):
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_a_16_bit_grey_png_is_scaled_not_clipped_to_white(tmp_path):
    grey = np.array([[0, 257 * 64], [257 * 128, 65535]], dtype=np.uint16).repeat(8, 0).repeat(8, 1)
    path = tmp_path / "grey16.png"
    Image.fromarray(grey).save(path)
    with Image.open(path) as image:
        assert image.mode.startswith("I")
        out = _pixels(to_rgb(image))
    assert out[0, 0].tolist() == [0, 0, 0] and out[0, 8].tolist() == [64, 64, 64]
    assert out[8, 0].tolist() == [128, 128, 128] and out[8, 8].tolist() == [255, 255, 255]


def test_a_16_bit_query_image_reaches_the_loader_scaled(tmp_path):
    Image.fromarray(np.full((16, 16), 257 * 100, dtype=np.uint16)).save(tmp_path / "q.png")
    loader = ImageLoader(QueryImageResolver(ImagesConfig(infoseek_root=str(tmp_path), extensions=[".png"])))
    assert _pixels(loader.load("infoseek", "q"))[0, 0].tolist() == [100, 100, 100]


def test_cmyk_gives_the_colours_it_encodes():
    cmyk = Image.new("CMYK", (8, 8), (0, 255, 255, 0))  # no cyan, full magenta and yellow: red
    assert _pixels(to_rgb(cmyk))[0, 0].tolist() == [255, 0, 0]
    assert _pixels(to_rgb(Image.new("CMYK", (8, 8), (0, 0, 0, 255))))[0, 0].tolist() == [0, 0, 0]


def test_palette_with_transparency_is_composited_on_white():
    image = Image.new("P", (8, 8), 1)
    image.putpalette([0, 0, 0, 0, 0, 255] + [0] * 762)  # index 0 black, 1 blue
    image.putpixel((0, 0), 0)
    image.info["transparency"] = 1  # blue is transparent
    out = _pixels(to_rgb(image))
    assert out[1, 1].tolist() == [255, 255, 255] and out[0, 0].tolist() == [0, 0, 0]
    rgba = Image.new("RGBA", (8, 8), (200, 0, 0, 0))  # fully transparent red: white, not red or black
    assert _pixels(to_rgb(rgba))[0, 0].tolist() == [255, 255, 255]
    half = Image.new("LA", (8, 8), (0, 128))
    assert abs(_pixels(to_rgb(half))[0, 0, 0] - 127) <= 1


def _oriented(orientation: int) -> Image.Image:
    """A 4x2 photo, red on its left half and blue on its right, stored with an EXIF orientation tag."""
    base = Image.new("RGB", (4, 2), (0, 0, 255))
    base.paste((255, 0, 0), (0, 0, 2, 2))
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    base.save(buffer, "PNG", exif=exif)
    return Image.open(io.BytesIO(buffer.getvalue()))


@pytest.mark.parametrize(
    "orientation, size, red_at",
    [
        (3, (4, 2), (0, 3)),  # rotated 180: red on the right
        (6, (2, 4), (0, 0)),  # rotate 90 clockwise to view: 2 wide, 4 high, red on top
        (8, (2, 4), (3, 0)),  # rotate 90 counter-clockwise to view: red at the bottom
    ],
)
def test_exif_orientation_is_applied(orientation, size, red_at):
    out = to_rgb(_oriented(orientation))
    assert out.size == size
    assert _pixels(out)[red_at].tolist() == [255, 0, 0]


def test_the_decode_version_is_part_of_the_query_image_identity(tmp_path):
    from qkvqa.data.config import DataConfig
    from qkvqa.data.images import query_images_identity

    identity = query_images_identity(DataConfig(root=str(tmp_path)))
    assert identity["decode_version"] == IMAGE_DECODE_VERSION
