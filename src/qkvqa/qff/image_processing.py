"""BLIP-2 image preprocessing for the QFF: OMGM's targetpad transform (default) or the HF square resize.

- `targetpad` (OMGM `data_utils.py` `TargetPad` + `targetpad_transform(1.25, S)`, after CLIP4Cir): an image whose
  long side is at least `target_ratio` (1.25) times its short side gets int((long / 1.25 - side) / 2) black
  pixels on both sides of its short side, which brings it to (about) 1.25:1, not to a square; then torchvision's
  `Resize(S)` takes the short side to S (bicubic, the long side int(S * long / short)), `CenterCrop(S)` cuts the
  centre (offsets rounded as torchvision rounds them), and pixels are scaled to [0, 1] and normalised with the
  OpenAI CLIP mean and std. Nearly square images are resized and cropped without padding. OMGM converts to
  RGB on load, before the pad; so does this. (qkvqa before geometry `omgm_targetpad_1.25` padded to a full
  square; a QFF trained so is refused by name, `IMAGE_GEOMETRY`.)
- `squash`: `BlipImageProcessor`'s S x S bicubic resize with no crop (the blip2-itm-vit-g conversion,
  LAVIS `blip_image_eval`; models.md section 1.5), which stretches wide images.
"""

from __future__ import annotations

from typing import Any, Sequence

from qkvqa.config.schema import IMAGE_TRANSFORMS  # declared with the config

TARGET_RATIO = 1.25
# The pixel geometry of each transform, recorded with a trained QFF and in the ViT cache's fingerprint: a change
# of geometry under one transform name is refused by this name, not used in silence.
IMAGE_GEOMETRY = {"targetpad": "omgm_targetpad_1.25", "squash": "hf_squash"}


def target_pad_amounts(width: int, height: int, target_ratio: float = TARGET_RATIO) -> tuple[int, int]:
    """OMGM's TargetPad padding (left = right, top = bottom) of a width x height image: none below the ratio, else
    int((max side / ratio - side) / 2) on each side of the short one."""
    if max(width, height) / min(width, height) < target_ratio:
        return 0, 0
    scaled = max(width, height) / target_ratio
    return max(int((scaled - width) / 2), 0), max(int((scaled - height) / 2), 0)


def target_pad(image, target_ratio: float = TARGET_RATIO):
    """`image` (PIL) padded with black as OMGM's TargetPad pads it (`target_pad_amounts`); unchanged when nearly square."""
    from PIL import Image

    horizontal, vertical = target_pad_amounts(*image.size, target_ratio)
    if not horizontal and not vertical:
        return image
    width, height = image.size
    padded = Image.new(image.mode, (width + 2 * horizontal, height + 2 * vertical), 0)
    padded.paste(image, (horizontal, vertical))
    return padded


def resized_size(width: int, height: int, side: int) -> tuple[int, int]:
    """torchvision `Resize(side)`'s output size: the short side to `side`, the long one int(side * long / short)."""
    if width <= height:
        return side, int(side * height / width)
    return int(side * width / height), side


def center_crop_box(width: int, height: int, side: int) -> tuple[int, int, int, int]:
    """torchvision `CenterCrop(side)`'s box (left, top, right, bottom): offsets int(round((size - side) / 2))."""
    left, top = int(round((width - side) / 2.0)), int(round((height - side) / 2.0))
    return left, top, left + side, top + side


class TargetPadImageProcessor:
    """OMGM's `targetpad_transform(1.25, S)`: target pad, bicubic resize of the short side, centre crop, CLIP norm.

    Called like a transformers image processor: `processor(images=[...], return_tensors="pt")["pixel_values"]`.
    """

    transform = "targetpad"
    geometry = IMAGE_GEOMETRY["targetpad"]
    resample = 3  # PIL's BICUBIC, as BlipImageProcessor records it
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
            size = resized_size(*image.size, side)
            image = image.resize(size, Image.Resampling(self.resample))
            image = image.crop(center_crop_box(*size, side))
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

    return BlipImageProcessor(
        do_resize=True,
        size={"height": image_size, "width": image_size},
        resample=PILImageResampling.BICUBIC,
        do_rescale=True,
        do_normalize=True,
        image_mean=list(OPENAI_CLIP_MEAN),
        image_std=list(OPENAI_CLIP_STD),
        do_convert_rgb=True,
    )
