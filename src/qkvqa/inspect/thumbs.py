"""Small JPEG thumbnails of the query images for the inspect site, made once per image file version."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Optional

from qkvqa.utils.io import atomic_write
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

THUMB_PX = 320  # the longer side of a thumbnail
QUALITY = 82


def thumb_name(image: Optional[str]) -> Optional[str]:
    """The thumbnail's file name for an image path: keyed on the path, size and mtime (an edited image gets a new
    one); None when the image is absent or unreadable by stat."""
    if not image:
        return None
    try:
        stat = os.stat(image)
    except OSError:
        return None
    from qkvqa.data.images import IMAGE_DECODE_VERSION

    key = f"{os.path.abspath(image)}\0{stat.st_size}\0{stat.st_mtime_ns}\0{IMAGE_DECODE_VERSION}"
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:20] + ".jpg"


def make_thumb(image: str, target: Path, px: int = THUMB_PX) -> bool:
    """Write a JPEG thumbnail of `image` to `target` (kept when already there); False when PIL cannot read it."""
    if target.exists():
        return True
    from PIL import Image, UnidentifiedImageError

    from qkvqa.data.images import to_rgb

    try:
        with Image.open(image) as img:
            img.draft("RGB", (px, px))  # JPEG: decode at a reduced scale, much faster
            thumb = to_rgb(img)  # EXIF orientation, 16-bit and alpha as the models see them
            thumb.thumbnail((px, px))
    except (OSError, UnidentifiedImageError, ValueError) as e:
        log.warning("no thumbnail for %s: %s", image, e)
        return False
    atomic_write(target, lambda f: thumb.save(f, "JPEG", quality=QUALITY), durable=False)
    return True
