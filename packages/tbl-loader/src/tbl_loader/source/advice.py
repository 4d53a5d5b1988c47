"""Page-cache release and read-ahead for out-of-core reading of a local dataset with ``shuffle="block"``.

With the block order a pass reads a few shards at a time and knows when it is
done with each: once no later batch of the pass reads a shard, its image
column leaves this process's mapping (``madvise(MADV_DONTNEED)``) and then the
page cache (``posix_fadvise(POSIX_FADV_DONTNEED)``: clean pages no process maps
are dropped at once). Under a memory limit smaller than the dataset the kernel
then never has to find room by reclaim, which evicts pages the pass is about to
read as readily as finished ones and makes it read them twice.

It also knows which shards come next: it asks the kernel to read them whole
into the page cache (``POSIX_FADV_WILLNEED``) ahead of the batches that first
read them (:class:`PageAdvisor`'s ``read_ahead``). A batch that crops reads
parts of rows scattered over its window's shards, which the kernel's readahead
of faulting pages serves at a fraction of the disk's rate; whole shards asked
for ahead come at about the disk's own rate.
What is read ahead stays within half the memory available less the shards
being read: past that, the reads ahead would evict the very pages being read.

Measured with ``python -m tbl_bench.out_of_core --serve train`` (RandomResizedCrop
+ flip to float16, a dataset 4x a cgroup memory limit, 2 cores): read-ahead
served 1.3-1.7x the release alone, round by round, and 0.87x the disk's own
sequential rate. With the stored pixels copied as they are (``--serve copy``)
the release alone already reaches about the disk's sequential rate. The former
``MADV_WILLNEED`` hints on the mapping, given for upcoming rows without a
budget, reached about half of it.

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
_FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
_BUDGET_EVERY = 8  # batches between two measures of the memory available for reading ahead


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
    """Page-cache release and read-ahead for one pass: ``segments`` (one column view per shard, in row order,
    each a view of a map of the whole file ``files[k]``; without ``files`` only the mapping is released and
    nothing is read ahead), the pass's ``indices`` (this rank's sample ids, in order) and its ``batch_size``.
    ``read_ahead``: whether the shards the pass reads next are read into the page cache ahead of it, within
    half of :func:`memory_available` less the shards being read (measured again every few batches: the
    process's own memory grows after the pass starts, and a read-ahead that overflows the limit evicts the
    very pages being read, which are then read again).
    Call :meth:`batch` with each batch number before the batch is read, and :meth:`close` after the pass."""

    def __init__(self, segments: list[np.ndarray], indices: np.ndarray, batch_size: int,
                 files: list[Any] | None = None, read_ahead: bool = False) -> None:
        self.maps = [_mapping_of(seg) for seg in segments]
        self.sizes = [seg.nbytes for seg in segments]
        self.files = list(files) if files is not None and len(files) == len(segments) else None
        starts = np.concatenate([[0], np.cumsum([seg.shape[0] for seg in segments])]).astype(np.int64)
        shard = np.searchsorted(starts, np.asarray(indices, dtype=np.int64), side="right") - 1
        batch = np.arange(shard.shape[0], dtype=np.int64) // int(batch_size)
        self.last = np.full(len(segments), -1, dtype=np.int64)  # the last batch of the pass reading each shard
        np.maximum.at(self.last, shard, batch)
        first = np.full(len(segments), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, shard, batch)
        read = np.flatnonzero(self.last >= 0)
        # The shards the pass reads in the order it is done with them, and how many of them are released:
        # a batch looks at the next few only, not at every shard of the dataset.
        self._by_last = [(int(k), int(self.last[k])) for k in read[np.argsort(self.last[read], kind="stable")]]
        self._released = 0
        # The shards in the order the pass first reads them, with that batch number.
        self._sequence = [(int(k), int(first[k])) for k in read[np.argsort(first[read], kind="stable")]]
        self._position = {k: i for i, (k, _) in enumerate(self._sequence)}
        self._next = 0  # the next position of _sequence to read ahead
        self._held = 0  # bytes of the shards before _next not released yet: being read, or read ahead
        self._read_ahead = bool(read_ahead) and self.files is not None and _FADV_WILLNEED is not None
        # (batch number it was measured at, bytes). Nothing is read ahead before the first measure, a few
        # batches in: the loader's own buffers take their memory as the first batches are written.
        self._budget = (0, 0)
        self._reader: _ShardReader | None = None

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
        """Batch ``number`` of the pass is about to be read: release the shards no batch from here on reads,
        and (with ``read_ahead``) read ahead the next shards the pass reads, within the budget."""
        while self._released < len(self._by_last) and self._by_last[self._released][1] < number:
            k = self._by_last[self._released][0]
            self._released += 1
            self._release(k)
            if self._position[k] < self._next:
                self._held -= self.sizes[k]
        if self._read_ahead:
            self._schedule_reads(number)

    def _schedule_reads(self, number: int) -> None:
        sequence = self._sequence
        # A shard the pass reads already is left to the gather's own faults: reading it whole beside them
        # can only add pages to a limit that may hold no more than the parts of rows the gather reads.
        while self._next < len(sequence) and sequence[self._next][1] <= number:
            k = sequence[self._next][0]
            if self.last[k] >= number:  # not released already (a shard read by one batch only may be)
                self._held += self.sizes[k]
            self._next += 1
        if self._next >= len(sequence):
            return
        if number - self._budget[0] >= _BUDGET_EVERY:
            self._budget = (number, (memory_available() or 0) // 2)
        # Half the memory available holds the shards being read now and those read ahead; the other half
        # is slack for the process's own growth and the kernel's readahead around faults.
        while self._next < len(sequence):
            k, _ = sequence[self._next]
            if self._held + self.sizes[k] > self._budget[1]:
                break
            found = self.maps[k]
            if found is not None and self.sizes[k]:
                if self._reader is None:
                    self._reader = _ShardReader()
                self._reader.read(self.files[k], found[1], self.sizes[k])
            self._held += self.sizes[k]
            self._next += 1

    def close(self) -> None:
        """Stop reading ahead (reads under way finish; none queued start)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None


class _ShardReader:
    """Asks the kernel to read byte ranges of files into the page cache (``POSIX_FADV_WILLNEED``), from two
    threads so that the loader's thread never waits for the request to be queued. A batch that crops reads
    parts of rows scattered over its window's shards, and the kernel's readahead of faulting pages serves
    those at a fraction of the disk's rate; whole shards asked for ahead come at the disk's own rate.
    (Reading them into a buffer with ``preadv`` served the same, with a copy of every byte.)"""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(2, thread_name_prefix="tbl-read-ahead")

    def read(self, path: Any, offset: int, length: int) -> None:
        self._pool.submit(self._read, path, offset, length)

    @staticmethod
    def _read(path: Any, offset: int, length: int) -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return  # read-ahead is optional: the gather reads the pages itself
        try:
            os.posix_fadvise(fd, offset, length, _FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
