"""Page-cache advice for out-of-core reading of a local dataset with ``shuffle="block"``.

With the block order a pass reads a few shards at a time and knows which come
next, so the loader tells the kernel ahead (``mmap.madvise``):
``MADV_WILLNEED`` over the image column of the shards the next batches will
read (readahead starts while the current batches are served), and
``MADV_DONTNEED`` over the column of each shard the pass will not read again
(its pages leave this process's mapping, so the page cache can reclaim them
first). With a dataset several times the RAM this keeps the working set to
the window of shards in use instead of whatever the kernel guesses.

Advice never changes what is read: a page dropped by ``DONTNEED`` of a shared
file mapping is read back from the file if touched again. On platforms without
``mmap.madvise`` (or ``MADV_WILLNEED``) the advisor does nothing.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

__all__ = ["PageAdvisor"]

_WILLNEED = getattr(mmap, "MADV_WILLNEED", None)
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


def _mapping_of(array: np.ndarray) -> tuple[mmap.mmap, int] | None:
    """The ``mmap.mmap`` an array views and the array's byte offset in it, or None (not a map)."""
    base: Any = array
    while base is not None and not isinstance(base, mmap.mmap):
        base = base.obj if isinstance(base, memoryview) else getattr(base, "base", None)
    if base is None:
        return None
    start = np.frombuffer(base, dtype=np.uint8).ctypes.data
    return base, array.ctypes.data - start


class PageAdvisor:
    """Advice for one pass: ``segments`` (one column view per shard, in row order), the pass's
    ``indices`` (this rank's sample ids, in order) and its ``batch_size``. Call :meth:`batch` with each
    batch number before the batch is read."""

    def __init__(self, segments: list[np.ndarray], indices: np.ndarray, batch_size: int, lookahead: int = 2) -> None:
        self.enabled = _WILLNEED is not None and _DONTNEED is not None and hasattr(mmap.mmap, "madvise")
        self.maps = [_mapping_of(seg) for seg in segments]
        self.sizes = [seg.nbytes for seg in segments]
        starts = np.concatenate([[0], np.cumsum([seg.shape[0] for seg in segments])]).astype(np.int64)
        shard = np.searchsorted(starts, np.asarray(indices, dtype=np.int64), side="right") - 1
        batch = np.arange(shard.shape[0], dtype=np.int64) // int(batch_size)
        n = len(segments)
        self.first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
        self.last = np.full(n, -1, dtype=np.int64)
        np.minimum.at(self.first, shard, batch)
        np.maximum.at(self.last, shard, batch)
        self.lookahead = int(lookahead)
        self.advised_need: set[int] = set()
        self.advised_done: set[int] = set()

    def _advise(self, k: int, option: int) -> None:
        found = self.maps[k]
        if found is None or self.sizes[k] == 0:
            return
        mm, offset = found
        page = mmap.PAGESIZE
        start = offset - offset % page
        try:
            mm.madvise(option, start, offset + self.sizes[k] - start)
        except (OSError, ValueError):
            pass  # advice is optional: a refused call changes nothing that is read

    def batch(self, number: int) -> None:
        """Batch ``number`` of the pass is about to be read: advise the shards it and the next ones need,
        and release the shards no later batch reads."""
        if not self.enabled:
            return
        horizon = number + self.lookahead
        for k in np.flatnonzero((self.first <= horizon) & (self.last >= number)).tolist():
            if k not in self.advised_need:
                self.advised_need.add(k)
                self._advise(k, _WILLNEED)
        for k in np.flatnonzero((self.last >= 0) & (self.last < number)).tolist():
            if k not in self.advised_done:
                self.advised_done.add(k)
                self._advise(k, _DONTNEED)
