"""Serve-time JPEG decoding: in the kernels' batch pass (tbl-kernels 0.3), or simplejpeg in a thread pool.

Two decoders serve JPEG storage, both libjpeg-turbo. Where the kernels have it
(tbl-kernels 0.3, ``decode_crop_resize_jpegs``), each batch is one kernel call
that decodes only the part of each row its box needs, at the DCT scale the box
allows, and crop-resizes it straight into the batch (the *fused* decode, named
``tbl-kernels/libjpeg-turbo`` with the libjpeg-turbo release the kernels were
built against). On older kernels, rows are decoded whole by simplejpeg in a
thread pool (below), then crop-resized by a second kernel call. Both follow the
rules below (the same DCT scale, the same box mapping, the same crop-resize), so
they give the same batches where both libraries decode the same pixels at the
same scale, which they do for the libjpeg-turbo releases tested (2.1.5 in the
kernels, simplejpeg 1.9.0's bundled one: ``tests/test_decode_jpegs.py`` of
tbl-kernels compares them at every scale and IDCT). They differ (the decoder's
identity is in the stream fingerprint either way) on images a few pixels wide
or high, where simplejpeg, asked for at least ``ceil(H / k) x ceil(W / k)``,
takes a smaller DCT scale when several give that size (a 1 x 1 image decodes at
1/8 whatever k); and on damaged rows: the fused decode never reads the rows
below a box, so bytes damaged there do not stop the box from being served
(the thread-pool decode refuses the row; a truncated row is refused by both).

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

Header first. A row's bytes are not trusted to match its ``height`` / ``width``
columns: `decode_jpeg` reads the frame header (the first SOF segment: sample
precision, size, colour components) with `read_jpeg_header` and refuses a
row whose size differs from its columns (`ImageGeometryError`), or that is not
8-bit with 1 or 3 components (ValueError), before the decoder allocates
anything, at every DCT scale. So a decode never allocates more than the
row's declared ``height * width * 3`` bytes (a 16000 x 16000 JPEG declared
256 x 211 is refused from its first few hundred bytes), and the boxes mapped by
`scale_boxes` are always mapped from the image's true size. The decoded
image is then checked against the sizes libjpeg-turbo's scaled IDCT gives
(``ceil(H * n / 8)`` by ``ceil(W * n / 8)``, one ``n`` in 1..8, at least the
requested minimum).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import ImageGeometryError, JpegDecoderUnavailableError

__all__ = ["DCT_METHODS", "DECODER_NAME", "FUSED_DECODER_NAME", "JpegHeader", "check_dct", "check_jpeg_header",
           "dct_scale", "decode_jpeg", "decoder_info", "fused_decoder_info", "read_jpeg_header", "scale_boxes",
           "serving_decoder_info"]

DECODER_NAME = "simplejpeg"
FUSED_DECODER_NAME = "tbl-kernels/libjpeg-turbo"
INSTALL = 'pip install "tbl-loader[jpeg]"'
_SCALES = (8, 4, 2, 1)
DCT_METHODS = ("accurate", "fast")
"""The IDCT methods of the serve-time decode (see the module docstring): the accurate one is the default."""


# Start-of-frame markers (SOF0..SOF15 less DHT, JPG and DAC, which share the range), and the markers that
# stand alone without a length (TEM, RST0..RST7).
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_STANDALONE_MARKERS = frozenset({0x01, *range(0xD0, 0xD8)})


class JpegHeader(NamedTuple):
    """A JPEG's frame header (its first SOF segment)."""

    height: int
    width: int
    components: int
    precision: int  # bits per sample


