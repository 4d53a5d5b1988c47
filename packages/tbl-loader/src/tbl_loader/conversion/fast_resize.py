"""Step 6 of the conversion rule (`tbl_loader.conversion.decode`) without a Pillow image of the result.

`tbl_kernels.pillow_resize` computes Pillow's resize, bit for bit, straight
into the row that is written to the file: no second Pillow image, no
``tobytes()`` copy, and passes that run on AVX2 (2-3x faster than Pillow's
own on this project's photos; see docs/benchmarks.md). Pillow's result stays
the definition: before the first use in a process, `kernel_resize_available`
resizes a few images both ways, in each geometry the rule meets (squash, a
fractional center-crop box, an upscale, both pass orders), and uses the
kernel only if every byte agrees with the installed Pillow. Otherwise, and
for an image Pillow keeps in several memory blocks (larger than its block
size), Pillow resizes and the pixels are copied: the same bytes, slower.
"""

from __future__ import annotations

from functools import cache

import numpy as np
from PIL import Image

from .._kernels import kernels

__all__ = ["kernel_resize_available", "resize_into", "resize_with_pillow"]

# (source w, h), (output w, h), box: every branch of Pillow's resize that the conversion rule reaches.
_CHECKS = (
    ((205, 189), (160, 160), None),  # a drafted photo, squashed: both passes, horizontal first
    ((160, 400), (160, 120), None),  # height shrinks by more than twice the width: vertical first in Pillow 13
    ((90, 300), (120, 100), None),  # width grows, height shrinks
    ((211, 157), (64, 64), (26.5, 0.0, 184.5, 157.0)),  # center_crop's box, fractional
    ((20, 30), (64, 64), None),  # an image smaller than S: upscaled
    ((96, 80), (64, 64), (16.0, 8.0, 80.0, 72.0)),  # an integral box of the output's size: Pillow crops
)


def resize_with_pillow(rgb: Image.Image, size: tuple[int, int], resample: str,
                       box: tuple[float, ...] | None) -> Image.Image:
    """Step 6 as Pillow does it: the definition the kernel must match (``resample``: bilinear, bicubic, lanczos)."""
    return rgb.resize(size, Image.Resampling[resample.upper()], box=box, reducing_gap=None)


@cache
def kernel_resize_available(resample: str) -> bool:
    """Whether this process resizes with the kernel: it exists in the installed tbl-kernels (0.2), Pillow
    lends images through Arrow, and it gave the installed Pillow's bytes on every image of the check."""
    if not callable(getattr(kernels, "pillow_resize", None)) or not hasattr(Image.Image, "__arrow_c_array__"):
        return False
    rng = np.random.default_rng(0)
    for (w, h), size, box in _CHECKS:
        yy, xx = np.mgrid[:h, :w]
        smooth = (np.sin(xx / 5.0) + np.cos(yy / 7.0)) * 60 + 128  # photo-like: rounding near-ties happen
        pixels = np.clip(smooth[..., None] + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)
        img = Image.fromarray(pixels)
        out = np.empty((size[1], size[0], 3), np.uint8)
        try:
            kernels.pillow_resize(img, out, resample, box)
        except (ValueError, TypeError):
            return False
        if not np.array_equal(out, np.asarray(resize_with_pillow(img, size, resample, box))):
            return False
    return True


def resize_into(rgb: Image.Image, out: np.ndarray, resample: str, box: tuple[float, ...] | None) -> None:
    """``out[...] = np.asarray(rgb.resize((W, H), resample, box=box, reducing_gap=None))`` for out's (H, W, 3)."""
    if kernel_resize_available(resample):
        try:
            kernels.pillow_resize(rgb, out, resample, box)
            return
        except kernels.PillowLayoutError:
            pass  # a multi-block image: Pillow resizes it below
    out[...] = np.asarray(resize_with_pillow(rgb, (out.shape[1], out.shape[0]), resample, box))
