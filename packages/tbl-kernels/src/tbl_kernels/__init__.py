"""tbl_kernels: fused gather / flip / crop-resize / normalize kernels over raw uint8 buffers.

Every kernel writes into a caller-provided output, checks every index and box
before writing anything, releases the GIL and runs over the batch on one
persistent thread pool (see ``set_num_threads``). ``tbl_kernels.reference``
holds a pure-numpy implementation of each kernel with bit-identical results.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _core, reference
from .tables import NormalizationTable, normalization_table

__version__ = "0.3.0"
KERNELS_ABI = 4  # bumped on any binding change; the compiled module must agree

__all__ = [
    "JPEG_DCT_METHODS",
    "JPEG_MAX_SCANS",
    "JpegError",
    "KERNELS_ABI",
    "NormalizationTable",
    "PILLOW_FILTERS",
    "PillowLayoutError",
    "__version__",
    "crop_resize_images",
    "decode_crop_resize_jpegs",
    "decode_jpeg_region",
    "decode_resize_crop_jpegs",
    "gather_columns",
    "gather_crop_resize",
    "gather_normalize",
    "gather_rows",
    "gather_u8",
    "get_num_threads",
    "jpeg_decoder",
    "jpeg_header",
    "max_threads",
    "normalization_table",
    "pillow_horizontal_first",
    "pillow_resize",
    "reference",
    "resize_crop_images",
    "set_num_threads",
    "set_simd",
    "simd_level",
    "simd_levels",
]

if _core.KERNELS_ABI != KERNELS_ABI:
    raise ImportError(
        f"tbl_kernels: compiled module has KERNELS_ABI {_core.KERNELS_ABI} but the Python package expects "
        f"{KERNELS_ABI}; reinstall with: pip install --force-reinstall tbl-kernels=={__version__}"
    )


def max_threads() -> int:
    """The most worker threads ``set_num_threads`` accepts: 64 per core the process may use, at least 256.

    Threads are created when the pool is sized; an unbounded count (a typo, 100000) would take the
    machine's process ids from every other process before the call returned."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(256, 64 * cores)