def read_jpeg_header(data: Any) -> JpegHeader:
    """The frame header of JPEG ``data`` (any bytes-like object), read from the markers before the first SOF
    segment as libjpeg reads them; ValueError naming what is wrong when the bytes do not reach one.

    Args:
        data: the JPEG bytes.
    """
    buf = memoryview(data).cast("B")
    n = len(buf)
    if n < 4 or buf[0] != 0xFF or buf[1] != 0xD8:
        raise ValueError("no JPEG start-of-image marker")
    pos = 2
    while True:
        if pos >= n or buf[pos] != 0xFF:
            found = "the end of the data" if pos >= n else f"byte {buf[pos]:#04x}"
            raise ValueError(f"offset {pos}: a marker expected before the frame header, found {found}")
        while pos < n and buf[pos] == 0xFF:  # fill bytes may precede a marker
            pos += 1
        if pos + 2 >= n:
            raise ValueError("the data ends before the frame header")
        marker = buf[pos]
        pos += 1
        if marker in _STANDALONE_MARKERS:
            continue
        if marker in (0x00, 0xD8, 0xD9, 0xDA):  # stuffing, second SOI, EOI, scan data: no frame yet
            raise ValueError(f"marker {marker:#04x} before the frame header")
        length = buf[pos] << 8 | buf[pos + 1]
        if length < 2 or pos + length > n:
            raise ValueError(f"offset {pos}: a segment of length {length} runs past the data ({n} bytes)")
        if marker in _SOF_MARKERS:
            if length < 8:
                raise ValueError(f"offset {pos}: a frame header of {length} bytes (8 at least)")
            return JpegHeader(height=buf[pos + 3] << 8 | buf[pos + 4], width=buf[pos + 5] << 8 | buf[pos + 6],
                              components=buf[pos + 7], precision=buf[pos + 2])
        pos += length


def check_jpeg_header(data: Any, height: int, width: int) -> None:
    """Refuse ``data`` unless its frame header is an 8-bit, 1- or 3-component ``height`` x ``width`` image:
    ImageGeometryError for another size, ValueError for anything else.

    Args:
        data: the JPEG bytes.
        height: the row's ``height`` column.
        width: the row's ``width`` column.
    """
    header = read_jpeg_header(data)
    if header.precision != 8:
        raise ValueError(f"{header.precision}-bit samples (8-bit JPEG is served)")
    if header.components not in (1, 3):
        raise ValueError(f"{header.components} colour components (1 or 3 are served)")
    if (header.height, header.width) != (height, width):
        raise ImageGeometryError(f"the JPEG header says {header.height} x {header.width}, its height/width "
                                 f"columns say {height} x {width}")


def _scaled_sizes(height: int, width: int, scale: int) -> set[tuple[int, int]]:
    """The sizes libjpeg-turbo's scaled IDCT (factors n/8) may decode a ``height`` x ``width`` JPEG to when
    asked for at least ``ceil(height / scale)`` x ``ceil(width / scale)``."""
    lo_h, lo_w = -(-height // scale), -(-width // scale)
    sizes = {(-(-height * n // 8), -(-width * n // 8)) for n in range(1, 9)}
    return {(h, w) for h, w in sizes if h >= lo_h and w >= lo_w}


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


def fused_decoder_info(module: Any) -> dict[str, str]:
    """``{"name": FUSED_DECODER_NAME, "version": ...}`` of kernels ``module``'s JPEG decode (tbl-kernels 0.3): the
    libjpeg-turbo release they were built against."""
    return {"name": FUSED_DECODER_NAME, "version": str(module.jpeg_decoder()["version"])}


def serving_decoder_info() -> dict[str, str]:
    """The decoder that serves JPEG storage here: the kernels' (`fused_decoder_info`) where they decode in the
    batch pass, else simplejpeg's (`decoder_info`, JpegDecoderUnavailableError if it is not installed)."""
    from .._kernels import jpeg_decode_kernels

    fused = jpeg_decode_kernels()
    return decoder_info() if fused is None else fused_decoder_info(fused)


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

    Raises ImageGeometryError when the frame header's size is not ``height`` x
    ``width`` (before anything is allocated), ValueError (naming the cause) when
    the header is malformed or not 8-bit RGB/greyscale, or when the bytes do not
    decode in full. Releases the GIL while decoding.
    """
    sj = _simplejpeg()
    check_jpeg_header(data, height, width)  # the decoder allocates from this header: checked first
    fast = dct == "fast"
    if scale == 1:
        image = sj.decode_jpeg(data, "RGB", fastdct=fast, strict=True)
    else:
        image = sj.decode_jpeg(data, "RGB", fastdct=fast, strict=True, min_height=-(-height // scale),
                               min_width=-(-width // scale))
    if image.ndim != 3 or image.shape[2] != 3 or image.shape[:2] not in _scaled_sizes(height, width, scale):
        raise ImageGeometryError(f"the JPEG decodes to {image.shape} at DCT scale 1/{scale}, not a scaled "
                                 f"{height} x {width} RGB image")
    return image
