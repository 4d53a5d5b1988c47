"""Page-cache release for out-of-core reading of a local dataset with ``shuffle="block"``.

With the block order a pass reads a few shards at a time and knows when it is
done with each: once no later batch of the pass reads a shard, its image
column leaves this process's mapping (``madvise(MADV_DONTNEED)``) and then the
page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``: clean pages no process maps
are dropped at once). Under a memory limit smaller than the dataset the kernel
then never has to find room by reclaim, which evicts pages the pass is about to
read as readily as finished ones and makes it read them twice.

Measured with ``python -m tbl_bench.out_of_core`` (a dataset 3.7x a cgroup
memory limit, 2 loaded cores; the tbl-bench README has the figures): the
release alone serves at about the disk's own sequential rate (the same files
read whole with large ``preadv`` calls in the same limit), where the former
``MADV_WILLNEED`` hints ahead plus ``MADV_DONTNEED`` reached about half of it,
and a read-ahead thread reading the next shards into the page cache ahead of
the gather (2, 4, 8 or 16 shards ahead) added nothing over the kernel's own
readahead of the mapped files, so neither is done.

Only a dataset that does not fit is released: dropping pages of one that fits
would make every epoch read it from disk again. At the start of each pass the
loader compares the bytes of the image column with the memory available to it
(:func:`memory_available`: the smaller of the machine's ``MemAvailable`` and,
inside a memory cgroup, its limit less the cgroup's own anonymous memory).

Advice never changes what is read: a page dropped from the cache is read back
from the file if touched again (by this process, or by another one reading the
same files, which then pays the disk read). Where ``mmap.madvise`` or
``os.posix_fadvise`` is missing, that step is skipped.
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import numpy as np

__all__ = ["PageAdvisor", "fits_in_memory", "memory_available"]

_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _stat(path: str) -> dict[str, int]:
    out = {}
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                out[key] = int(value)
    return out


def _cgroup_available() -> int | None:
    """The memory cgroup's limit less its anonymous memory (v1 or v2), or None outside a limited cgroup."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        try:
            if "memory" in controllers.split(","):  # v1: hierarchical_memory_limit covers the parents' limits
                stat = _stat(f"/sys/fs/cgroup/memory{path}/memory.stat")
                limit, anon = stat.get("hierarchical_memory_limit"), stat.get("total_rss", 0)
                return None if limit is None or limit >= 1 << 60 else max(0, limit - anon)
            if controllers == "":  # v2: the smallest memory.max on the way up
                anon = _stat(f"/sys/fs/cgroup{path}/memory.stat").get("anon", 0)
                limits = []
                node = path.rstrip("/")
                while node:
                    with open(f"/sys/fs/cgroup{node}/memory.max") as f:
                        text = f.read().strip()
                    if text.isdigit():
                        limits.append(int(text))
                    node = node.rpartition("/")[0]
                if limits:
                    return max(0, min(limits) - anon)
        except (OSError, ValueError):
            continue
    return None


def memory_available() -> int | None:
    """Bytes of memory this process may fill with page cache: the smaller of ``MemAvailable`` and its memory
    cgroup's limit less the cgroup's anonymous memory; None where neither can be read."""
    found = [v for v in (_meminfo_available(), _cgroup_available()) if v is not None]
    return min(found) if found else None


def fits_in_memory(nbytes: int) -> bool:
    """Whether ``nbytes`` of file pages fit the memory available (True where it cannot be told: no advice)."""
    available = memory_available()
    return available is None or nbytes <= available


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
    """Page-cache release for one pass: ``segments`` (one column view per shard, in row order, each a view of
    a map of the whole file ``files[k]``; without ``files`` only the mapping is released), the pass's
    ``indices`` (this rank's sample ids, in order) and its ``batch_size``. Call :meth:`batch` with each batch
    number before the batch is read."""

    def __init__(self, segments: list[np.ndarray], indices: np.ndarray, batch_size: int,
                 files: list[Any] | None = None) -> None:
        self.maps = [_mapping_of(seg) for seg in segments]
        self.sizes = [seg.nbytes for seg in segments]
        self.files = list(files) if files is not None and len(files) == len(segments) else None
        starts = np.concatenate([[0], np.cumsum([seg.shape[0] for seg in segments])]).astype(np.int64)
        shard = np.searchsorted(starts, np.asarray(indices, dtype=np.int64), side="right") - 1
        batch = np.arange(shard.shape[0], dtype=np.int64) // int(batch_size)
        self.last = np.full(len(segments), -1, dtype=np.int64)  # the last batch of the pass reading each shard
        np.maximum.at(self.last, shard, batch)
        self.released: set[int] = set()

    def _release(self, k: int) -> None:
        found = self.maps[k]
        if found is None or self.sizes[k] == 0:
            return
        mm, offset = found
        start = offset - offset % mmap.PAGESIZE
        length = offset + self.sizes[k] - start
        if _DONTNEED is not None and hasattr(mm, "madvise"):
            try:
                mm.madvise(_DONTNEED, start, length)  # off this process's page tables (the pages stay cached)
            except (OSError, ValueError):
                pass
        if _FADV_DONTNEED is not None and self.files is not None:
            try:
                fd = os.open(self.files[k], os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, start, length, _FADV_DONTNEED)  # out of the page cache
                finally:
                    os.close(fd)
            except OSError:
                pass  # advice is optional: a refused call changes nothing that is read

    def batch(self, number: int) -> None:
        """Batch ``number`` of the pass is about to be read: release the shards no batch from here on reads."""
        for k in np.flatnonzero((self.last >= 0) & (self.last < number)).tolist():
            if k not in self.released:
                self.released.add(k)
                self._release(k)
