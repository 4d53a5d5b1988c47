"""Crop-resize on the device with the CPU kernel's fixed-point rule, in integer arithmetic (exact).

The rule (tbl-kernels README, "Crop-resize rule"; ``tbl_kernels.reference``):
per axis, output ``o`` of a box of ``in`` pixels resized to ``out`` is
``sum_k coef[o, k] * pixel[xmin[o] + k]`` with integer coefficients (14 fractional
bits) that depend only on ``(in, out)``; the vertical pass runs first and rounds
to uint8 as ``clamp((acc + 2**13) >> 14, 0, 255)``, then the horizontal pass
does the same. The flip mirrors the resized image.

The coefficients come from ``tbl_kernels.reference.resample_weights`` (the
normative float64 computation), evaluated once per loader for every possible
box size and kept as lookup tables. Per batch the CPU turns the boxes into
tap rows (a few kilobytes of row indices and coefficients) which are uploaded;
the device then runs one ``index_select`` and one multiply-add per tap and
axis in int32. Every product and partial sum is an integer below 2**31, so the
result is bit-identical to the CPU kernel on every device, whatever order the
device sums in. Mirroring is folded into the horizontal taps (a flipped
sample's output columns take their taps in reverse order), so it costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tbl_kernels.reference import PRECISION_BITS, resample_weights

__all__ = ["AxisTable", "CropTaps", "crop_resize_u8", "crop_taps"]

_HALF = 1 << (PRECISION_BITS - 1)


@dataclass(frozen=True)
class AxisTable:
    """Resampling coefficients for one axis: every box size ``1..in_max`` resized to ``out``.

    ``start[s, o]`` is the first input offset (within the box) of output ``o``
    for a box of ``s`` pixels and ``coef[s, o, k]`` its ``k``-th coefficient
    (zero past the support). Row 0 is unused.
    """

    out: int
    start: np.ndarray  # int64 (in_max + 1, out)
    coef: np.ndarray  # int32 (in_max + 1, out, window)

    @classmethod
    def build(cls, in_max: int, out: int) -> AxisTable:
        per_size = [resample_weights(s, out) for s in range(1, in_max + 1)]
        window = max(c.shape[1] for _, c in per_size)
        start = np.zeros((in_max + 1, out), dtype=np.int64)
        coef = np.zeros((in_max + 1, out, window), dtype=np.int32)
        for s, (xmin, c) in enumerate(per_size, start=1):
            start[s] = xmin
            coef[s, :, : c.shape[1]] = c
        return cls(out, start, coef)

    def taps(self, base: np.ndarray, offset: np.ndarray, size: np.ndarray, mirror: np.ndarray | None):
        """Global input rows and coefficients, each ``(window, B * out)``, for boxes ``[offset, offset + size)``.

        Sample ``b`` reads rows ``base[b] + offset[b] + ...`` of a flattened input
        (one image row or column per input row). ``mirror`` reverses a sample's
        output order. Taps past a box's support carry coefficient 0 and a clamped,
        valid row.
        """
        start = self.start[size]  # (B, out)
        coef = self.coef[size]  # (B, out, window)
        used = np.flatnonzero(coef.any(axis=(0, 1)))
        window = int(used[-1]) + 1 if used.size else 1
        coef = coef[:, :, :window]
        k = np.arange(window, dtype=np.int64)
        local = np.minimum(start[:, :, None] + k, (size - 1)[:, None, None])
        rows = (base + offset)[:, None, None] + local
        if mirror is not None and mirror.any():
            rows[mirror] = rows[mirror][:, ::-1]
            coef = coef.copy()
            coef[mirror] = coef[mirror][:, ::-1]
        # (window, B * out): one contiguous index vector per tap.
        return (np.ascontiguousarray(rows.reshape(-1, window).T),
                np.ascontiguousarray(coef.reshape(-1, window).T))


@dataclass(frozen=True)
class CropTaps:
    """One batch's taps on the device: rows int64 and coefficients int32, ``(window, B * out)`` per axis."""

    v_rows: torch.Tensor
    v_coef: torch.Tensor
    h_rows: torch.Tensor
    h_coef: torch.Tensor


def crop_taps(
    sample_ids: np.ndarray,
    boxes: np.ndarray,
    flip: np.ndarray | None,
    height: int,
    width: int,
    vertical: AxisTable,
    horizontal: AxisTable,
    device: torch.device,
) -> CropTaps:
    """Taps for cropping ``boxes`` (int32 ``(B, 4)``: top, left, height, width) out of the
    ``height x width`` images ``sample_ids`` of the resident dataset, on ``device``."""
    boxes = np.asarray(boxes, dtype=np.int64)
    ids = np.asarray(sample_ids, dtype=np.int64)
    top, left, h, w = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    bad = np.flatnonzero((h < 1) | (w < 1) | (top < 0) | (left < 0) | (top + h > height) | (left + w > width))
    if bad.size:
        b = int(bad[0])
        raise IndexError(f"crop box {boxes[b].tolist()} of sample {int(ids[b])} is empty or leaves the "
                         f"{height}x{width} image")
    # Vertical taps read image rows straight from the resident (N * H, W * C) view; horizontal
    # taps read the columns of the batch's (B * W, out_h * C) transposed vertical result.
    v_rows, v_coef = vertical.taps(ids * height, top, h, None)
    h_rows, h_coef = horizontal.taps(np.arange(ids.shape[0], dtype=np.int64) * width, left, w,
                                     None if flip is None else np.asarray(flip, dtype=bool))
    pin = device.type == "cuda"

    def up(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(a)
        return t.pin_memory().to(device, non_blocking=True) if pin else t.to(device)

    return CropTaps(up(v_rows), up(v_coef), up(h_rows), up(h_coef))


def _pass(flat: torch.Tensor, rows: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """One axis: ``out[j] = clamp((sum_k coef[k, j] * flat[rows[k, j]] + 2**13) >> 14)`` as uint8 rows."""
    # uint8 rows times int32 coefficients promote to int32 inside one kernel (no widened copy).
    acc = torch.mul(flat.index_select(0, rows[0]), coef[0].unsqueeze(1))
    for k in range(1, rows.shape[0]):
        acc.addcmul_(flat.index_select(0, rows[k]), coef[k].unsqueeze(1))
    acc.add_(_HALF).bitwise_right_shift_(PRECISION_BITS).clamp_(0, 255)
    return acc.to(torch.uint8)


def crop_resize_u8(images: torch.Tensor, taps: CropTaps, out_h: int, out_w: int) -> torch.Tensor:
    """Crop-resize (and mirror) the batch described by ``taps`` out of the resident ``(N, H, W, C)`` uint8
    images; returns a ``(B, out_h, out_w, C)`` uint8 view of a new tensor."""
    n, h, w, c = images.shape
    batch = taps.h_rows.shape[1] // out_w
    vertical = _pass(images.view(n * h, w * c), taps.v_rows, taps.v_coef)  # (B * out_h, W * C)
    columns = vertical.view(batch, out_h, w, c).transpose(1, 2).reshape(batch * w, out_h * c)
    horizontal = _pass(columns, taps.h_rows, taps.h_coef)  # (B * out_w, out_h * C)
    return horizontal.view(batch, out_w, out_h, c).transpose(1, 2)
