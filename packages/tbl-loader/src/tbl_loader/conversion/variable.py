"""What ``tbl convert --max-size N`` stores: images of their own size, aspect kept, longer side capped at N.

Each sample is ``{"image": ..., "height": int, "width": int, "label": int}``.
``height`` and ``width`` are fixed-size int64 columns holding the stored
image's size, so that a loader plans every crop from two zero-copy columns
without touching pixels.

``store="raw"``: ``image`` is a ``var_array`` leaf of uint8 ``(height, width, 3)``
pixels in the heap. ``store="jpeg"``: ``image`` is an ``encoded_image`` leaf of
JPEG bytes, decoded at serve time (see `tbl_loader.image.jpeg`).

The rule (`prepare_variable`, every step Pillow, exact for a given Pillow and
libjpeg build; both versions are in the metadata, as for the fixed mode):

1. Open the bytes; a JPEG is drafted (``draft=True``) with
   ``img.draft("RGB", (tw, th))``, (tw, th) the capped size of step 4 before
   EXIF rotation, so both decoded sides stay >= the target (never an upscale).
2. Strict load (a truncated or corrupt file raises), EXIF orientation applied,
   RGB conversion: steps 3-5 of `tbl_loader.conversion.decode`.
3. The stored size: with ``L = max(w, h)`` and ``S = min(w, h)`` of the
   original (undrafted, upright) image, an image with ``L <= N`` keeps its size;
   otherwise the longer side becomes ``N`` and the shorter
   ``max(1, (2 * S * N + L) // (2 * L))`` (S * N / L rounded half up, in
   integers: no float rounding to disagree about).
4. Resize to that size with Pillow's ``resample`` filter and
   ``reducing_gap=None`` (skipped when the size is unchanged and not drafted).

``store="jpeg"`` keeps the source bytes unchanged when they are already what
a reader needs: a baseline or progressive JPEG of three components (Pillow
mode RGB), no EXIF rotation to apply (orientation absent or 1), and within
the cap. Anything else (a PNG, a grey or CMYK JPEG, a rotated one, one over
the cap) is stored as the JPEG encoding at ``quality`` (4:2:0 subsampling,
Pillow's default) of the step-4 pixels. Either way the stored bytes are then
decoded once by the serve-time decoder (`tbl_loader.image.jpeg`, strict: a
libjpeg warning such as corrupt data is an error) and must give the recorded
size, so a file that would not decode when served is a bad image at
conversion time, never stored. ``store="jpeg"`` therefore needs the decoder
installed (``pip install "tbl-loader[jpeg]"``), which also records its version.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from PIL import Image, ImageOps

import tbl_format

from ..image.jpeg import decode_jpeg, decoder_info
from .decode import RESAMPLE, check_strict, to_rgb

__all__ = [
    "STORES",
    "VariableRecipe",
    "capped_size",
    "prepare_variable",
    "reference_variable",
]

STORES: Final = ("raw", "jpeg")
DEFAULT_QUALITY: Final = 90
_EXIF_ORIENTATION: Final = 0x0112
_SWAPS_AXES: Final = (5, 6, 7, 8)  # EXIF orientations that transpose the image


def capped_size(width: int, height: int, max_size: int) -> tuple[int, int]:
    """(width, height) with the longer side capped at ``max_size`` (step 3 of the module rule)."""
    long_, short = max(width, height), min(width, height)
    if long_ <= max_size:
        return width, height
    short = max(1, (2 * short * max_size + long_) // (2 * long_))
    return (max_size, short) if width >= height else (short, max_size)


def _check(max_size: int, store: str, quality: int, resample: str) -> None:
    if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
        raise ValueError(f"max_size must be a positive int, got {max_size!r}")
    if store not in STORES:
        raise ValueError(f"store must be one of {STORES}, got {store!r}")
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise ValueError(f"quality must be an int in [1, 100], got {quality!r}")
    if resample not in RESAMPLE:
        raise ValueError(f"resample must be one of {tuple(RESAMPLE)}, got {resample!r}")


def _keeps_source(img: Image.Image, max_size: int) -> bool:
    """True when the source JPEG's bytes can be stored as they are (see the module docstring)."""
    if img.format != "JPEG" or img.mode != "RGB" or max(img.size) > max_size:
        return False
    return img.getexif().get(_EXIF_ORIENTATION, 1) == 1


