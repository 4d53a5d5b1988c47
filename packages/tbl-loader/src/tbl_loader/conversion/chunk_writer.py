"""A conversion worker's rows written at their place in the output file, one chunk of slots at a time.

Why around the page cache
-------------------------
A conversion writes every pixel once and never reads it back. Through the
page cache each row costs a copy into fresh cache pages, their dirty
accounting and their writeback: 0.3-0.45 s of CPU per 768 MiB on the 2-core
VM of docs/benchmarks.md, and up to twice that where the pages are fresh to
a VM whose host takes free guest memory back (that VM's balloon reports free
pages). With ``O_DIRECT`` the disk takes the rows from this worker's own
buffer, the same memory chunk after chunk: 0.1-0.17 s for the same bytes.

How
---
The rows of a chunk (consecutive slots) are made in (`ChunkWriter.fill`) or
copied into (`ChunkWriter.put`) a page-aligned buffer laid out as the file
is, so that file offsets and buffer addresses share their alignment. Whole ``ALIGN``-byte blocks go out with ``O_DIRECT`` from a helper
thread in pieces of at least ``PIECE`` bytes while the next rows decode. The
partial blocks at the chunk's two ends go through the page cache, because the
neighbouring chunk may be written by another worker: a block is never written
both ways, so the two paths never overwrite each other's bytes. `ChunkWriter.finish`
returns only once every byte of the chunk is written, so the converting process
may read the rows (to move one down over a skipped image) or publish the file.

The file is the same byte for byte either way. The page cache takes every
row, written as it comes with no buffer, where ``O_DIRECT`` is not available
(not Linux), where the file system refuses it at open (``EINVAL`` or
``EOPNOTSUPP``) or where a chunk's buffer would exceed ``DIRECT_BUFFER_MAX``
(huge images); a refusal at a write sends that piece and all later ones
through the page cache. Any other write error (a full disk) is raised by
`ChunkWriter.finish` (by `ChunkWriter.put` on the page cache only path).
"""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

__all__ = ["ALIGN", "DIRECT_BUFFER_MAX", "PIECE", "ChunkWriter"]

ALIGN = 4096
"""File offsets, lengths and buffer addresses of direct writes are multiples of this (a page; a multiple of
every common logical block size)."""

PIECE = 256 << 10
"""Direct writes go out once this many bytes of whole blocks are ready: small enough that the last one, which
`ChunkWriter.finish` waits for, is short; large enough that a write costs the disk little per byte."""

DIRECT_BUFFER_MAX = 64 << 20
"""Larger chunks (huge images) go through the page cache rather than holding a buffer this large per worker."""


T = TypeVar("T")

_NOT_SUPPORTED = (errno.EINVAL, errno.EOPNOTSUPP)  # how a file system says no to O_DIRECT (open or write)


def _align_down(x: int) -> int:
    return x - x % ALIGN


def _align_up(x: int) -> int:
    return _align_down(x + ALIGN - 1)


def _write_all(fd: int, view: memoryview, at: int) -> None:
    done = 0
    while done < view.nbytes:
        with view[done:] as rest:  # released at once: a live slice would keep the buffer from closing
            done += os.pwrite(fd, rest, at + done)


