"""Per-stage counters of one loader: always on, a few additions per batch, read with ``loader.stats()``.

Each counter has one writer: the producer thread writes the production side
(read, decode, fill, transform, waiting for room in the prefetch queue), the
consumer thread the serving side (waiting for a batch, the copy to the device,
the device transform, batches served). A counter is a plain attribute added
to under the GIL, so reading it from another thread is safe; a snapshot taken
while a batch is in flight may count that batch's read but not yet its fill.

``snapshot()`` (what ``loader.stats()`` returns) is a plain dict, schema
``"tbl.stats/1"``:

- ``rank``, ``world_size``: whose figures these are (each rank counts its own);
- ``batches`` / ``samples``: handed to the consumer; ``batches_produced``: filled
  by the producer (ahead of the consumer by at most the prefetch depth);
- ``seconds``: time in each stage, summed over batches:
  ``read`` (the batch's columns or stored values: a remote shard's download and
  map, a heap's stored bytes; a local map's page faults land in ``kernel``),
  ``decode`` (serve-time JPEG decode, all decode threads of a batch, wall time),
  ``kernel`` (the rest of filling the batch: gather, crop-resize, normalization,
  labels, fields), ``transform`` (the user's ``transform`` on the producer
  thread), ``device_copy`` (handing the batch out: host views, or queueing the
  copies to ``device``; a non-blocking CUDA copy is counted when queued),
  ``device_transform``, ``producer_wait`` (the producer blocked on a full
  prefetch queue: the consumer is the slower side), ``consumer_wait`` (the
  consumer blocked in ``next()`` for a batch; with ``prefetch=0`` this is the
  whole production of the batch, made inline);
- ``timed``: False after ``loader.time_stages(False)``: the seconds stop growing, the counts do not;
- ``decoded_rows``: JPEG rows decoded at serve time (on the GPU with ``decode_device="cuda"``, whose decode
  runs asynchronously and is not counted in ``seconds``);
- ``queue_depth_mean``: batches waiting in the prefetch queue when the consumer
  asked for one, averaged over the batches served (near ``prefetch``: the
  producer keeps ahead; near 0: the consumer waits for it);
- ``prefetch``: the loader's prefetch depth;
- ``cache``: the remote shard cache of this loader's dataset (all zeros for a
  local dataset): ``hits`` and ``misses`` (shard lookups that found the file,
  or downloaded it; the read-ahead's lookups included), ``bytes_downloaded``,
  ``download_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["SCHEMA", "StageStats"]

SCHEMA = "tbl.stats/1"

STAGES = ("read", "decode", "kernel", "transform", "device_copy", "device_transform", "producer_wait",
          "consumer_wait")

def _no_clock() -> float:
    return 0.0


_NO_CACHE = {"hits": 0, "misses": 0, "bytes_downloaded": 0, "download_seconds": 0.0}


class StageStats:
    """The counters of one loader (see the module docstring). References no loader.

    ``cache``: the dataset's cache counters (``tbl_loader.source.cache.CacheCounters``), or None for a
    local dataset; ``rank`` / ``world_size`` / ``prefetch``: copied into every snapshot.
    """

    def __init__(self, *, rank: int = 0, world_size: int = 1, prefetch: int = 0, cache: Any = None) -> None:
        self.rank, self.world_size, self.prefetch, self.cache = rank, world_size, prefetch, cache
        self.clock: Callable[[], float] = time.perf_counter  # what every stage is timed with (see timed)
        # Producer side.
        self.read_s = 0.0
        self.decode_s = 0.0
        self.fill_s = 0.0  # read + decode + kernel: the whole BatchSource.fill
        self.transform_s = 0.0
        self.producer_wait_s = 0.0
        self.batches_produced = 0
        self.decoded_rows = 0
        # Consumer side.
        self.consumer_wait_s = 0.0
        self.device_copy_s = 0.0
        self.device_transform_s = 0.0
        self.batches = 0
        self.samples = 0
        self.queue_depth_sum = 0
        self._hook: Callable[[dict[str, Any]], Any] | None = None
        self._every = 0

    def on_stats(self, callback: Callable[[dict[str, Any]], Any] | None, every: int) -> None:
        """Call ``callback(snapshot())`` on the consumer thread after every ``every``-th batch served (None: stop)."""
        if callback is not None and not callable(callback):
            raise TypeError(f"callback must be callable or None, got {type(callback).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be an int >= 1, got {every!r}")
        self._hook, self._every = callback, every

    @property
    def timed(self) -> bool:
        """Whether stages are timed (counts are kept either way)."""
        return self.clock is time.perf_counter

    @timed.setter
    def timed(self, on: bool) -> None:
        self.clock = time.perf_counter if on else _no_clock

    def served(self, samples: int) -> None:
        """Consumer thread: one batch of ``samples`` handed out (and the hook called when it is due)."""
        self.batches += 1
        self.samples += samples
        if self._hook is not None and self.batches % self._every == 0:
            self._hook(self.snapshot())

    def snapshot(self) -> dict[str, Any]:
        """The counters as a plain dict (see the module docstring for the keys)."""
        kernel = max(0.0, self.fill_s - self.read_s - self.decode_s)
        seconds = {"read": self.read_s, "decode": self.decode_s, "kernel": kernel, "transform": self.transform_s,
                   "device_copy": self.device_copy_s, "device_transform": self.device_transform_s,
                   "producer_wait": self.producer_wait_s, "consumer_wait": self.consumer_wait_s}
        return {
            "schema": SCHEMA,
            "rank": self.rank,
            "world_size": self.world_size,
            "batches": self.batches,
            "samples": self.samples,
            "batches_produced": self.batches_produced,
            "seconds": seconds,
            "decoded_rows": self.decoded_rows,
            "queue_depth_mean": self.queue_depth_sum / self.batches if self.batches else 0.0,
            "prefetch": self.prefetch,
            "timed": self.timed,
            "cache": dict(_NO_CACHE) if self.cache is None else self.cache.snapshot(),
        }
