"""Copy a dataset's mapped columns into one device tensor, in bounded chunks through a staging pair.

The column segments (one per shard, memory-mapped) are cut into chunks of at
most ``chunk_bytes`` whole rows. Two host staging buffers alternate: while the
non-blocking host-to-device copy of chunk ``k`` reads one buffer, the host
copies chunk ``k + 1`` out of the map into the other. On CUDA the buffers are
pinned (page-locked, so the copy is a real asynchronous DMA), the copies run on
a dedicated stream, and an event recorded after each copy guards the buffer's
reuse two chunks later. On MPS and CPU the same loop runs with pageable
buffers and blocking copies. Host memory used: two chunks, whatever the
dataset's size.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["DEFAULT_CHUNK_BYTES", "PROGRESS_MIN_BYTES", "UploadStats", "upload_rows"]

DEFAULT_CHUNK_BYTES = 64 << 20
"""Staging buffer size: large enough to reach full copy bandwidth, small enough to pin quickly."""

PROGRESS_MIN_BYTES = 1 << 30
"""With ``progress=None`` a progress bar is shown for uploads of at least this many bytes."""


@dataclass(frozen=True)
class UploadStats:
    """What one upload moved and how long it took.

    ``seconds``: wall clock from the first chunk to the data being on the device.
    ``host_seconds``: the part of it spent copying out of the map into staging
    (page faults included); when it is close to ``seconds`` the host side, not
    the host-to-device link, bounds the upload.
    """

    bytes: int
    seconds: float
    host_seconds: float
    chunks: int
    chunk_bytes: int
    pinned: bool

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


def _chunks(segments: Sequence[np.ndarray], rows_per_chunk: int) -> Iterator[tuple[np.ndarray, int]]:
    """(rows of a segment, destination row) pairs covering every segment in order."""
    dst = 0
    for seg in segments:
        for lo in range(0, seg.shape[0], rows_per_chunk):
            part = seg[lo : lo + rows_per_chunk]
            yield part, dst
            dst += part.shape[0]


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over a (possibly read-only) mapped array, without copying.

    torch warns about read-only arrays because writing through the tensor would
    be undefined; this tensor is only ever read.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def upload_rows(
    segments: Sequence[np.ndarray],
    dst: torch.Tensor,
    *,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    progress: bool | None = None,
    description: str = "upload",
) -> UploadStats:
    """Copy the concatenation of ``segments`` (row-major numpy arrays) into ``dst`` (first axis = rows).

    ``dst`` must have exactly the segments' total row count and row shape. Returns
    the bytes moved and the elapsed time; returns only when the data is on the device.
    """
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    if not segments:
        raise ValueError("nothing to upload: no segments")
    row_shape = tuple(segments[0].shape[1:])
    total_rows = 0
    for k, seg in enumerate(segments):
        if tuple(seg.shape[1:]) != row_shape:
            raise ValueError(f"segment {k} has rows of shape {tuple(seg.shape[1:])}, segment 0 {row_shape}")
        if not seg.flags.c_contiguous:
            raise ValueError(f"segment {k} is not C-contiguous")
        total_rows += seg.shape[0]
    if tuple(dst.shape) != (total_rows, *row_shape):
        raise ValueError(f"destination has shape {tuple(dst.shape)}, the segments {(total_rows, *row_shape)}")
    dtype = _as_tensor(segments[0][:0]).dtype
    if dst.dtype != dtype:
        raise ValueError(f"destination dtype {dst.dtype} differs from the segments' {dtype}")

    row_bytes = max(1, int(np.prod(row_shape, dtype=np.int64)) * segments[0].dtype.itemsize)
    rows_per_chunk = max(1, chunk_bytes // row_bytes)
    total_bytes = total_rows * row_bytes
    cuda = dst.device.type == "cuda"
    staging = [
        torch.empty((min(rows_per_chunk, total_rows), *row_shape), dtype=dtype, pin_memory=cuda) for _ in range(2)
    ]
    events: list[Any] = [None, None]
    copy_stream = torch.cuda.Stream(dst.device) if cuda else None
    if progress is None:
        progress = total_bytes >= PROGRESS_MIN_BYTES
    bar = None
    if progress:
        try:
            from tqdm import tqdm  # optional (the `progress` extra): without it the upload runs with no bar
        except ImportError:
            pass
        else:
            bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, desc=description)

    start = time.perf_counter()
    chunks = 0
    host_seconds = 0.0
    try:
        for k, (part, row) in enumerate(_chunks(segments, rows_per_chunk)):
            n = part.shape[0]
            buf = staging[k % 2]
            if events[k % 2] is not None:
                events[k % 2].synchronize()  # the DMA that last read this buffer has finished
            t0 = time.perf_counter()
            buf[:n].copy_(_as_tensor(part))  # reads the map; torch spreads large copies over its threads
            host_seconds += time.perf_counter() - t0
            if cuda:
                with torch.cuda.stream(copy_stream):
                    dst[row : row + n].copy_(buf[:n], non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(copy_stream)
                events[k % 2] = event
            else:
                dst[row : row + n].copy_(buf[:n])  # blocking: the buffer is free again when it returns
            chunks += 1
            if bar is not None:
                bar.update(n * row_bytes)
        if cuda:
            copy_stream.synchronize()
        elif dst.device.type == "mps":
            torch.mps.synchronize()
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    return UploadStats(total_bytes, seconds, host_seconds, chunks, rows_per_chunk * row_bytes, cuda)
