"""BLIP-2 image preprocessing for the QFF: OMGM's targetpad transform (default) or the HF square resize.

- `targetpad` (OMGM, after CLIP4Cir): an image whose long side is at least `target_ratio` (1.25) times its
  short side is first padded with black to a centred square; then the short side is resized to S
  (bicubic), the centre S x S is cropped, and pixels are scaled to [0, 1] and normalised with the OpenAI
  CLIP mean and std. Nearly square images are resized and cropped without padding.
- `squash`: `BlipImageProcessor`'s S x S bicubic resize with no crop (the blip2-itm-vit-g conversion,
  LAVIS `blip_image_eval`; models.md section 1.5), which stretches wide images.
"""
from __future__ import annotations

from typing import Any, Sequence

from qkvqa.config.schema import IMAGE_TRANSFORMS  # declared with the config

TARGET_RATIO = 1.25


def target_pad(image, target_ratio: float = TARGET_RATIO):
    """Pad `image` (PIL) with black to a centred square when max/min side >= `target_ratio`; else return it."""
    from PIL import Image

    width, height = image.size
    if max(width, height) / min(width, height) < target_ratio:
        return image
    side = max(width, height)
    padded = Image.new(image.mode, (side, side), 0)
    padded.paste(image, ((side - width) // 2, (side - height) // 2))
    return padded


class TargetPadImageProcessor:
    """OMGM's `targetpad_transform(1.25, S)`: target pad, bicubic resize of the short side, centre crop, CLIP norm.

    Called like a transformers image processor: `processor(images=[...], return_tensors="pt")["pixel_values"]`.
    """

    transform = "targetpad"
    resample = 3                       # PIL's BICUBIC, as BlipImageProcessor records it
    do_rescale = True
    rescale_factor = 1 / 255
    do_normalize = True

    def __init__(self, image_size: int, target_ratio: float = TARGET_RATIO):
        from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

        self.size = {"height": image_size, "width": image_size}
        self.target_ratio = target_ratio
        self.image_mean = list(OPENAI_CLIP_MEAN)
        self.image_std = list(OPENAI_CLIP_STD)

    def __call__(self, images: Sequence[Any], return_tensors: str = "pt") -> dict:
        import numpy as np
        import torch
        from PIL import Image

        side = self.size["height"]
        mean = np.asarray(self.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(self.image_std, dtype=np.float32)[:, None, None]
        out = []
        for image in images:
            image = target_pad(image.convert("RGB"), self.target_ratio)
            width, height = image.size
            scale = side / min(width, height)
            size = (max(side, round(width * scale)), max(side, round(height * scale)))
            image = image.resize(size, Image.Resampling(self.resample))
            left, top = (size[0] - side) // 2, (size[1] - side) // 2
            image = image.crop((left, top, left + side, top + side))
            pixels = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) * self.rescale_factor
            out.append((pixels - mean) / std)
        return {"pixel_values": torch.from_numpy(np.stack(out))}


def blip2_image_processor(image_size: int, transform: str = "targetpad"):
    """The QFF's image processor for `image_size`² inputs: `targetpad` (OMGM) or `squash` (BlipImageProcessor)."""
    if transform == "targetpad":
        return TargetPadImageProcessor(image_size)
    if transform != "squash":
        from qkvqa.errors import ConfigError

        raise ConfigError(f"qff.image_transform must be one of {IMAGE_TRANSFORMS}, got {transform!r}")
    from transformers import BlipImageProcessor
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

    return BlipImageProcessor(do_resize=True, size={"height": image_size, "width": image_size},
                              resample=PILImageResampling.BICUBIC, do_rescale=True, do_normalize=True,
                              image_mean=list(OPENAI_CLIP_MEAN), image_std=list(OPENAI_CLIP_STD), do_convert_rgb=True)
