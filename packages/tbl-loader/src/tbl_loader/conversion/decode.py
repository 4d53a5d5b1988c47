"""Decode one image and bring it to a fixed S x S x 3 uint8 array.

`reference_preprocess` is THE definition of what `tbl convert` stores; the
converter runs the same steps (`preprocess_into`, which makes step 6's pixels
in the output row through `tbl_loader.conversion.fast_resize`, Pillow's bytes computed by
tbl-kernels) and its tests compare the two with `np.array_equal`.

The rule, step by step (every step is Pillow, so results are exact for a given
Pillow and libjpeg build; both versions are recorded in the dataset metadata):

1. Open the encoded bytes with Pillow (any format Pillow reads).
2. Draft (JPEG only, when ``draft=True``): ``img.draft("RGB", (S, S))``. Pillow
   picks the largest DCT scale 1/k, k in {8, 4, 2, 1}, with
   ``k <= min(W // S, H // S)``, and decodes at ``(ceil(W / k), ceil(H / k))``.
   Both decoded sides therefore stay >= S, which is all that either resize mode
   needs (squash needs both sides >= S, center_crop the shorter one): drafting
   never turns the final resize into an upscale. Drafting happens before
   rotation, and (S, S) is symmetric, so EXIF orientation does not change the
   choice. (Images smaller than S are not drafted and are upscaled in step 6.)
3. Strict load: ``img.load()``. A truncated or corrupt file raises (this module
   refuses to run with ``ImageFile.LOAD_TRUNCATED_IMAGES`` set, which would
   silently fill missing data with grey/black pixels).
4. EXIF orientation: ``ImageOps.exif_transpose`` (orientation 2-8 flips /
   rotates; Pillow also honours an XMP ``tiff:Orientation``), so the stored
   image is upright as a viewer shows it.
5. RGB conversion (`to_rgb`):
   - RGB: unchanged. L, 1, YCbCr, RGBX: ``convert("RGB")``.
   - CMYK: ``convert("RGB")``; Pillow's JPEG plugin already undoes the
     inversion of Adobe CMYK JPEGs while decoding.
   - I;16 (all byte orders) and I: 16-bit grey mapped to 8 bits by
     ``(v + 128) // 257`` (round to nearest of v / 257; I is clipped to
     0..65535 first), then replicated to RGB. Pillow's own ``convert`` clips
     instead of scaling, which would make most 16-bit images white.
   - Alpha (RGBA, LA, La, RGBa, PA, and P / L / RGB with a ``transparency``
     entry, i.e. a PNG or GIF colour key): converted to RGBA, composited over
     opaque white with ``Image.alpha_composite``; the alpha channel is then
     dropped.
   - P without transparency: ``convert("RGB")`` (palette lookup).
   - Any other mode (F, HSV, LAB, ...) raises `UnsupportedImageModeError`.
6. Resize with Pillow's convolution resampler and ``reducing_gap=None`` (a
   full antialiased filter; no reduce() shortcut), filter ``resample``
   (default bilinear; bicubic and lanczos are the other choices). On the
   (w, h) image from step 5:
   - ``squash``: ``resize((S, S))`` over the whole image (aspect not kept).
   - ``center_crop``: ``side = min(w, h)``, box
     ``((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)`` in
     exact float coordinates (no rounding), ``resize((S, S), box=box)``.
     This is "scale the shorter side to S, then take the central S x S
     crop" computed in one resampling pass, with the crop offset kept
     fractional instead of rounded to a pixel.
7. ``np.asarray`` -> (S, S, 3) uint8, C-contiguous.

The decode stays Pillow's even where tbl-kernels 0.3 decodes JPEG itself
(``decode_jpeg_region``, the serve-time decoder): at Pillow's draft scale both
give the same pixels, but the step as a whole (the kernels' decode, then a
Pillow image of it for steps 4-6) measured no faster on ~1000 px photos
(4.9 against 5.2 ms at S = 256, 8.6 against 8.5 ms at S = 512, one thread), and
Pillow's bundled libjpeg-turbo is newer than the system one a source build of
the kernels links.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

import numpy as np
from PIL import Image, ImageFile, ImageOps

from ..errors import PillowConfigError, UnsupportedImageModeError
from .fast_resize import resize_into, resize_with_pillow

__all__ = [
    "ALPHA_BACKGROUND",
    "MODES",
    "RESAMPLE",
    "check_params",
    "check_strict",
    "preprocess_image",
    "preprocess_into",
    "reference_preprocess",
    "to_rgb",
]

MODES: Final = ("center_crop", "squash")
RESAMPLE: Final = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
}
ALPHA_BACKGROUND: Final = (255, 255, 255)

_PLAIN_TO_RGB: Final = frozenset({"RGB", "L", "1", "P", "YCbCr", "RGBX", "CMYK"})
_ALPHA_MODES: Final = frozenset({"RGBA", "LA", "La", "RGBa", "PA"})
_SIXTEEN_BIT: Final = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})


def check_params(size: int, mode: str, resample: str) -> None:
    """Raise ValueError naming the bad parameter; shared by the reference and the converter."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive int, got {size!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if resample not in RESAMPLE:
        raise ValueError(f"resample must be one of {tuple(RESAMPLE)}, got {resample!r}")