def set_num_threads(n: int) -> None:
    """Size the persistent worker pool used by every kernel (1 = run on the calling thread).

    ValueError for ``n`` below 1 or above `max_threads`, before any thread is made."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"set_num_threads takes an int, got {type(n).__name__}")
    if not 1 <= n <= max_threads():
        raise ValueError(f"set_num_threads: {n} threads is outside 1..{max_threads()} "
                         f"(64 per core this process may use, at least 256)")
    _core.set_num_threads(int(n))


def get_num_threads() -> int:
    """Number of threads the kernels use (default: ``os.cpu_count()``)."""
    return _core.get_num_threads()


def simd_levels() -> list[str]:
    """Instruction-set levels this build and this CPU can run, slowest first."""
    return list(_core.simd_levels())


def simd_level() -> str:
    """The instruction-set level the kernels use now."""
    return _core.simd_level()


def set_simd(level: str) -> None:
    """Select the instruction-set level: ``"auto"``, or one of ``simd_levels()``.

    Every level produces identical bits; this exists to test and measure them.
    The environment variable ``TBL_KERNELS_SIMD`` sets it at import.
    """
    _core.set_simd(level)


# Argument checks. The binding enforces every rule itself (arrays are taken with
# noconvert, so nothing is silently copied), but nanobind's refusal is a generic
# "incompatible function arguments" TypeError. The wrappers therefore call the
# binding first and, only when it refuses, run these checks to raise the error
# that names the problem: the common path pays nothing for readable messages,
# which matters for kernels called on small batches.


def _check_array(name: str, a: Any) -> None:
    if isinstance(a, np.ndarray) and not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (got strides {a.strides} for shape {a.shape})")


def _check_out(out: Any, name: str = "out") -> None:
    _check_array(name, out)
    if isinstance(out, np.ndarray) and not out.flags.writeable:
        raise ValueError(f"{name} is read-only")


def _check_list(name: str, value: Any, what: str) -> None:
    # Checked before the call: nanobind would take an array as a sequence of its rows.
    if type(value) is not list and (isinstance(value, np.ndarray) or not isinstance(value, Sequence)):
        raise TypeError(f"{name} must be a list of {what}, got {type(value).__name__}")


def _check_sources(sources: Sequence[Any], name: str = "sources") -> None:
    for k, s in enumerate(sources):
        _check_array(f"{name}[{k}]", s)
        if isinstance(s, np.ndarray) and s.dtype != np.uint8:
            raise TypeError(f"{name}[{k}] has dtype {s.dtype}; expected uint8")


def _check_indices(indices: Any) -> None:
    _check_array("indices", indices)
    if isinstance(indices, np.ndarray) and (indices.dtype != np.int64 or indices.ndim != 1):
        raise TypeError(
            f"indices must be a 1-D int64 array, got dtype {indices.dtype} and shape {indices.shape}"
        )


def _check_boxes(boxes: Any) -> None:
    _check_array("boxes", boxes)
    if isinstance(boxes, np.ndarray) and (boxes.dtype != np.int32 or boxes.ndim != 2):
        raise TypeError(f"boxes must be a 2-D int32 array (B, 4), got dtype {boxes.dtype} and shape {boxes.shape}")


def _check_windows(windows: Any) -> None:
    _check_array("windows", windows)
    if isinstance(windows, np.ndarray) and (windows.dtype != np.float64 or windows.ndim != 2):
        raise TypeError(
            f"windows must be a 2-D float64 array (B, 4), got dtype {windows.dtype} and shape {windows.shape}"
        )


def _call(kernel: Any, args: tuple[Any, ...], explain: Any) -> None:
    """``kernel(*args)``; if the binding refuses the arguments, raise the clearer error ``explain()`` finds."""
    try:
        kernel(*args)
    except TypeError:
        try:
            explain()
        except (TypeError, ValueError) as clearer:
            raise clearer from None
        raise


def _layout(layout: str | None, out: Any, channels: int | None) -> str:
    """Resolve ``layout=None`` from out's shape: (B, C, H, W) is CHW, (B, H, W, C) is HWC."""
    if layout is not None:
        if layout not in ("CHW", "HWC"):
            raise ValueError(f"layout must be 'CHW', 'HWC' or None, got {layout!r}")
        return layout
    shape = tuple(out.shape)
    if len(shape) != 4 or channels is None:
        return "CHW"  # the binding reports the shape error
    chw, hwc = shape[1] == channels, shape[3] == channels
    if chw and hwc:
        raise ValueError(
            f"out shape {shape} fits both CHW and HWC for {channels}-channel images: pass layout="
        )
    return "HWC" if hwc else "CHW"


def _affine_hint(table: Any) -> tuple[float, ...] | None:
    return table.affine_hint if isinstance(table, NormalizationTable) else None


def _channels(sources: list[Any]) -> int | None:
    return int(sources[0].shape[-1]) if sources and len(sources[0].shape) == 4 else None


def gather_normalize(
    sources: Sequence[Any],
    indices: Any,
    out: Any,
    table: Any,
    flip: Any = None,
    layout: str | None = None,
) -> None:
    """Gather images, optionally flip them horizontally, and normalize them through ``table``.

    ``sources``: list of C-contiguous uint8 arrays ``(N_k, H, W, C)``, C in {1, 3},
    read-only arrays accepted; ``indices`` (int64, shape ``(B,)``) address their
    concatenation. ``out``: ``(B, C, H, W)`` (CHW) or ``(B, H, W, C)`` (HWC), dtype
    matching ``table`` (from ``normalization_table``): float32 table -> float32 out,
    float16 -> float16, uint16 (bfloat16 bits) -> uint16, int16 or bfloat16 out.
    ``flip``: optional uint8/bool ``(B,)`` mask. ``layout``: ``"CHW"``, ``"HWC"`` or
    None to take it from out's shape. ``out[b] = table[c, sources[indices[b]]]``.
    """
    _check_list("sources", sources, "uint8 arrays")

    def explain() -> None:
        _check_sources(sources)
        _check_indices(indices)
        _check_out(out)

    layout = _layout(layout, out, _channels(sources))
    _call(_core.gather_normalize, (sources, indices, out, table, flip, layout, _affine_hint(table)), explain)


