"""Serve-time JPEG decoding: simplejpeg (libjpeg-turbo in a pip wheel), GIL released, DCT-domain downscaling.

Why simplejpeg. Measured on the bench photos (``python -m tbl_bench.jpeg_decoders``;
see the commit that chose it), it decodes faster than Pillow's bundled
libjpeg-turbo at full scale and at DCT scale 1/2, releases the GIL while it
decodes, installs from a wheel with no system library, and refuses a truncated
or corrupt JPEG (``strict=True``) instead of filling it in. It is the
``jpeg`` extra of tbl-loader: ``pip install "tbl-loader[jpeg]"``.

Decoded pixels depend on the decoder: libjpeg-turbo's IDCT and chroma
upsampling (and its scaled IDCT) may change between releases. The decoder's
name and version are recorded in a converted dataset's metadata and in the
stream fingerprint of every loader that decodes at serve time, so a resume
under another decoder version is refused (`tbl_loader.errors.StateMismatchError`)
rather than silently continuing with other pixels.

DCT scale. `dct_scale(box_h, box_w, out_h, out_w)` is the largest k in
(8, 4, 2, 1) with ``box_h >= k * out_h`` and ``box_w >= k * out_w``: the crop
still has at least the output's resolution after the 1/k decode, so the
resize stays a downscale. The image is decoded with ``min_height = ceil(H / k)``
and ``min_width = ceil(W / k)`` (libjpeg-turbo picks the smallest scale that
reaches both) and the box is mapped onto the decoded image (H', W') by
`scale_box`: ``top' = floor(top * H' / H)``, ``bottom' = ceil((top + h) * H' / H)``
in integers (likewise for columns), so the decoded crop covers the requested
one, within one decoded pixel, and the result depends only on the sizes.

IDCT. ``dct="accurate"`` (the default) is libjpeg-turbo's accurate integer
IDCT (``JDCT_ISLOW``). ``dct="fast"`` is its fast integer IDCT (``JDCT_IFAST``,
TurboJPEG's ``TJFLAG_FASTDCT``), the one FFCV 1.0.2 decodes with (its
``imdecode`` passes ``TJFLAG_FASTDCT | TJFLAG_NOREALLOC`` to ``tjDecompress2``):
about 5% less decode time, and other pixels. On the 256-px bench photos about
two values in three differ, by at most 7 levels, at full scale; at DCT scale 1/2
by at most 3; at 1/4 and 1/8 libjpeg-turbo uses one reduced IDCT for both and
the pixels are the same. It is opt-in (``ImageLoader(jpeg_dct="fast")``) and a
stream setting (``jpeg_dct``, in the fingerprint), since it changes pixels.
Chroma upsampling stays the smooth ("fancy") one in both: FFCV does not use
TurboJPEG's fast upsampling either.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import JpegDecoderUnavailableError

__all__ = ["DCT_METHODS", "DECODER_NAME", "check_dct", "dct_scale", "decode_jpeg", "decoder_info", "scale_boxes"]

DECODER_NAME = "simplejpeg"
INSTALL = 'pip install "tbl-loader[jpeg]"'
_SCALES = (8, 4, 2, 1)
DCT_METHODS = ("accurate", "fast")
"""The IDCT methods of the serve-time decode (see the module docstring): the accurate one is the default."""


def _simplejpeg() -> Any:
    try:
        import simplejpeg  # optional: the jpeg extra
    except ImportError as e:
        raise JpegDecoderUnavailableError(
            f"serving JPEG storage needs {DECODER_NAME} ({e}); install it with: {INSTALL}"
        ) from e
    return simplejpeg


def decoder_info() -> dict[str, str]:
    """``{"name": ..., "version": ...}`` of the installed serve-time decoder (JpegDecoderUnavailableError if none)."""
    return {"name": DECODER_NAME, "version": str(_simplejpeg().__version__)}


def check_dct(dct: Any) -> str:
    """``dct`` if it names one of DCT_METHODS, else ValueError naming them."""
    if not isinstance(dct, str) or dct not in DCT_METHODS:
        raise ValueError(f"jpeg_dct must be one of {DCT_METHODS}, got {dct!r}")
    return dct


def dct_scale(box_h: np.ndarray, box_w: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """int64 DCT scale denominators k (8, 4, 2 or 1) per box: the largest with box >= k * output on both axes."""
    k = np.ones(np.shape(box_h), dtype=np.int64)
    for s in _SCALES[-2::-1]:  # 2, 4, 8: each one that fits replaces the smaller
        fits = (np.asarray(box_h) >= s * out_h) & (np.asarray(box_w) >= s * out_w)
        k = np.where(fits, s, k)
    return k


def scale_boxes(boxes: np.ndarray, full_hw: np.ndarray, decoded_hw: np.ndarray) -> np.ndarray:
    """int32 (n, 4) boxes mapped from images of size ``full_hw`` (n, 2) to ``decoded_hw`` (n, 2); see the module rule."""
    boxes = boxes.astype(np.int64)
    full = full_hw.astype(np.int64)
    dec = decoded_hw.astype(np.int64)
    out = np.empty((boxes.shape[0], 4), dtype=np.int32)
    for axis in (0, 1):  # rows, then columns
        start, size = boxes[:, axis], boxes[:, axis + 2]
        lo = start * dec[:, axis] // full[:, axis]
        hi = -((-(start + size) * dec[:, axis]) // full[:, axis])
        hi = np.minimum(np.maximum(hi, lo + 1), dec[:, axis])
        lo = np.minimum(lo, hi - 1)
        out[:, axis] = lo
        out[:, axis + 2] = hi - lo
    return out


def decode_jpeg(data: Any, scale: int = 1, *, height: int, width: int, dct: str = "accurate") -> np.ndarray:
    """RGB uint8 (H', W', 3) of JPEG ``data`` (stored ``height`` x ``width``) decoded at DCT scale 1/``scale``
    with the IDCT ``dct`` (one of DCT_METHODS; the caller checks it with `check_dct`).

    Raises ValueError (the decoder's message) when the bytes do not decode in
    full. Releases the GIL while decoding.
    """
    sj = _simplejpeg()
    fast = dct == "fast"
    if scale == 1:
        return sj.decode_jpeg(data, "RGB", fastdct=fast, strict=True)
    return sj.decode_jpeg(data, "RGB", fastdct=fast, strict=True, min_height=-(-height // scale),
                          min_width=-(-width // scale))