def prepare_variable(
    data: bytes, max_size: int, store: str, quality: int, resample: str, draft: bool
) -> tuple[int, int, bytes]:
    """``(height, width, stored bytes)`` of one source image: raw RGB pixels or JPEG bytes."""
    check_strict()
    with Image.open(io.BytesIO(data)) as img:
        if store == "jpeg" and _keeps_source(img, max_size):
            img.load()  # strict: a file that does not decode is never stored
            w, h = img.size
            return _served_as_stored(h, w, bytes(data))
        swap = img.getexif().get(_EXIF_ORIENTATION, 1) in _SWAPS_AXES
        w0, h0 = img.size[::-1] if swap else img.size  # the upright original size
        tw, th = capped_size(w0, h0, max_size)
        if draft and img.format == "JPEG" and (tw, th) != (w0, h0):
            img.draft("RGB", (th, tw) if swap else (tw, th))  # the request is in the file's own axes
        img.load()
        ImageOps.exif_transpose(img, in_place=True)
        rgb = to_rgb(img)
        if rgb.size != (tw, th):
            rgb = rgb.resize((tw, th), RESAMPLE[resample], reducing_gap=None)
        if store == "raw":
            return th, tw, rgb.tobytes()
        buf = io.BytesIO()
        rgb.save(buf, "JPEG", quality=quality)
        return _served_as_stored(th, tw, buf.getvalue())


def _served_as_stored(height: int, width: int, jpeg: bytes) -> tuple[int, int, bytes]:
    """``(height, width, jpeg)`` once the serve-time decoder has decoded ``jpeg`` to that size; else ValueError."""
    shape = decode_jpeg(jpeg, height=height, width=width).shape
    if shape != (height, width, 3):
        raise ValueError(f"the serve-time decoder reads {shape} where Pillow read ({height}, {width}, 3)")
    return height, width, jpeg


def reference_variable(
    data: bytes, max_size: int, store: str = "raw", *, quality: int = DEFAULT_QUALITY,
    resample: str = "bilinear", draft: bool = True,
) -> np.ndarray | bytes:
    """THE definition of a stored variable-size image: uint8 (h, w, 3) pixels (raw) or the JPEG bytes (jpeg)."""
    _check(max_size, store, quality, resample)
    h, w, payload = prepare_variable(data, max_size, store, quality, resample, draft)
    if store == "raw":
        return np.frombuffer(payload, np.uint8).reshape(h, w, 3)
    return payload


@dataclass(frozen=True)
class VariableRecipe:
    """A conversion to variable-size images: how a worker prepares one image and how its row is written."""

    max_size: int
    store: str = "raw"
    quality: int = DEFAULT_QUALITY
    resample: str = "bilinear"
    draft: bool = True

    def __post_init__(self) -> None:
        _check(self.max_size, self.store, self.quality, self.resample)
        if self.store == "jpeg":
            decoder_info()  # JpegDecoderUnavailableError, naming the pip command, before any work

    def prepare(self, data: bytes) -> tuple[int, int, bytes]:
        return prepare_variable(data, self.max_size, self.store, self.quality, self.resample, self.draft)

    def pixel_bytes(self) -> int:
        """An upper bound of one prepared image's size, to size the chunks sent back by workers."""
        return self.max_size * self.max_size * 3

    def schema(self) -> tbl_format.Schema:
        image = (tbl_format.Leaf("var_array", dtype="uint8", ndim=3) if self.store == "raw"
                 else tbl_format.Leaf("encoded_image", format="jpeg"))
        return tbl_format.Schema({"image": image, "height": tbl_format.Leaf("int"),
                                  "width": tbl_format.Leaf("int"), "label": tbl_format.Leaf("int")})

    def row(self, prepared: tuple[int, int, bytes], label: int) -> dict[str, Any]:
        h, w, payload = prepared
        image: Any = np.frombuffer(payload, np.uint8).reshape(h, w, 3) if self.store == "raw" else payload
        return {"image": image, "height": h, "width": w, "label": label}

    def stored_geometry(self, height: int, width: int) -> tuple[np.ndarray, tuple[int, int]]:
        """The region ``(top, left, height, width)`` (float64) of an upright ``height x width`` source that
        becomes the stored image (all of it), and the stored ``(H, W)`` (the longer side capped)."""
        tw, th = capped_size(width, height, self.max_size)
        return np.array([0.0, 0.0, height, width]), (th, tw)

    def describe(self) -> dict[str, Any]:
        """The ``preprocess`` metadata keys of this recipe (the converter adds the versions)."""
        out: dict[str, Any] = {"max_size": self.max_size, "store": self.store, "resample": self.resample,
                               "draft": self.draft}
        if self.store == "jpeg":
            out["quality"] = self.quality
        return out