def gather_u8(
    sources: Sequence[Any], indices: Any, out: Any, flip: Any = None, layout: str | None = None
) -> None:
    """Like ``gather_normalize`` without the table: uint8 ``out``, gather + flip + layout only."""
    _check_list("sources", sources, "uint8 arrays")

    def explain() -> None:
        _check_sources(sources)
        _check_indices(indices)
        _check_out(out)

    _call(_core.gather_u8, (sources, indices, out, flip, _layout(layout, out, _channels(sources))), explain)


def gather_crop_resize(
    sources: Sequence[Any],
    indices: Any,
    boxes: Any,
    out: Any,
    table: Any = None,
    flip: Any = None,
    layout: str | None = None,
) -> None:
    """Gather, crop ``boxes``, resize to out's (OH, OW), flip, then normalize (or keep uint8).

    ``boxes``: int32 ``(B, 4)`` rows of ``(top, left, height, width)`` in source
    pixels, each non-empty and inside the image. Resampling is separable and
    fixed-point (the exact rule is in the package README, "Crop-resize rule"):
    per axis, triangle-filter weights with support ``max(in/out, 1)`` computed in
    float64 over the box only (the box edge is the image edge), quantized to
    ``floor(w * 2**14 + 0.5)``; a vertical pass then a horizontal pass, each
    summing ``coef * pixel`` in integers and rounding ``(acc + 2**13) >> 14``,
    clamped to 0..255 (so the intermediate is uint8). The flip is applied to the
    resized image; ``table=None`` writes uint8.
    """
    _check_list("sources", sources, "uint8 arrays")

    def explain() -> None:
        _check_sources(sources)
        _check_indices(indices)
        _check_boxes(boxes)
        _check_out(out)

    layout = _layout(layout, out, _channels(sources))
    args = (sources, indices, boxes, out, table, flip, layout, _affine_hint(table))
    _call(_core.gather_crop_resize, args, explain)


def crop_resize_images(
    images: Sequence[Any],
    boxes: Any,
    out: Any,
    table: Any = None,
    flip: Any = None,
    layout: str | None = None,
) -> None:
    """``gather_crop_resize`` over images of their own sizes: crop ``boxes[b]`` out of ``images[b]``.

    ``images``: list of B C-contiguous uint8 arrays ``(H_b, W_b, C)``, C in {1, 3}
    and the same for all, one per output sample (views into a file's heap are
    what it is made for: nothing is copied). ``boxes``: int32 ``(B, 4)`` rows of
    ``(top, left, height, width)`` inside each image's own ``H_b x W_b``. ``out``,
    ``table``, ``flip`` and ``layout`` as in ``gather_crop_resize``, and the same
    resampling rule, so a batch of equal-size images gives the same bits as
    ``gather_crop_resize``. New in 0.2.0 (``KERNELS_ABI`` 3).
    """
    _check_list("images", images, "uint8 arrays")

    def explain() -> None:
        _check_sources(images, "images")
        _check_boxes(boxes)
        _check_out(out)

    channels = int(images[0].shape[-1]) if images and len(images[0].shape) == 3 else None
    layout = _layout(layout, out, channels)
    _call(_core.crop_resize_images, (images, boxes, out, table, flip, layout, _affine_hint(table)), explain)


