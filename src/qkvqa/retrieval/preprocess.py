"""CLIP image preprocessing: shortest-edge bicubic resize, centre crop, OpenAI mean/std; optional EchoSight target padding."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image

from qkvqa.errors import ConfigError

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESIZE_MODES = ("center_crop", "targetpad")


@dataclass(frozen=True)
class ClipPreprocess:
    """Turns PIL images into a float32 array [N, 3, size, size] the way CLIPImageProcessor does at 224.

    `mode="center_crop"`: resize the shortest edge to `size` (bicubic), crop the centre square.
    `mode="targetpad"` (EchoSight): first pad the short side, centred, with `pad_color` until the
    long/short ratio is at most `target_ratio` (1.0 pads to a square), then resize and crop as above.
    """

    size: int = 224
    mode: str = "center_crop"
    target_ratio: float = 1.0
    pad_color: tuple[int, int, int] = (0, 0, 0)
    mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    std: tuple[float, float, float] = OPENAI_CLIP_STD

    def __post_init__(self):
        if self.mode not in RESIZE_MODES:
            raise ConfigError(f"image preprocessing mode must be one of {list(RESIZE_MODES)}, got {self.mode!r}")
        if self.target_ratio < 1.0:
            raise ConfigError(
                f"targetpad target_ratio must be >= 1.0 (long side / short side), got {self.target_ratio}"
            )

    def describe(self) -> dict:
        """The settings, for manifests (they change the vectors)."""
        out = {"size": self.size, "mode": self.mode}
        if self.mode == "targetpad":
            out.update(target_ratio=self.target_ratio, pad_color=list(self.pad_color))
        return out

    def pad(self, image: Image.Image) -> Image.Image:
        """Pad the short side (centred) so that long / short <= target_ratio."""
        width, height = image.size
        long_side, short_side = max(width, height), min(width, height)
        if long_side <= short_side * self.target_ratio:
            return image
        new_short = math.ceil(long_side / self.target_ratio)
        new_size = (width, new_short) if width >= height else (new_short, height)
        canvas = Image.new("RGB", new_size, tuple(self.pad_color))
        canvas.paste(image, ((new_size[0] - width) // 2, (new_size[1] - height) // 2))
        return canvas

    def resize_crop(self, image: Image.Image) -> Image.Image:
        """Shortest edge to `size` (bicubic, long side rounded down as in transformers), then centre crop."""
        width, height = image.size
        if width <= height:
            new_w, new_h = self.size, int(self.size * height / width)
        else:
            new_w, new_h = int(self.size * width / height), self.size
        image = image.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
        left, top = (new_w - self.size) // 2, (new_h - self.size) // 2
        return image.crop((left, top, left + self.size, top + self.size))

    def one(self, image: Image.Image) -> np.ndarray:
        """One image as a float32 array [3, size, size]."""
        image = image if image.mode == "RGB" else image.convert("RGB")  # an RGB image is not copied (issue 44)
        if self.mode == "targetpad":
            image = self.pad(image)
        pixels = np.asarray(self.resize_crop(image), dtype=np.float32) / 255.0
        pixels = (pixels - np.asarray(self.mean, dtype=np.float32)) / np.asarray(self.std, dtype=np.float32)
        return pixels.transpose(2, 0, 1)

    def __call__(self, images: Sequence[Image.Image]) -> np.ndarray:
        """A batch as a float32 array [N, 3, size, size]."""
        if not images:
            return np.zeros((0, 3, self.size, self.size), dtype=np.float32)
        return np.stack([self.one(image) for image in images])


def preprocess_from_options(
    options: dict, default_size: int, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD
) -> ClipPreprocess:
    """A ClipPreprocess from component options `image_size`, `preprocess`, `target_ratio`, `pad_color`."""
    pad_color = options.get("pad_color", (0, 0, 0))
    if isinstance(pad_color, int):
        pad_color = (pad_color,) * 3
    return ClipPreprocess(
        size=int(options.get("image_size", default_size)),
        mode=str(options.get("preprocess", "center_crop")),
        target_ratio=float(options.get("target_ratio", 1.0)),
        pad_color=tuple(int(c) for c in pad_color),
        mean=tuple(float(m) for m in mean),
        std=tuple(float(s) for s in std),
    )
