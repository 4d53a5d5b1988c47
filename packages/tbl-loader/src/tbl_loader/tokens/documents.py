"""The document index of a token dataset (SPEC.md section 9) and the boundary fields computed from it.

Everything here is vectorized: the index is read with one array operation per shard, and a batch's
fields with a few array operations over its ``B x (T + 1)`` slots, never a Python loop per token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["BOUNDARY_FIELDS", "boundary_fields", "document_starts", "slot_documents"]

STARTS = "starts"
BOUNDARY_FIELDS = ("position_ids", "document_ids", "cu_seqlens", "loss_mask")


def document_starts(dataset: Any, shards: list[int], chunk: int) -> np.ndarray:
    """The stream offset of every document's first token (int64, increasing, first 0).

    Args:
        dataset: the open token dataset.
        shards: its shards holding rows, in stream order.
        chunk: tokens per row.

    A dataset written before the index existed has no ``starts`` leaf: each shard is one document.
    """
    starts, row0 = [], 0
    for k in shards:
        rows = dataset.segment_rows[k]
        if STARTS in dataset.leaf_paths:
            per_row = dataset.shard(k).values(STARTS, list(range(rows)))
            counts = np.fromiter((len(v) for v in per_row), np.int64, rows)
            rel = np.fromiter((s for v in per_row for s in v), np.int64, int(counts.sum()))
            starts.append(np.repeat((row0 + np.arange(rows, dtype=np.int64)) * chunk, counts) + rel)
        else:
            starts.append(np.array([row0 * chunk], np.int64))
        row0 += rows
    return np.concatenate(starts) if starts else np.zeros(1, np.int64)


def slot_documents(starts: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The document number of each stream position (int64, same shape); -1 stays -1 (padding)."""
    doc = np.searchsorted(starts, positions, side="right") - 1
    doc[positions < 0] = -1
    return doc


def boundary_fields(doc: np.ndarray, target_mask: np.ndarray | None, out: dict[str, np.ndarray]) -> None:
    """Write the boundary fields of ``n`` rows into ``out[name][:n]``.

    Args:
        doc: ``(n, T + 1)`` int64, the document of each slot (-1: padding, only after a row's documents).
        target_mask: ``(n, T + 1)`` stored loss mask of each slot (nonzero: a target), or None.
        out: buffers ``position_ids`` / ``document_ids`` / ``loss_mask`` ``(>= n, T)``, ``cu_seqlens``
            ``(>= n, T + 1)``.

    A segment starts at slot 0 and wherever the document changes; padding is its own segment.
    """
    n, width = doc.shape
    t = width - 1
    start = np.empty((n, width), bool)
    start[:, 0] = True
    np.not_equal(doc[:, 1:], doc[:, :-1], out=start[:, 1:])
    # The batch's inputs read as one flat sequence (every row starts a segment): a slot's position is its
    # distance to the start of its segment, each start repeated over its segment (no running scan: a
    # cumulative sum or maximum costs ten times more here).
    inputs = start[:, :t].reshape(-1)
    first = np.flatnonzero(inputs)  # flat slot of every segment start, in order
    positions = np.arange(n * t, dtype=np.int64)
    positions -= np.repeat(first, np.diff(first, append=n * t))
    out["position_ids"][:n] = positions.reshape(n, t)
    out["document_ids"][:n] = doc[:, :t]
    cu = out["cu_seqlens"][:n]
    cu[:] = t
    rows, cols = np.divmod(first, t)
    counts = np.bincount(rows, minlength=n)
    rank = np.arange(first.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts)
    cu[rows, rank] = cols
    loss = out["loss_mask"][:n]
    np.logical_not(start[:, 1:], out=loss)
    loss &= doc[:, 1:] >= 0
    if target_mask is not None:
        loss &= target_mask[:, 1:] != 0