def resize_crop_images(
    images: Sequence[Any],
    windows: Any,
    out: Any,
    table: Any = None,
    flip: Any = None,
    layout: str | None = None,
) -> None:
    """Resize ``images[b]`` so that the window ``windows[b]`` maps onto out's (OH, OW), then flip and normalize.

    ``windows``: float64 ``(B, 4)`` rows of ``(top, left, height, width)`` in
    source pixels, fractional allowed, finite, non-empty and inside the image
    (``top + height <= H_b`` in float64). Output pixel ``o`` of an axis samples
    around ``top + (o + 0.5) * height / OH`` with support ``max(height / OH, 1)``,
    the taps clamped to the whole image, not the window: Pillow's
    ``resize(..., box=)`` rule, so resizing an image to ``(H', W')`` and cropping
    ``(t, l, OH, OW)`` is the window ``(t * H / H', l * W / W', OH * H / H', OW * W / W')``.
    Same fixed-point weights as ``crop_resize_images``, but the horizontal pass
    comes first (Pillow's order); the exact rule is in the package README,
    "Resize-crop rule". ``images``, ``out``, ``table``, ``flip`` and ``layout``
    as in ``crop_resize_images``. New in 0.2.0 (``KERNELS_ABI`` 3).
    """
    _check_list("images", images, "uint8 arrays")

    def explain() -> None:
        _check_sources(images, "images")
        _check_windows(windows)
        _check_out(out)

    channels = int(images[0].shape[-1]) if images and len(images[0].shape) == 3 else None
    layout = _layout(layout, out, channels)
    _call(_core.resize_crop_images, (images, windows, out, table, flip, layout, _affine_hint(table)), explain)


JpegError = _core.JpegError
"""A JPEG a decode call cannot serve (a ValueError): ``.index`` is its position in the batch and ``.kind`` says
why: ``"size"`` (its frame header disagrees with the declared size, found before anything is allocated),
``"unsupported"`` (not 8-bit greyscale or 3-component colour: CMYK, YCCK, 12-bit), ``"corrupt"`` (libjpeg's
error or warning, or more than ``JPEG_MAX_SCANS`` progressive scans)."""

JPEG_DCT_METHODS = ("accurate", "fast")
"""The IDCTs of the JPEG decode: libjpeg's accurate integer IDCT (``JDCT_ISLOW``, the default) and its fast one
(``JDCT_IFAST``, FFCV's choice; other pixels at full scale and at 1/2)."""

JPEG_MAX_SCANS = _core.JPEG_MAX_SCANS


def jpeg_decoder() -> dict[str, str]:
    """The identity of the JPEG decoder these kernels were built with: ``{"name": "libjpeg-turbo", "version":
    ...}``. Decoded pixels depend on it (IDCT, upsampling); it belongs in a stream's fingerprint."""
    return {"name": "libjpeg-turbo", "version": str(_core.JPEG_LIBRARY_VERSION)}


def _as_bytes_array(name: str, buffer: Any) -> Any:
    """``buffer`` as a 1-D uint8 array without a copy (bytes, memoryview and anything with the buffer protocol)."""
    if isinstance(buffer, np.ndarray):
        if buffer.dtype != np.uint8 or buffer.ndim != 1:
            raise TypeError(f"{name} must be 1-D uint8 JPEG bytes, got {buffer.dtype} {buffer.shape}")
        return buffer
    try:
        view = memoryview(buffer)
    except TypeError:
        raise TypeError(f"{name} must be bytes-like JPEG data, got {type(buffer).__name__}") from None
    if not view.c_contiguous:
        raise TypeError(f"{name} must be contiguous")
    return np.frombuffer(view.cast("B") if view.format != "B" or view.ndim != 1 else view, dtype=np.uint8)


def _check_sizes(sizes: Any) -> None:
    _check_array("sizes", sizes)
    if isinstance(sizes, np.ndarray) and (sizes.dtype != np.int64 or sizes.ndim != 2):
        raise TypeError(f"sizes must be a 2-D int64 array (B, 2), got dtype {sizes.dtype} and shape {sizes.shape}")


