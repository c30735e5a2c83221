"""BLIP-2 image preprocessing: square bicubic resize, no crop, OpenAI CLIP mean/std (models.md §1.5)."""
from __future__ import annotations


def blip2_image_processor(image_size: int):
    """A `BlipImageProcessor` for `image_size`² inputs, as the blip2-itm-vit-g conversion uses (LAVIS `blip_image_eval`)."""
    from transformers import BlipImageProcessor
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

    return BlipImageProcessor(do_resize=True, size={"height": image_size, "width": image_size},
                              resample=PILImageResampling.BICUBIC, do_rescale=True, do_normalize=True,
                              image_mean=list(OPENAI_CLIP_MEAN), image_std=list(OPENAI_CLIP_STD), do_convert_rgb=True)
