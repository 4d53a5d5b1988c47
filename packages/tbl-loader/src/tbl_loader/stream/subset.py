"""Subsets: serve some rows of a dataset (``rows=``) or a deterministic fraction of them (``subsample=``).

Every loader and map-style dataset takes the same two arguments and resolves
them here into one int64 array of dataset rows, the *subset*:

- ``rows``: a 1-D integer array, list or ``range`` of dataset rows (negative
  values count from the end, as in numpy). Order is kept (it is the order
  ``shuffle=False`` serves); a row listed twice is refused (:class:`SubsetError`),
  since both copies would draw the same augmentation.
- ``subsample``: a fraction ``f`` in ``(0, 1]``: the ``round(f * n)`` rows
  (of the dataset, or of ``rows`` when both are given) with the smallest hash
  ``hash_u64(0, 0, TAG_SUBSAMPLE, row)`` (:mod:`tbl_loader.stream.order`'s
  generator), kept in their original order. The choice depends only on the
  rows and the fraction, never on the loader's seed, so runs with different
  seeds train on the same 1%; and a smaller fraction is always contained in a
  larger one.

A loader over a subset numbers the subset's positions ``0 .. len(subset) - 1``:
the epoch permutation, the rank split, ``consumed`` and resume all work on
positions, exactly as on a whole dataset of that size, and each position is
mapped to its dataset row just before the batch is read. Per-sample randomness
(flips, crops, keys) is drawn from the dataset row, so a sample is augmented
the same way in a subset as in the whole dataset. The subset's fingerprint is
part of the loader's ``state_dict`` settings: a state saved on one subset is
refused on another.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np

from ..errors import SubsetError
from . import order

__all__ = ["TAG_SUBSAMPLE", "resolve_rows", "subset_fingerprint"]

TAG_SUBSAMPLE = 64
"""Stream tag of the subsample hash (tags below 64 are :mod:`tbl_loader.stream.order`'s)."""


def _rows_array(rows: Any, num_rows: int) -> np.ndarray:
    if isinstance(rows, range):
        idx = np.arange(rows.start, rows.stop, rows.step, dtype=np.int64)
    else:
        idx = np.asarray(rows)
        if idx.ndim != 1:
            raise SubsetError(f"rows must be one-dimensional, got shape {idx.shape}")
        if idx.shape[0] and (idx.dtype.kind not in "iu" or idx.dtype == np.bool_):
            raise SubsetError(f"rows must be integers, got dtype {idx.dtype}")
        idx = idx.astype(np.int64, copy=True)
    if idx.shape[0] == 0:
        raise SubsetError("rows selects no row")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < -num_rows or hi >= num_rows:
        bad = lo if lo < -num_rows else hi
        raise SubsetError(f"rows holds row {bad}, out of range for a dataset of {num_rows} rows")
    idx[idx < 0] += num_rows
    if np.unique(idx).shape[0] != idx.shape[0]:
        values, counts = np.unique(idx, return_counts=True)
        raise SubsetError(f"rows lists row {int(values[np.argmax(counts > 1)])} more than once")
    return idx


def resolve_rows(num_rows: int, rows: Any = None, subsample: float | None = None) -> np.ndarray | None:
    """The subset as contiguous int64 dataset rows, or None when neither argument selects anything."""
    if rows is None and subsample is None:
        return None
    selected = np.arange(num_rows, dtype=np.int64) if rows is None else _rows_array(rows, num_rows)
    if subsample is not None:
        if isinstance(subsample, bool) or not isinstance(subsample, (int, float, np.floating, np.integer)):
            raise SubsetError(f"subsample must be a fraction in (0, 1], got {subsample!r}")
        fraction = float(subsample)
        if not (math.isfinite(fraction) and 0.0 < fraction <= 1.0):
            raise SubsetError(f"subsample must be a fraction in (0, 1], got {subsample!r}")
        keep = int(round(fraction * selected.shape[0]))
        if keep == 0:
            raise SubsetError(f"subsample={fraction} of {selected.shape[0]} rows selects no row")
        draws = order.hash_u64(0, 0, TAG_SUBSAMPLE, selected)
        chosen = np.sort(np.argsort(draws, kind="stable")[:keep])  # smallest hashes, original order
        selected = selected[chosen]
    if selected.shape[0] == 0:
        raise SubsetError("the subset holds no row")
    return np.ascontiguousarray(selected)


def subset_fingerprint(rows: np.ndarray) -> str:
    """32 hex digits naming a subset (its rows in order); part of the stream settings of ``state_dict``."""
    data = np.ascontiguousarray(rows, dtype="<i8").tobytes()
    return hashlib.sha256(data).hexdigest()[:32]
