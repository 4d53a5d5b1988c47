"""A background fetcher: downloads, into the shard cache, the shards an epoch's order will need next.

The loader hands it the order of the rest of the epoch as a sequence of shard
indices (each shard once, in the order the batches first touch it) and tells
it, batch by batch, which position of that sequence it has reached. The
fetcher keeps at most ``lookahead`` shards ahead of that position downloaded
or downloading, with at most ``concurrency`` downloads at a time: bounded
disk (``lookahead`` shards) and bounded connections. A download that fails is
not retried here: the loader fetches the shard itself when it needs it and
raises the error then, in the consumer's ``next()``.

Every fetcher of a process downloads on one :class:`DownloadPool` (as many
threads as the largest ``concurrency`` a live fetcher asked for), so a
``Mix`` of 100 sources at URLs runs 4 download threads, not 400. A batch's own
downloads go before downloads ahead, whichever source queued them; a read that
finds its shard still queued ahead takes it back and downloads it itself.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from ..errors import CacheThrashWarning
from .cache import parse_size

__all__ = ["DownloadPool", "Fetcher", "download_pool", "read_ahead_depth", "shards_in_read_order",
           "warn_if_shuffle_thrashes"]

SMALL_CACHE_LOOKAHEAD = 4  # shards kept downloaded ahead through a cache smaller than the dataset
READ, AHEAD = 0, 1  # download priorities: a batch waiting for its shard first, then the downloads ahead


def warn_if_shuffle_thrashes(shuffle: Any, shard_entries: Sequence[dict[str, Any]], cache_limit: Any,
                             where: str) -> None:
    """CacheThrashWarning when a global shuffle reads a dataset at a URL through a cache smaller than it.

    Each batch of a global permutation reads rows from nearly every shard, so a cache that holds a
    fraction of the dataset evicts shards the next batches need again: an epoch downloads the dataset
    many times over (20x measured with a quarter cache). A block shuffle reads a few shards at a time
    and downloads each about once per epoch. Nothing is changed: the warning says what to do."""
    limit = parse_size(cache_limit)
    total = sum(int(e.get("size") or 0) for e in shard_entries)
    if shuffle is True and limit is not None and total > limit:
        warnings.warn(
            f"{where}: shuffle=True over a shard cache of {limit} bytes for a {total}-byte dataset downloads "
            "shards many times per epoch (each batch reads nearly every shard); shuffle='block' downloads each "
            "about once, or raise cache_limit to the dataset's size", CacheThrashWarning, stacklevel=3)


def read_ahead_depth(shard_entries: Sequence[dict[str, Any]], cache_limit: int | None, capacity: int, *,
                     shard_local: bool = False) -> int:
    """How many shards a fetcher keeps downloaded ahead of the reads, by default.

    A cache that holds the whole dataset (``cache_limit`` None or at least the shards' bytes) never evicts
    a shard of it, so the whole order is queued at once and downloads, ``concurrency`` at a time, never
    wait for the reads. A smaller cache (``capacity`` shards) keeps at most what it holds besides the
    shard being read: two thirds of it when the order is ``shard_local`` (a block shuffle or none: the
    reads move through a few shards at a time, so the rest of the cache holds them and a download ahead
    evicts only shards the reads are done with); 4 otherwise (a global shuffle reads nearly every shard
    in every batch, so a deeper read-ahead only competes with the batch's own downloads for the room:
    1.27x the dataset's bytes per epoch measured with 7 ahead through a cache of 30%, 1.02x with 4)."""
    total = sum(int(e.get("size") or 0) for e in shard_entries)
    if cache_limit is None or total <= cache_limit:
        return len(shard_entries)
    depth = max(SMALL_CACHE_LOOKAHEAD, 2 * capacity // 3) if shard_local else SMALL_CACHE_LOOKAHEAD
    return min(depth, max(0, capacity - 1))


def shards_in_read_order(segment_rows: Sequence[int], rows: Any) -> list[int]:
    """The shards that ``rows`` (dataset rows in the order they will be read) fall in, each once, in the order
    the reads first reach them: what a fetcher downloads ahead."""
    starts = np.cumsum(np.asarray(segment_rows, dtype=np.int64))
    shards = np.searchsorted(starts, np.asarray(rows, dtype=np.int64), side="right")
    _, first = np.unique(shards, return_index=True)
    return shards[np.sort(first)].tolist()


class DownloadPool:
    """Download threads shared by the fetchers of a process, taking queued work by priority, then in order.

    Each fetcher :meth:`acquire`s it with the ``concurrency`` it wants and :meth:`release`s it on close;
    the pool runs as many threads as the largest ``concurrency`` held, starts them as work arrives and
    lets them end once no fetcher holds it, so a process with no open remote dataset has no download
    thread. A fetcher's ``concurrency`` is what it asks the pool for, not a limit of its own. A future
    cancelled while queued is dropped when its turn comes."""

    def __init__(self) -> None:
        self._held: Counter[int] = Counter()  # concurrency -> live fetchers that asked for it
        self._order = itertools.count()
        self._start_over()

    def _start_over(self) -> None:
        """No thread and nothing queued: a new pool, or this one in a forked child, where the parent's threads
        do not run. What the parent had queued is dropped without touching its futures (a lock of theirs may
        have been held at the fork); the fetchers the child inherited still hold the pool."""
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int, Future, Callable[..., Any], tuple[Any, ...]]] = []
        self._threads = 0
        self._idle = 0

    @property
    def size(self) -> int:
        """The threads the pool runs at most now: the largest ``concurrency`` held (0 when none is)."""
        with self._cond:
            return max(self._held, default=0)

    def acquire(self, concurrency: int) -> None:
        with self._cond:
            self._held[concurrency] += 1

    def release(self, concurrency: int) -> None:
        with self._cond:
            self._held[concurrency] -= 1
            if self._held[concurrency] <= 0:
                del self._held[concurrency]
            self._cond.notify_all()  # idle threads beyond the new size (or all, with no holder) end

    def submit(self, priority: int, fn: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._cond:
            heapq.heappush(self._queue, (priority, next(self._order), future, fn, args))
            self._cond.notify()
            if len(self._queue) > self._idle and self._threads < max(self._held, default=1):
                self._threads += 1
                threading.Thread(target=self._work, name="tbl-download", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if self._threads > max(self._held, default=0):
                        self._threads -= 1
                        return
                    self._idle += 1
                    self._cond.wait()
                    self._idle -= 1
                _, _, future, fn, args = heapq.heappop(self._queue)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:  # handed to whoever waits on the future
                future.set_exception(exc)


_pool = DownloadPool()


def download_pool() -> DownloadPool:
    """This process's :class:`DownloadPool`."""
    return _pool


os.register_at_fork(after_in_child=_pool._start_over)


class Fetcher:
    """Prefetches shards in order (see the module docstring). ``fetch(k, wanted)`` downloads shard ``k`` into the
    cache without evicting the shards ``wanted`` (indices: see :meth:`wanted`; empty for a batch's own downloads)."""

    def __init__(self, fetch: Callable[[int, list[int]], object], *, lookahead: int = 4, concurrency: int = 4) -> None:
        if lookahead < 0 or concurrency < 1:
            raise ValueError(f"need lookahead >= 0 and concurrency >= 1, got {lookahead}, {concurrency}")
        self._fetch = fetch
        self.lookahead = lookahead
        self._concurrency = concurrency
        self._pool = download_pool()
        self._pool.acquire(concurrency)
        self._lock = threading.Lock()
        self._sequence: list[int] = []
        self._where: dict[int, int] = {}
        self._next = 0  # next position of the sequence to submit
        self._front = 0  # position of the shard the reads reached last
        self._pending: dict[int, Future] = {}
        self._generation = 0
        self._closed = False

    def schedule(self, shards: list[int]) -> None:
        """A new order: the shards the rest of the epoch reads, in order (forgets the previous one)."""
        with self._lock:
            self._generation += 1
            self._sequence = list(shards)
            self._where = {k: i for i, k in enumerate(self._sequence)}
            self._next = self._front = 0
            self._submit_up_to(min(len(self._sequence), self.lookahead))

    def reached(self, shards: list[int]) -> None:
        """The loader is reading ``shards`` now: keep the next ``lookahead`` shards of the sequence coming."""
        with self._lock:
            if self._closed:
                return
            pos = max((self._where.get(k, -1) for k in shards), default=-1)
            self._pending = {k: f for k, f in self._pending.items() if not f.done()}
            self._next = max(self._next, pos + 1)
            self._front = max(self._front, pos)
            self._submit_up_to(min(len(self._sequence), pos + 1 + self.lookahead))

    def wanted(self) -> list[int]:
        """The shards of the order from the one the reads reached last to the last one submitted: what the
        reads need next, which a download ahead must not evict to make its own room."""
        with self._lock:
            return self._sequence[self._front:self._next]

    def _submit_up_to(self, limit: int) -> None:
        """Submit the sequence's shards before position ``limit`` not submitted yet (the lock is held)."""
        while self._next < limit:
            k = self._sequence[self._next]
            self._next += 1
            if k not in self._pending:
                self._pending[k] = self._pool.submit(AHEAD, self._quiet_fetch, k, True)

    def _quiet_fetch(self, k: int, ahead: bool) -> None:
        try:
            # A download ahead keeps the shards the reads want before it; a batch's own download (fetch_now)
            # is a read: any shard it needs room from is one the reads are done with or want later.
            self._fetch(k, self.wanted() if ahead else [])
        except Exception:
            pass  # reported by the loader's own fetch of this shard, on the consumer's side

    def fetch_now(self, shards: list[int]) -> None:
        """Download ``shards`` in parallel (up to ``concurrency`` at a time), before any download ahead, joining
        downloads already under way, and wait for all of them, however they end: a batch that reads many
        shards waits for the slowest one instead of for their sum. Errors are left to the reader's own
        fetch, as above."""
        with self._lock:
            if self._closed:
                return
            for k in shards:
                pending = self._pending.get(k)
                # Queued ahead (behind other sources' downloads ahead, maybe): take it back, ask again first.
                if pending is None or pending.done() or pending.cancel():
                    self._pending[k] = self._pool.submit(READ, self._quiet_fetch, k, False)
            waiting = [self._pending[k] for k in shards]
        for f in waiting:
            if not f.cancelled():
                f.exception()

    def join(self, k: int) -> None:
        """If shard ``k``'s download is running here, wait for it to end (however it ends): the reader then
        finds the shard cached instead of queueing for its lock behind this process's own download. One
        still queued is taken back: the reader downloads it now, ahead of the queue."""
        with self._lock:
            pending = self._pending.get(k)
            if pending is not None and pending.cancel():
                del self._pending[k]
                return
        if pending is not None and not pending.cancelled():
            pending.exception()

    def wait(self) -> None:
        """Block until every download submitted so far has finished (tests and benchmarks)."""
        with self._lock:
            pending = list(self._pending.values())
        for f in pending:
            f.exception()

    def close(self) -> None:
        """Drop the downloads still queued and wait for those running to end (their files are whole then)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending = list(self._pending.values())
        running = [f for f in pending if not f.cancel()]
        for f in running:
            f.exception()
        self._pool.release(self._concurrency)
