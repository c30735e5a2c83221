"""Procedural images of the synthetic world: per-entity visual signatures (shape, colour pair, pattern) drawn with numpy."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image

# Colour names appear in the article text ("black and yellow markings"), so image and text agree.
PALETTE = {
    "red": (214, 39, 40),
    "green": (44, 160, 44),
    "blue": (31, 90, 200),
    "yellow": (240, 205, 40),
    "orange": (245, 128, 20),
    "purple": (140, 60, 180),
    "cyan": (30, 190, 200),
    "pink": (240, 120, 175),
    "brown": (125, 80, 40),
    "black": (25, 25, 25),
    "white": (248, 248, 248),
    "grey": (128, 128, 128),
}
# Low-frequency patterns (period ~0.7 object radii), so that they survive a 28x28 downscale.
PATTERNS = ("halves", "horizontal stripes", "vertical stripes", "checks", "rings", "diagonal bands")
PATTERN_FREQUENCY = 1.5

QUERY_SIZE = 128  # query and article images are QUERY_SIZE x QUERY_SIZE
COMPOSITE_PANEL_WIDTH = 96  # a multi-entity image is n panels of this width, QUERY_SIZE high


@dataclass(frozen=True)
class Signature:
    """What an entity looks like: its category's shape, two colours and a pattern."""

    shape: str
    colour: str
    second_colour: str
    pattern: str


def _shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Boolean mask of a category silhouette in object coordinates (radius about 1)."""
    if shape == "bird":
        return (
            (u**2 + v**2 / 0.45 <= 1)
            | ((u - 0.85) ** 2 + (v + 0.45) ** 2 <= 0.12)
            | ((u < -0.8) & (u > -1.45) & (np.abs(v) < (-u - 0.8) * 0.9))
        )
    if shape == "plant":
        return ((u**2 + (v + 0.3) ** 2) <= 0.6) | ((np.abs(u) < 0.12) & (v > 0) & (v < 1.15))
    if shape == "fish":
        return (u**2 + v**2 / 0.3 <= 1) | ((u < -0.85) & (u > -1.5) & (np.abs(v) < (-u - 0.85) * 1.1))
    if shape == "shell":
        return (u**2 + v**2 <= 1) & (v > -0.85)
    if shape == "landmark":
        return ((np.abs(u) < 0.45) & (v > -0.6) & (v < 1.05)) | (
            (v >= -1.25) & (v <= -0.6) & (np.abs(u) < (v + 1.25) * 0.75)
        )
    if shape == "insect":
        body = np.zeros_like(u, dtype=bool)
        for centre in (-0.72, 0.0, 0.72):
            body |= (u - centre) ** 2 + v**2 <= 0.15
        return body | (u**2 / 0.45 + (v + 0.5) ** 2 / 0.1 <= 1)
    raise ValueError(f"unknown shape {shape!r}")


def _pattern_mask(pattern: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """True where the first colour is drawn."""
    f = PATTERN_FREQUENCY
    if pattern == "halves":
        return v < 0
    if pattern == "horizontal stripes":
        return np.floor((v + 4) * f) % 2 == 0
    if pattern == "vertical stripes":
        return np.floor((u + 4) * f) % 2 == 0
    if pattern == "checks":
        return (np.floor((u + 4) * f) + np.floor((v + 4) * f)) % 2 == 0
    if pattern == "rings":
        return np.floor(np.sqrt(u**2 + v**2) * f * 1.4) % 2 == 0
    if pattern == "diagonal bands":
        return np.floor((u + v + 8) * f * 0.8) % 2 == 0
    raise ValueError(f"unknown pattern {pattern!r}")


def _draw_panel(
    canvas: np.ndarray, x0: int, width: int, signature: Signature, rng: np.random.Generator, query_view: bool
) -> None:
    """Draw one entity, with its background, into columns [x0, x0+width) of a float canvas."""
    height = canvas.shape[0]
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    if query_view:
        background = rng.uniform(150, 235, size=3)
        tint = rng.uniform(-40, 40, size=3)
        scale = min(height, width) * 0.36 * rng.uniform(0.8, 1.12)
        cx = width / 2 + rng.uniform(-0.1, 0.1) * width
        cy = height / 2 + rng.uniform(-0.1, 0.1) * height
        angle = rng.uniform(-0.3, 0.3)
        brightness = rng.uniform(0.85, 1.1)
    else:
        background = np.array([242.0, 240.0, 236.0])
        tint = np.zeros(3)
        scale, cx, cy, angle, brightness = min(height, width) * 0.38, width / 2, height / 2, 0.0, 1.0
    gradient = (ys / height)[..., None] * tint
    panel = np.broadcast_to(background, (height, width, 3)) + gradient
    dx, dy = (xs - cx) / scale, (ys - cy) / scale
    u = dx * np.cos(angle) + dy * np.sin(angle)
    v = -dx * np.sin(angle) + dy * np.cos(angle)
    shape = _shape_mask(signature.shape, u, v)
    first = _pattern_mask(signature.pattern, u, v)
    colour = (
        np.where(
            first[..., None],
            np.array(PALETTE[signature.colour], dtype=np.float32),
            np.array(PALETTE[signature.second_colour], dtype=np.float32),
        )
        * brightness
    )
    canvas[:, x0 : x0 + width] = np.where(shape[..., None], colour, panel)


def render(signatures: Sequence[Signature], rng: np.random.Generator, query_view: bool = True) -> Image.Image:
    """One entity (QUERY_SIZE square) or several side by side (a multi-entity image), as an RGB image."""
    if len(signatures) == 1:
        widths = [QUERY_SIZE]
    else:
        widths = [COMPOSITE_PANEL_WIDTH] * len(signatures)
    canvas = np.zeros((QUERY_SIZE, sum(widths), 3), dtype=np.float32)
    x0 = 0
    for signature, width in zip(signatures, widths):
        _draw_panel(canvas, x0, width, signature, rng, query_view)
        x0 += width
    noise = rng.normal(0, 7 if query_view else 2, size=canvas.shape)
    return Image.fromarray(np.clip(canvas + noise, 0, 255).astype(np.uint8), "RGB")


def encode(image: Image.Image, image_format: str) -> bytes:
    """The image as JPEG (quality 85) or PNG bytes; deterministic for the same pixels."""
    buffer = io.BytesIO()
    if image_format == "PNG":
        image.save(buffer, format="PNG", optimize=False)
    else:
        image.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()