def _fast_idct(dct: str) -> bool:
    if dct not in JPEG_DCT_METHODS:
        raise ValueError(f"dct must be one of {JPEG_DCT_METHODS}, got {dct!r}")
    return dct == "fast"


def decode_crop_resize_jpegs(
    buffers: Sequence[Any],
    sizes: Any,
    boxes: Any,
    out: Any,
    table: Any = None,
    flip: Any = None,
    layout: str | None = None,
    dct: str = "accurate",
) -> None:
    """Decode only what ``boxes[b]`` needs of JPEG ``buffers[b]``, at the DCT scale the box allows, and crop-resize
    it into ``out[b]``: one call, GIL released, on the kernels' pool.

    ``buffers``: list of B JPEGs (bytes, memoryviews or 1-D uint8 arrays; not copied). ``sizes``: int64
    ``(B, 2)`` declared ``(height, width)`` of each; a frame header that disagrees is refused before the decoder
    allocates anything. ``boxes``: int32 ``(B, 4)`` ``(top, left, height, width)`` inside the declared size.
    ``out``, ``table``, ``flip``, ``layout`` as in ``crop_resize_images`` (3 channels: greyscale JPEGs are
    expanded to RGB). ``dct``: one of ``JPEG_DCT_METHODS``.

    Per sample (the exact rule is in the package README, "JPEG decode"): the DCT scale 1/k is the largest k in
    (8, 4, 2, 1) with ``box_h >= k * OH`` and ``box_w >= k * OW``; the box is mapped onto the decoded
    ``ceil(H / k) x ceil(W / k)`` image outward to whole pixels; only the iMCU columns and rows that hold the
    mapped box are decoded; then the crop-resize rule, flip and table, as ``crop_resize_images`` on the whole
    decoded image with the mapped box gives. A JPEG that cannot be served raises ``JpegError`` naming the lowest
    such position after the pass (the others are written). New in 0.3.0 (``KERNELS_ABI`` 4).
    """
    _check_list("buffers", buffers, "JPEG buffers")
    arrays = [_as_bytes_array(f"buffers[{k}]", b) for k, b in enumerate(buffers)]
    fast = _fast_idct(dct)

    def explain() -> None:
        _check_sizes(sizes)
        _check_boxes(boxes)
        _check_out(out)

    layout = _layout(layout, out, 3)
    _call(_core.decode_crop_resize_jpegs,
          (arrays, sizes, boxes, out, table, flip, layout, _affine_hint(table), fast), explain)


def decode_resize_crop_jpegs(
    buffers: Sequence[Any],
    sizes: Any,
    windows: Any,
    out: Any,
    table: Any = None,
    flip: Any = None,
    layout: str | None = None,
    dct: str = "accurate",
) -> None:
    """``decode_crop_resize_jpegs`` with float64 ``windows`` and the resize-crop rule of ``resize_crop_images``.

    The scale k is chosen from the window's size as for a box; the window is scaled onto the decoded image
    (``size * (ceil(H / k) / H)``, capped at the side, the start lowered by ulps until it fits) and only the
    rows and columns its taps read are decoded. New in 0.3.0 (``KERNELS_ABI`` 4).
    """
    _check_list("buffers", buffers, "JPEG buffers")
    arrays = [_as_bytes_array(f"buffers[{k}]", b) for k, b in enumerate(buffers)]
    fast = _fast_idct(dct)

    def explain() -> None:
        _check_sizes(sizes)
        _check_windows(windows)
        _check_out(out)

    layout = _layout(layout, out, 3)
    _call(_core.decode_resize_crop_jpegs,
          (arrays, sizes, windows, out, table, flip, layout, _affine_hint(table), fast), explain)


