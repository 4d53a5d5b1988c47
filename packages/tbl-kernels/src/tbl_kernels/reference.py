"""Pure-numpy reference implementations of every kernel (bit-identical results).

Same signatures and output conventions as the compiled kernels in ``tbl_kernels``;
each writes into ``out`` and returns it. They exist to define and test the
kernels, not to be fast. Only simple validation is done here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .tables import normalization_table

__all__ = [
    "PRECISION_BITS",
    "crop_resize_images",
    "crop_resize_u8",
    "decode_crop_resize_jpegs",
    "decode_resize_crop_jpegs",
    "gather_columns",
    "gather_crop_resize",
    "gather_normalize",
    "gather_rows",
    "gather_u8",
    "jpeg_dct_scale",
    "jpeg_scale_box",
    "jpeg_scale_window",
    "normalization_table",
    "resample_matrix",
    "resample_weights",
    "resize_crop_images",
    "resize_crop_u8",
]

PRECISION_BITS = 14  # fixed-point bits of the resampling coefficients


def _concat_lookup(sources: Sequence[np.ndarray], indices: np.ndarray) -> np.ndarray:
    """Rows ``indices`` of the concatenation of ``sources`` (a copy)."""
    indices = np.asarray(indices)
    ends = np.cumsum([len(s) for s in sources])
    total = int(ends[-1]) if len(ends) else 0
    bad = np.flatnonzero((indices < 0) | (indices >= total))
    if bad.size:
        b = int(bad[0])
        raise IndexError(f"indices[{b}] = {int(indices[b])} is out of range for {total} samples")
    seg = np.searchsorted(ends, indices, side="right")
    starts = np.concatenate([[0], ends[:-1]])
    rows = [sources[int(s)][int(i - starts[s])] for s, i in zip(seg, indices, strict=True)]
    if not rows:
        return np.empty((0, *sources[0].shape[1:]), dtype=sources[0].dtype)
    return np.stack(rows)


def _layout_of(out: np.ndarray, channels: int, layout: str | None) -> str:
    if layout is not None:
        return layout
    chw, hwc = out.shape[1] == channels, out.shape[3] == channels
    if chw and hwc:
        raise ValueError(f"out shape {out.shape} fits both CHW and HWC: pass layout=")
    return "HWC" if hwc else "CHW"


def _finish(
    images: np.ndarray, out: np.ndarray, table: np.ndarray | None, flip, layout: str | None
) -> np.ndarray:
    """Flip, map through table, and write HWC uint8 ``images`` into ``out``."""
    channels = images.shape[-1]
    layout = _layout_of(out, channels, layout)
    if flip is not None:
        mask = np.asarray(flip).astype(bool)
        images = images.copy()
        images[mask] = images[mask][:, :, ::-1]
    if table is not None:
        values = np.asarray(table)[np.arange(channels), images]  # (B, H, W, C), table dtype
    else:
        values = images
    if layout == "CHW":
        values = values.transpose(0, 3, 1, 2)
    out.view(values.dtype)[...] = values
    return out


def gather_normalize(sources, indices, out, table, flip=None, layout=None) -> np.ndarray:
    """``out[b] = table[c, sources[indices[b]]]`` after the optional flip, in CHW or HWC."""
    return _finish(_concat_lookup(sources, indices), out, table, flip, layout)


def gather_u8(sources, indices, out, flip=None, layout=None) -> np.ndarray:
    """Gather + flip + layout, uint8 output."""
    return _finish(_concat_lookup(sources, indices), out, None, flip, layout)


def gather_rows(sources, indices, out) -> np.ndarray:
    """``out[b] = concat(sources)[indices[b]]`` for uint8 ``(N_k, rowbytes)`` sources."""
    out[...] = _concat_lookup(sources, indices)
    return out


def gather_columns(columns, indices, outs) -> list[np.ndarray]:
    """``gather_rows`` for each column ``columns[l]`` into ``outs[l]``, with the same indices."""
    for sources, out in zip(columns, outs, strict=True):
        gather_rows(sources, indices, out)
    return list(outs)


def resample_weights(
    in_size: int, out_size: int, box0: float = 0.0, box_size: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-output first input position and integer coefficients for one axis.

    Returns ``(xmin, coef)``: ``xmin`` int64 ``(out_size,)`` and ``coef`` int64
    ``(out_size, window)``; output ``o`` is ``sum_k coef[o, k] * in[xmin[o] + k]``
    (entries past the clamped support are 0). The float64 operations are exactly
    those of the compiled kernel (see README, "Crop-resize rule" and
    "Resize-crop rule"). ``box0`` / ``box_size``: the window of the input that
    maps onto the output (default the whole input); the taps are clamped to the
    whole input ``[0, in_size)`` either way.
    """
    if in_size < 1 or out_size < 1:
        raise ValueError(f"sizes must be >= 1, got in_size={in_size} out_size={out_size}")
    box0 = float(box0)
    box_size = float(in_size) if box_size is None else float(box_size)
    if not (np.isfinite(box0) and np.isfinite(box_size) and box_size > 0.0 and box0 >= 0.0
            and box0 + box_size <= float(in_size)):
        raise ValueError(f"window ({box0!r}, {box_size!r}) is not a non-empty part of [0, {in_size})")
    scale = box_size / float(out_size)
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    ss = 1.0 / filterscale
    window = int(np.ceil(support)) * 2 + 1
    center = box0 + (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    xmin = np.maximum(np.floor(center - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.floor(center + support + 0.5), in_size).astype(np.int64)
    count = xmax - xmin
    weights = np.zeros((out_size, window), dtype=np.float64)
    total = np.zeros(out_size, dtype=np.float64)
    for x in range(window):  # sequential sum over taps, as in the kernel
        valid = x < count
        t = np.abs(((x + xmin).astype(np.float64) - center + 0.5) * ss)
        w = np.where(valid & (t < 1.0), 1.0 - t, 0.0)
        weights[:, x] = w
        total = total + w
    nonzero = total != 0.0
    normalized = np.where(nonzero[:, None], weights / np.where(nonzero, total, 1.0)[:, None], weights)
    coef = np.floor(normalized * float(1 << PRECISION_BITS) + 0.5).astype(np.int64)
    return xmin, coef


def resample_matrix(in_size: int, out_size: int, box0: float = 0.0, box_size: float | None = None) -> np.ndarray:
    """Dense ``(out_size, in_size)`` int64 matrix of the fixed-point coefficients (window as in resample_weights)."""
    xmin, coef = resample_weights(in_size, out_size, box0, box_size)
    m = np.zeros((out_size, in_size + coef.shape[1]), dtype=np.int64)
    rows = np.arange(out_size)[:, None]
    m[rows, xmin[:, None] + np.arange(coef.shape[1])[None, :]] = coef
    assert not m[:, in_size:].any()  # the support never leaves the input
    return m[:, :in_size]


def _round_shift(acc: np.ndarray) -> np.ndarray:
    half = 1 << (PRECISION_BITS - 1)
    return np.clip((acc + half) >> PRECISION_BITS, 0, 255).astype(np.uint8)


def crop_resize_u8(image: np.ndarray, box, out_h: int, out_w: int) -> np.ndarray:
    """Crop ``box`` = (top, left, height, width) of an HWC uint8 image and resize it to (out_h, out_w).

    Vertical pass, uint8 rounding, horizontal pass, uint8 rounding. The sums are
    done as float64 matrix products: every term and partial sum is an integer far
    below 2**53, so they are exact in any summation order.
    """
    top, left, h, w = (int(v) for v in box)
    crop = image[top : top + h, left : left + w].astype(np.float64)  # (h, w, C)
    mv = resample_matrix(h, out_h).astype(np.float64)
    mh = resample_matrix(w, out_w).astype(np.float64)
    vpass = _round_shift(np.einsum("oy,ywc->owc", mv, crop).astype(np.int64))
    hpass = _round_shift(np.einsum("px,oxc->opc", mh, vpass.astype(np.float64)).astype(np.int64))
    return hpass


def gather_crop_resize(sources, indices, boxes, out, table=None, flip=None, layout=None) -> np.ndarray:
    """Gather, crop-resize each ``boxes[b]`` to out's size, flip, map through ``table`` (or uint8)."""
    images = _concat_lookup(sources, indices)
    channels = images.shape[-1]
    layout = _layout_of(out, channels, layout)
    oh, ow = (out.shape[2], out.shape[3]) if layout == "CHW" else (out.shape[1], out.shape[2])
    boxes = np.asarray(boxes)
    resized = np.empty((len(images), oh, ow, channels), dtype=np.uint8)
    for b in range(len(images)):
        resized[b] = crop_resize_u8(images[b], boxes[b], oh, ow)
    return _finish(resized, out, table, flip, layout)


def crop_resize_images(images, boxes, out, table=None, flip=None, layout=None) -> np.ndarray:
    """``gather_crop_resize`` over a list of HWC uint8 images of their own sizes, one per output sample."""
    channels = images[0].shape[-1] if len(images) else (out.shape[1] if layout != "HWC" else out.shape[3])
    layout = _layout_of(out, channels, layout)
    oh, ow = (out.shape[2], out.shape[3]) if layout == "CHW" else (out.shape[1], out.shape[2])
    boxes = np.asarray(boxes)
    resized = np.empty((len(images), oh, ow, channels), dtype=np.uint8)
    for b, image in enumerate(images):
        resized[b] = crop_resize_u8(image, boxes[b], oh, ow)
    return _finish(resized, out, table, flip, layout)


def resize_crop_u8(image: np.ndarray, window, out_h: int, out_w: int) -> np.ndarray:
    """Resize an HWC uint8 image so that ``window`` = (top, left, height, width) becomes (out_h, out_w).

    The window may be fractional; the taps are clamped to the whole image, so this
    is resizing the whole image and cropping, computed for the crop only.
    Horizontal pass, uint8 rounding, vertical pass, uint8 rounding (Pillow's
    order). Exact float64 matrix products, as in ``crop_resize_u8``.
    """
    top, left, h, w = (float(v) for v in window)
    img = image.astype(np.float64)  # (H, W, C)
    mh = resample_matrix(image.shape[1], out_w, left, w).astype(np.float64)
    mv = resample_matrix(image.shape[0], out_h, top, h).astype(np.float64)
    hpass = _round_shift(np.einsum("px,yxc->ypc", mh, img).astype(np.int64))
    return _round_shift(np.einsum("oy,ypc->opc", mv, hpass.astype(np.float64)).astype(np.int64))


def resize_crop_images(images, windows, out, table=None, flip=None, layout=None) -> np.ndarray:
    """Resize each ``images[b]`` so that ``windows[b]`` (float64) maps onto out's size, flip, map through ``table``."""
    channels = images[0].shape[-1] if len(images) else (out.shape[1] if layout != "HWC" else out.shape[3])
    layout = _layout_of(out, channels, layout)
    oh, ow = (out.shape[2], out.shape[3]) if layout == "CHW" else (out.shape[1], out.shape[2])
    windows = np.asarray(windows, dtype=np.float64)
    resized = np.empty((len(images), oh, ow, channels), dtype=np.uint8)
    for b, image in enumerate(images):
        resized[b] = resize_crop_u8(image, windows[b], oh, ow)
    return _finish(resized, out, table, flip, layout)


# ---------------------------------------------------------------- JPEG decode (rules of decode_crop_resize_jpegs)

JPEG_SCALES = (8, 4, 2, 1)


def jpeg_dct_scale(box_h: float, box_w: float, out_h: int, out_w: int) -> int:
    """The DCT scale denominator k of a box (or float64 window) of ``box_h x box_w`` for an ``out_h x out_w``
    output: the largest k in (8, 4, 2, 1) with ``box_h >= k * out_h`` and ``box_w >= k * out_w``."""
    for k in JPEG_SCALES[:-1]:
        if box_h >= k * out_h and box_w >= k * out_w:
            return k
    return 1


def jpeg_scale_box(box, size: tuple[int, int], scale: int) -> tuple[int, int, int, int]:
    """An int box of a ``size`` = (H, W) image mapped onto its decode at 1/``scale`` (``ceil(H / scale)`` x
    ``ceil(W / scale)``): per axis ``start' = floor(start * d / n)``, ``end' = ceil((start + size) * d / n)``,
    at least one pixel, inside the decoded image."""
    out = []
    for axis in (0, 1):
        n = int(size[axis])
        d = -(-n // scale)
        start, extent = int(box[axis]), int(box[axis + 2])
        lo = start * d // n
        hi = -(-(start + extent) * d // n)
        hi = min(max(hi, lo + 1), d)
        lo = min(lo, hi - 1)
        out.append((lo, hi - lo))
    return (out[0][0], out[1][0], out[0][1], out[1][1])


def jpeg_scale_window(window, size: tuple[int, int], scale: int) -> tuple[float, float, float, float]:
    """A float64 window of a ``size`` image scaled onto its decode at 1/``scale``: start and size times
    ``d / n`` (float64), the size capped at ``d``, the start lowered by ulps until ``start + size <= d``."""
    out = []
    for axis in (0, 1):
        n = int(size[axis])
        d = -(-n // scale)
        ratio = float(d) / float(n)
        start, extent = float(window[axis]) * ratio, min(float(window[axis + 2]) * ratio, float(d))
        while start + extent > d:
            start = max(float(np.nextafter(start, 0.0)), 0.0)
        out.append((start, extent))
    return (out[0][0], out[1][0], out[0][1], out[1][1])


def decode_crop_resize_jpegs(buffers, sizes, boxes, out, table=None, flip=None, layout=None, *,
                             decode) -> np.ndarray:
    """``decode_crop_resize_jpegs`` by its definition: decode each whole image at the box's DCT scale with
    ``decode(data, (H, W), k)`` (the whole image as uint8 RGB, e.g. ``tbl_kernels.decode_jpeg_region``: numpy
    has no JPEG decoder), map the box (``jpeg_scale_box``), then ``crop_resize_images``."""
    layout = _layout_of(out, 3, layout)
    oh, ow = (out.shape[2], out.shape[3]) if layout == "CHW" else (out.shape[1], out.shape[2])
    images, mapped = [], []
    for b, data in enumerate(buffers):
        size = (int(sizes[b][0]), int(sizes[b][1]))
        k = jpeg_dct_scale(int(boxes[b][2]), int(boxes[b][3]), oh, ow)
        images.append(decode(data, size, k))
        mapped.append(jpeg_scale_box(boxes[b], size, k))
    return crop_resize_images(images, np.array(mapped, np.int64).reshape(-1, 4), out, table, flip, layout)


def decode_resize_crop_jpegs(buffers, sizes, windows, out, table=None, flip=None, layout=None, *,
                             decode) -> np.ndarray:
    """``decode_resize_crop_jpegs`` by its definition: whole decode at the window's DCT scale with ``decode``
    (as in ``decode_crop_resize_jpegs``), the window scaled (``jpeg_scale_window``), then
    ``resize_crop_images``."""
    layout = _layout_of(out, 3, layout)
    oh, ow = (out.shape[2], out.shape[3]) if layout == "CHW" else (out.shape[1], out.shape[2])
    images, mapped = [], []
    for b, data in enumerate(buffers):
        size = (int(sizes[b][0]), int(sizes[b][1]))
        k = jpeg_dct_scale(float(windows[b][2]), float(windows[b][3]), oh, ow)
        images.append(decode(data, size, k))
        mapped.append(jpeg_scale_window(windows[b], size, k))
    return resize_crop_images(images, np.array(mapped, np.float64).reshape(-1, 4), out, table, flip, layout)