class ChunkWriter:
    """Writes the rows of one chunk of slots at a time into ``path``: slot ``i`` at ``base + i * row_bytes``.

    ``begin(first_slot, count)``, then ``put(k, row)`` or ``fill(k, produce)`` for rows ``k = 0 .. count - 1``
    in order (``put(k, None)`` for an image left out: its slot stays zero, never committed), then
    ``finish()``. ``direct=False`` keeps every write in the page cache. The slots must hold zeros before (a fresh file, as `tbl_format.PlacedWriter` makes).
    """

    def __init__(self, path: str, base: int, row_bytes: int, max_rows: int, direct: bool = True) -> None:
        self.base = base
        self.row_bytes = row_bytes
        self.max_rows = max_rows
        self.fd = self.direct_fd = -1
        self._buffer: mmap.mmap | None = None  # only for direct I/O: the page cache takes rows one by one
        self._view = memoryview(b"")
        self._scratch: bytearray | None = None  # `fill`'s row on the page-cache-only path
        self._thread: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []
        self._start = self._end = self._origin = self._sent = 0
        self._rows = 0
        size = max_rows * row_bytes + 2 * ALIGN  # room for the leading partial block's offset and the tail
        o_direct = getattr(os, "O_DIRECT", 0)
        try:
            self.fd = os.open(path, os.O_WRONLY)
            if direct and o_direct and size <= DIRECT_BUFFER_MAX:
                try:
                    self.direct_fd = os.open(path, os.O_WRONLY | o_direct)
                except OSError as e:
                    if e.errno not in _NOT_SUPPORTED:
                        raise
                    # this file system does not do direct I/O: the page cache takes every row
            if self.direct_fd >= 0:
                self._buffer = mmap.mmap(-1, size)  # anonymous, hence page-aligned
                self._view = memoryview(self._buffer)
                self._thread = ThreadPoolExecutor(1, thread_name_prefix="tbl-convert-write")
        except BaseException:
            self._release()
            raise

    @property
    def direct(self) -> bool:
        """Whether whole blocks go around the page cache (False from the first refusal by the file system)."""
        return self.direct_fd >= 0

    def begin(self, first_slot: int, count: int) -> None:
        if not 0 <= count <= self.max_rows:
            raise ValueError(f"a chunk of {count} rows; this writer holds at most {self.max_rows}")
        self._wait()  # a chunk left unfinished (an exception while decoding it) has nothing left in flight
        start = self.base + first_slot * self.row_bytes
        self._start, self._end = start, start + count * self.row_bytes
        self._origin = _align_down(start)  # file offset of buffer byte 0
        self._sent = _align_up(start)  # direct writes have covered the file up to here
        self._rows = 0

    def put(self, k: int, row: bytes | bytearray | memoryview | None) -> None:
        """Row ``k`` of the chunk (rows arrive in order); None for an image left out."""
        self._check_next(k)
        rb = self.row_bytes
        at = self._start + k * rb
        with memoryview(row if row is not None else b"") as src:
            if row is not None and src.nbytes != rb:
                raise ValueError(f"a row of {src.nbytes} bytes where rows have {rb}")
            if self._buffer is None:  # page cache only: the row goes now; a left-out slot stays zero
                if row is not None:
                    _write_all(self.fd, src.cast("B"), at)
            elif row is None:
                self._view[at - self._origin : at - self._origin + rb] = bytes(rb)  # the buffer is reused
            else:
                self._view[at - self._origin : at - self._origin + rb] = src.cast("B")
        self._advance(at)

    def fill(self, k: int, produce: Callable[[memoryview], T | None]) -> T | None:
        """Row ``k`` made in place: ``produce(view)`` writes the row's bytes into ``view`` (writable,
        ``row_bytes`` long, in this writer's buffer, so the row is never copied) and may read them back
        (to checksum them); its result is returned. It returns None for an image left out (it may have
        written part of the row): the slot is left zero, as ``put(k, None)`` leaves it. ``produce`` must
        keep no export of ``view`` (a numpy array over it) past its return. A failed write raises, as in
        `put`; so does an exception from ``produce`` (nothing is counted then)."""
        self._check_next(k)
        rb = self.row_bytes
        at = self._start + k * rb
        if self._buffer is None:  # page cache only: made in a scratch row, then written
            if self._scratch is None:
                self._scratch = bytearray(rb)
            view = memoryview(self._scratch)
        else:
            view = self._view[at - self._origin : at - self._origin + rb]
        # Released only on return: after an exception, an array over the row may live on in its traceback,
        # and the view goes when that does (release() would raise BufferError meanwhile).
        result = produce(view)
        if result is not None and self._buffer is None:
            _write_all(self.fd, view, at)
        view.release()
        if result is None:
            self.put(k, None)  # whatever produce wrote into the row is not kept
        else:
            self._advance(at)
        return result

    def _check_next(self, k: int) -> None:
        if k != self._rows:
            raise ValueError(f"row {k} of the chunk given after {self._rows} rows: rows are put in order")

    def _advance(self, at: int) -> None:
        self._rows += 1
        ready = _align_down(at + self.row_bytes)
        if self._buffer is not None and ready - self._sent >= PIECE:
            self._send(self._sent, ready)

    def finish(self) -> None:
        """Write what is left of the chunk and wait until all of it is written; raises a failed write."""
        if self._rows * self.row_bytes != self._end - self._start:
            raise ValueError(f"finish() after {self._rows} of {(self._end - self._start) // self.row_bytes} rows")
        try:
            if self._buffer is None:
                return
            head_end = _align_up(self._start)
            interior_end = max(self._sent, _align_down(self._end))
            if interior_end > self._sent:
                self._send(self._sent, interior_end)
            if interior_end <= head_end:  # no whole block in this chunk: the page cache takes all of it
                self._write_cached(self._start, self._end)
            else:  # the partial blocks at both ends, which a neighbouring chunk's writer shares
                self._write_cached(self._start, head_end)
                self._write_cached(interior_end, self._end)
        finally:
            self._wait()

    def _send(self, lo: int, hi: int) -> None:
        assert self._thread is not None
        self._pending.append(self._thread.submit(self._write_blocks, lo, hi))
        self._sent = hi

    def _write_blocks(self, lo: int, hi: int) -> None:
        """Whole blocks [lo, hi) of the chunk, on the helper thread: direct, or cached once refused."""
        with self._view[lo - self._origin : hi - self._origin] as view:
            if self.direct_fd >= 0:
                try:
                    _write_all(self.direct_fd, view, lo)
                    return
                except OSError as e:
                    if e.errno not in _NOT_SUPPORTED:
                        raise
                    # Refused (an alignment this file system does not take): the page cache writes the same
                    # bytes, now and from here on. Pieces run one at a time on the one helper thread.
                    os.close(self.direct_fd)
                    self.direct_fd = -1
            _write_all(self.fd, view, lo)

    def _write_cached(self, lo: int, hi: int) -> None:
        if hi > lo:
            with self._view[lo - self._origin : hi - self._origin] as view:
                _write_all(self.fd, view, lo)

    def _wait(self) -> None:
        pending, self._pending = self._pending, []
        error: BaseException | None = None
        for future in pending:  # every piece is waited for, even after one failed, before the buffer is reused
            try:
                future.result()
            except BaseException as e:  # re-raised below, once all pieces are done
                error = error or e
        if error is not None:
            raise error

    def close(self) -> None:
        try:
            self._wait()
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=True)
                self._thread = None
            self._release()

    def _release(self) -> None:
        self._view.release()
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
        for fd in (self.fd, self.direct_fd):
            if fd >= 0:
                os.close(fd)
        self.fd = self.direct_fd = -1