def to_rgb(img: Image.Image) -> Image.Image:
    """Step 5 of the module rule: any supported Pillow mode to 8-bit RGB."""
    mode = img.mode
    keyed = "transparency" in img.info and mode in ("P", "L", "RGB")
    if mode == "RGB" and not keyed:
        return img
    if mode in _ALPHA_MODES or keyed:
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (*ALPHA_BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode in _PLAIN_TO_RGB:
        return img.convert("RGB")
    if mode in _SIXTEEN_BIT:
        grey = np.asarray(img).astype(np.int64)
        grey = np.clip(grey, 0, 65535)
        eight = ((grey + 128) // 257).astype(np.uint8)
        return Image.fromarray(eight).convert("RGB")
    raise UnsupportedImageModeError(f"Pillow image mode {mode!r} has no defined conversion to RGB")


def check_strict() -> None:
    """Raise PillowConfigError if Pillow is set to fill in truncated images."""
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise PillowConfigError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True: truncated images would be stored with "
            "filled-in pixels; set it to False before converting"
        )


@contextmanager
def _decoded(data: bytes, size: int, mode: str, draft: bool) -> Iterator[tuple[Image.Image, tuple[float, ...] | None]]:
    """Steps 1-5, and step 6's box (None: the whole image); the image is open until the block ends."""
    check_strict()
    with Image.open(io.BytesIO(data)) as img:
        if draft and img.format == "JPEG":
            img.draft("RGB", (size, size))
        img.load()
        ImageOps.exif_transpose(img, in_place=True)  # in place: no copy when nothing turns
        rgb = to_rgb(img)
        if mode == "squash":
            yield rgb, None
        else:
            w, h = rgb.size
            side = min(w, h)
            yield rgb, ((w - side) / 2, (h - side) / 2, (w + side) / 2, (h + side) / 2)


def preprocess_image(data: bytes, size: int, mode: str, resample: str, draft: bool) -> Image.Image:
    """Steps 1-6 on encoded bytes; returns the S x S RGB Pillow image.

    Parameters are assumed valid (see `check_params`); corrupt input raises
    whatever Pillow raises (UnidentifiedImageError, OSError, ...).
    """
    with _decoded(data, size, mode, draft) as (rgb, box):
        return resize_with_pillow(rgb, (size, size), resample, box)


def preprocess_into(data: bytes, size: int, mode: str, resample: str, draft: bool,
                    out: np.ndarray | memoryview) -> None:
    """`preprocess_image`'s pixels written into ``out``, the same bytes: a C-contiguous (S, S, 3) uint8 array,
    or a writable buffer of S * S * 3 bytes (a row of a file being written; no export of it outlives the call).

    Step 6 runs through `tbl_loader.conversion.fast_resize`: tbl-kernels' copy of Pillow's resize where it gives the
    installed Pillow's bytes, else Pillow itself. Errors as in `preprocess_image`; ``out`` may be partly
    written when one is raised.
    """
    pixels = out if isinstance(out, np.ndarray) else np.frombuffer(out, np.uint8).reshape(size, size, 3)
    with _decoded(data, size, mode, draft) as (rgb, box):
        resize_into(rgb, pixels, resample, box)


def reference_preprocess(
    path_or_bytes: str | os.PathLike[str] | bytes,
    size: int,
    mode: str = "center_crop",
    *,
    resample: str = "bilinear",
    draft: bool = True,
) -> np.ndarray:
    """THE definition of a converted image: the module docstring's rule, as a (size, size, 3) uint8 array."""
    check_params(size, mode, resample)
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        data = bytes(path_or_bytes)
    else:
        with open(path_or_bytes, "rb") as f:
            data = f.read()
    return np.asarray(preprocess_image(data, size, mode, resample, draft))