def decode_jpeg_region(
    buffer: Any,
    size: tuple[int, int],
    scale: int = 1,
    region: tuple[int, int, int, int] | None = None,
    out: Any = None,
    dct: str = "accurate",
) -> np.ndarray:
    """``region`` ``(top, left, height, width)`` of JPEG ``buffer`` (declared ``size`` = (height, width)) decoded
    as RGB at DCT scale 1/``scale`` (1, 2, 4, 8; the image is then ``ceil(H / scale) x ceil(W / scale)``), by the
    same decode as ``decode_crop_resize_jpegs``; default the whole image. Returns ``out`` (uint8
    ``(height, width, 3)``, allocated when None). Runs on the calling thread, GIL released. JpegError (index 0)
    for a JPEG that cannot be served. New in 0.3.0 (``KERNELS_ABI`` 4).
    """
    array = _as_bytes_array("buffer", buffer)
    height, width = (int(v) for v in size)
    scale = int(scale)
    if region is None:
        region = (0, 0, -(-height // max(scale, 1)), -(-width // max(scale, 1)))
    region = tuple(int(v) for v in region)
    if out is None:
        out = np.empty((max(region[2], 0), max(region[3], 0), 3), np.uint8)
    _call(_core.decode_jpeg_region, (array, height, width, scale, region, out, _fast_idct(dct)),
          lambda: _check_out(out))
    return out


def jpeg_header(buffer: Any) -> tuple[int, int, int, int, bool]:
    """``(height, width, components, precision, progressive)`` of JPEG ``buffer``'s frame header, read by
    libjpeg (nothing decoded); JpegError when libjpeg cannot read it."""
    return tuple(_core.jpeg_header(_as_bytes_array("buffer", buffer)))


def gather_rows(sources: Sequence[Any], indices: Any, out: Any) -> None:
    """Copy row ``indices[b]`` of the concatenated uint8 ``(N_k, rowbytes)`` sources into ``out[b]``."""
    _check_list("sources", sources, "uint8 arrays")

    def explain() -> None:
        _check_sources(sources)
        _check_indices(indices)
        _check_out(out)

    _call(_core.gather_rows, (sources, indices, out), explain)


def gather_columns(columns: Sequence[Sequence[Any]], indices: Any, outs: Sequence[Any]) -> None:
    """``gather_rows`` of several columns over the same rows, in one call.

    ``columns[l]`` is the list of uint8 ``(N_k, rowbytes_l)`` segments of column
    ``l`` (one fixed-size field split over shards); every column must have
    segments of the same row counts. ``outs[l]``: uint8 ``(B, rowbytes_l)``.
    ``outs[l][b] = concat(columns[l])[indices[b]]``. The segment of each index is
    found once for all columns, and the whole call costs one crossing into C++,
    which is what matters for small batches of small rows.
    """
    _check_list("columns", columns, "lists of uint8 arrays")
    for k, sources in enumerate(columns):
        _check_list(f"columns[{k}]", sources, "uint8 arrays")
    _check_list("outs", outs, "uint8 arrays")

    def explain() -> None:
        for k, sources in enumerate(columns):
            _check_sources(sources, f"columns[{k}]")
        _check_indices(indices)
        for k, out in enumerate(outs):
            _check_out(out, f"outs[{k}]")

    _call(_core.gather_columns, (columns, indices, outs), explain)


_simd_env = os.environ.get("TBL_KERNELS_SIMD")
if _simd_env:
    set_simd(_simd_env)


PILLOW_FILTERS = {"lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
"""The filters `pillow_resize` takes, by name, with Pillow's ``Image.Resampling`` codes."""


class PillowLayoutError(ValueError):
    """The image's pixels are not one block that Pillow can lend (a multi-block image): resize it with Pillow."""


def pillow_resize(image: Any, out: Any, resample: str = "bilinear",
                  box: tuple[float, float, float, float] | None = None) -> None:
    """Pillow's ``image.resize((OW, OH), resample, box=box)`` of an RGB Pillow image, bit for bit, into ``out``.

    ``out``: a C-contiguous uint8 ``(OH, OW, 3)`` array; it receives the bytes
    of ``np.asarray(image.resize(...))``, so no Pillow image is made and no
    ``tobytes()`` copy. The pixels are read where Pillow keeps them, lent
    through the Arrow C data interface (``image.__arrow_c_array__``, Pillow
    11.2 or newer). The arithmetic is Pillow's own (``libImaging/Resample.c``):
    double-precision weights of the filter rounded to 22-bit fixed point, one
    pass per axis that changes, in the installed Pillow's order
    (`pillow_horizontal_first`), each summed in int32 and rounded to uint8; an
    integral ``box`` of the output's size is a plain crop, as in Pillow. ``resample``: a key of ``PILLOW_FILTERS`` (no nearest). ``box``:
    ``(left, upper, right, lower)``, taken in single precision as Pillow takes
    it; default the whole image. Runs on the calling thread, GIL released.

    Bit-exactness assumes Pillow's weights come out as they do in Pillow's
    x86-64 builds (no fused multiply-add in its double arithmetic); a caller
    that must match the installed Pillow checks a few images first, as
    ``tbl convert`` does. Raises PillowLayoutError for an image Pillow cannot
    lend in one piece (larger than Pillow's block size), ValueError for a mode
    other than RGB, an unknown filter or a box Pillow refuses (Pillow's
    messages). New in 0.2.0 (``KERNELS_ABI`` 3).
    """
    if getattr(image, "mode", None) != "RGB":
        raise ValueError(f"pillow_resize takes an RGB Pillow image, got mode {getattr(image, 'mode', None)!r}")
    if resample not in PILLOW_FILTERS:
        raise ValueError(f"resample must be one of {tuple(PILLOW_FILTERS)}, got {resample!r}")
    export = getattr(image, "__arrow_c_array__", None)
    if export is None:
        raise TypeError("pillow_resize needs Pillow 11.2 or newer (images that export Arrow arrays)")
    width, height = image.size
    if box is None:
        box = (0.0, 0.0, float(width), float(height))
    if not all(np.isfinite(np.float32(v)) for v in box):  # Pillow refuses these; the kernel would average nothing
        raise ValueError(f"box must hold finite numbers, got {tuple(box)}")
    try:
        schema, array = export()
    except ValueError as e:  # Pillow lends only single-block images
        raise PillowLayoutError(f"Pillow cannot lend this {width}x{height} image's pixels in one piece: {e}") from e

    def explain() -> None:
        _check_out(out)
        if isinstance(out, np.ndarray) and (out.dtype != np.uint8 or out.ndim != 3):
            raise TypeError(f"out must be a uint8 (height, width, 3) array, got {out.dtype} {out.shape}")

    out_size = (int(out.shape[1]), int(out.shape[0])) if len(getattr(out, "shape", ())) == 3 else (1, 1)
    horizontal_first = pillow_horizontal_first((width, height), out_size)  # a wrong out is refused below
    _call(_core.pillow_resize,
          (schema, array, width, height, tuple(map(float, box)), PILLOW_FILTERS[resample], horizontal_first, out),
          explain)


def pillow_horizontal_first(size: tuple[int, int], out_size: tuple[int, int]) -> bool:
    """Whether the installed Pillow resamples ``size`` to ``out_size`` horizontally first, where both axes change.

    Pillow 13 runs the vertical pass first where the height shrinks by more than twice as many pixels as the
    width (image sizes, not the box: ``libImaging/Resample.c``); earlier releases always run the horizontal
    pass first. The order changes the rounding of the intermediate image, so it changes the result.
    """
    (width, height), (out_width, out_height) = size, out_size
    if _pillow_release() < (13,):
        return True
    shrink = height - out_height
    return not (shrink > 0 and shrink > (width - out_width) * 2)


@functools.cache
def _pillow_release() -> tuple[int, ...]:
    import PIL  # only reached with a Pillow image in hand

    return tuple(int(p) for p in PIL.__version__.split(".")[:2] if p.isdigit())
