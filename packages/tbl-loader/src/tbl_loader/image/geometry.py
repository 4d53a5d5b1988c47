"""Geometry leaves: boxes that follow the served crop, resize and flip of their image, exactly.

``ImageLoader(..., fields=("boxes",), geometry={"boxes": "xyxy"})`` declares the
field ``boxes`` as bounding boxes ``(x1, y1, x2, y2)`` in stored pixels (as
torchvision v2's ``tv_tensors.BoundingBoxes`` in ``XYXY`` format: x to the right,
y down, pixel edges at integers, so the whole image is ``(0, 0, W, H)``). Each
row holds ``(k, 4)`` boxes: a variable-shape array leaf (``var="list"`` or
``"pad"``) or a fixed-shape one. ``GEOMETRY_KINDS`` lists the kinds.

Every batch carries the geometry of its first view, whatever the storage
(:class:`~tbl_loader.Batch`): ``crop_boxes`` float64 ``(N, 4)`` ``(top, left,
height, width)``, the region of the stored image that was resized onto the
``(OH, OW)`` output, and ``flips`` bool ``(N,)``, whether the output was then
flipped horizontally. Without a crop the region is the whole image; for the
evaluation transform (``resize`` + ``center_crop``) it is the fractional window
of torchvision's geometry; for JPEG storage decoded at a reduced DCT scale it
is the region the decoded pixels came from, in stored pixels.

The rule (`map_boxes`), computed in float64 for each box of sample ``i`` with
``(top, left, height, width) = crop_boxes[i]``, rounded once to the output dtype
(float64 for a float64 leaf, else float32)::

    x = ((x_stored - left) * OW) / width      # each of x1, x2
    y = ((y_stored - top) * OH) / height      # each of y1, y2
    x, y = clip(x, 0, OW), clip(y, 0, OH)     # boxes are clipped to the output
    if flips[i]: x1, x2 = OW - x2, OW - x1

A box cropped away entirely keeps its place (so that per-box labels beside it
stay aligned) with zero area after the clip: ``visible(boxes)`` is the mask of
boxes with ``x2 > x1`` and ``y2 > y1``, what torchvision's
``SanitizeBoundingBoxes`` keeps. Multi-crop views beyond the first carry no boxes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ..errors import GeometryFieldError
from ..pytree.batch import Padded

__all__ = ["GEOMETRY_KINDS", "ServedGeometry", "check_geometry", "check_geometry_leaves", "map_boxes", "map_field",
           "served_geometry", "visible", "whole_image_boxes"]

GEOMETRY_KINDS = ("xyxy",)


def check_geometry(geometry: Any) -> dict[str, str]:
    """``geometry`` (``{field path: kind}``, or None) validated, as a plain dict."""
    if geometry is None:
        return {}
    if not isinstance(geometry, dict):
        raise GeometryFieldError(f"geometry must be a dict {{field path: kind}}, got {type(geometry).__name__}")
    for path, kind in geometry.items():
        if not isinstance(path, str) or kind not in GEOMETRY_KINDS:
            raise GeometryFieldError(f"geometry {path!r}: {kind!r} is not a geometry kind ({GEOMETRY_KINDS})")
    return dict(geometry)


def check_geometry_leaves(geometry: dict[str, str], fields: list[str], dataset: Any) -> None:
    """Each geometry path is a served field (of ``dataset``, a tbl_format.Dataset) holding ``(k, 4)`` numbers
    per row, never None."""
    for path in geometry:
        if path not in fields:
            raise GeometryFieldError(f"geometry field {path!r} is not among the served fields {fields}: "
                                     f"add it to fields=")
        leaf = dataset.schema.leaves[path]
        shape_ok = (leaf.kind == "var_array" and leaf.ndim == 2) or (leaf.kind == "array" and len(leaf.row_shape) == 2
                                                                      and leaf.row_shape[1] == 4)
        if not shape_ok or leaf.optional or np.dtype(leaf.dtype).kind not in "iuf":
            raise GeometryFieldError(f"geometry field {path!r} must hold (k, 4) numbers in every row "
                                     f"(a 2-D array leaf, not optional); it is {leaf.kind} {leaf.dtype}"
                                     f"{' optional' if leaf.optional else ''}")


class ServedGeometry(NamedTuple):
    """How a batch's first view was made from its stored images: what a source's fill hands its batch."""

    crop_boxes: np.ndarray  # float64 (n, 4) (top, left, height, width) in stored pixels
    flips: np.ndarray  # bool (n,)
    out_hw: tuple[int, int]

    def finish(self, fields: dict[str, Any], geometry: dict[str, str], backend: str) -> tuple[dict[str, Any], Any,
                                                                                             Any]:
        """``(fields with every geometry field mapped, crop_boxes, flips)``, the last two as ``backend`` arrays."""
        if geometry:
            fields = {path: map_field(value, self.crop_boxes, self.flips, self.out_hw) if path in geometry else value
                      for path, value in fields.items()}
        if backend != "torch":
            return fields, self.crop_boxes, self.flips
        import torch  # torch outputs only

        return fields, torch.from_numpy(self.crop_boxes), torch.from_numpy(self.flips)


def served_geometry(boxes: Any, flips: np.ndarray | None, n: int, out_hw: tuple[int, int]) -> ServedGeometry:
    """A batch's geometry from the crop boxes (or windows; one row for all, or one per sample) its kernel call
    used and its flips (a fresh bool array, kept; None: none)."""
    crop = np.empty((n, 4), dtype=np.float64)
    crop[...] = boxes
    flip = np.zeros(n, dtype=np.bool_) if flips is None else flips
    return ServedGeometry(crop, flip, out_hw)


def whole_image_boxes(n: int, height: Any, width: Any) -> np.ndarray:
    """float64 ``(n, 4)`` crop boxes covering whole images (one size, or one per sample)."""
    out = np.zeros((n, 4), dtype=np.float64)
    out[:, 2], out[:, 3] = height, width
    return out


def map_boxes(boxes: np.ndarray, owner: np.ndarray, crop_boxes: np.ndarray, flips: np.ndarray,
              out_hw: tuple[int, int]) -> np.ndarray:
    """xyxy ``boxes`` (m, 4) in stored pixels, box ``j`` of sample ``owner[j]``, as served (the module's rule).

    Args:
        boxes: (m, 4) numbers, ``(x1, y1, x2, y2)`` in the sample's stored pixels.
        owner: int (m,) sample of each box (a row of ``crop_boxes`` / ``flips``).
        crop_boxes: float64 (n, 4) ``(top, left, height, width)`` of every sample.
        flips: bool (n,).
        out_hw: the served ``(OH, OW)``.

    Returns float64 (m, 4).
    """
    oh, ow = float(out_hw[0]), float(out_hw[1])
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    top, left, height, width = (crop_boxes[owner, c] for c in range(4))
    x = np.clip(((b[:, [0, 2]] - left[:, None]) * ow) / width[:, None], 0.0, ow)
    y = np.clip(((b[:, [1, 3]] - top[:, None]) * oh) / height[:, None], 0.0, oh)
    flip = flips[owner]
    x[flip] = ow - x[flip][:, ::-1]
    return np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1)


def visible(boxes: Any) -> Any:
    """Mask of the boxes (``(..., 4)`` xyxy) with a positive area: those not cropped away."""
    return (boxes[..., 2] > boxes[..., 0]) & (boxes[..., 3] > boxes[..., 1])


def _out_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _host(value: Any) -> np.ndarray:
    """A numpy view (or copy, off the host) of an array or tensor."""
    if isinstance(value, np.ndarray):
        return value
    return value.detach().cpu().numpy()  # a torch tensor (torch outputs only)


def _like(array: np.ndarray, reference: Any) -> Any:
    """``array`` as the type (and device) of ``reference``."""
    if isinstance(reference, np.ndarray):
        return array
    import torch  # reference is a tensor

    return torch.from_numpy(array).to(reference.device)


def map_field(value: Any, crop_boxes: np.ndarray, flips: np.ndarray, out_hw: tuple[int, int]) -> Any:
    """A batch value of a geometry field (a list of (k, 4) rows, a (B, k, 4) array, or a Padded pair) mapped
    onto the served images, as the same kind of value (new arrays; padding stays zero)."""
    if isinstance(value, list):
        rows = [_host(v) for v in value]
        counts = [r.shape[0] for r in rows]
        dtype = _out_dtype(rows[0].dtype) if rows else np.dtype(np.float32)
        owner = np.repeat(np.arange(len(rows)), counts)
        flat = np.concatenate([r.reshape(-1, 4) for r in rows]) if rows else np.zeros((0, 4))
        mapped = map_boxes(flat, owner, crop_boxes, flips, out_hw).astype(dtype)
        parts = np.split(mapped, np.cumsum(counts)[:-1]) if rows else []
        return [_like(np.ascontiguousarray(p), v) for p, v in zip(parts, value, strict=True)]
    if isinstance(value, Padded):
        data, lengths = value
        host = _host(data)
        n, k = host.shape[0], host.shape[1]
        owner = np.repeat(np.arange(n), k)
        mapped = map_boxes(host.reshape(-1, 4), owner, crop_boxes, flips, out_hw).astype(_out_dtype(host.dtype))
        mapped = mapped.reshape(n, k, 4)
        mapped[np.arange(k)[None, :] >= _host(lengths)[:, :1]] = 0  # padding rows stay zero
        return Padded(_like(mapped, data), lengths)
    host = _host(value)  # a fixed-shape leaf: (B, k, 4)
    n, k = host.shape[0], host.shape[1]
    mapped = map_boxes(host.reshape(-1, 4), np.repeat(np.arange(n), k), crop_boxes, flips, out_hw)
    return _like(mapped.astype(_out_dtype(host.dtype)).reshape(n, k, 4), value)
