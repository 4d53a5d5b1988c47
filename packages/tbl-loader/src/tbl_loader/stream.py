"""Generic batched iteration: epochs, ranks, resumable state, background producer and buffer ring.

:class:`BatchStream` owns everything that does not depend on what a sample is;
a loader subclasses it and supplies a :class:`BatchSource` ("fill this batch of
sample ids into these preallocated buffers") and ``_make_batch`` (wrap the
published buffers into the user's batch object).

Position and epochs. The stream stands at ``(epoch, consumed)``, ``consumed``
counting global positions of the epoch's permutation taken by all ranks (see
:mod:`tbl_loader.order`). ``iter(stream)`` yields the rest of the current epoch
from that position, so a pass interrupted by ``break`` continues where it
stopped at the next ``iter``, and a pass started after ``load_state_dict`` is
the exact rest of the saved epoch. When the last batch of an epoch is handed
out the stream moves to ``(epoch + 1, 0)`` by itself: a plain
``for epoch in ...: for batch in loader`` sees a new permutation every epoch.
``set_epoch(e)`` (as with torch's DistributedSampler) jumps to the start of
epoch ``e``; calling it with the current epoch keeps the position, so the usual
``set_epoch(epoch)`` at the top of a resumed loop does not discard the resumed
remainder. Batches produced ahead by the prefetch thread but never handed out
do not count as consumed.

Lifetime. The producer thread references only the source, the ring and the
epoch order, never the stream or its iterator: dropping the iterator (``break``)
or the stream (garbage collection) runs a finalizer that stops and joins the
thread. ``close()`` does the same explicitly and then closes the dataset if the
loader opened it. Only one pass runs at a time: a new ``iter()``,
``set_epoch`` with another epoch, or ``load_state_dict`` stops the running one.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from .distributed import resolve_rank_world
from .order import PADDING_MODES, BatchPlan, EpochOrder
from .output import HostArray, OutputSpec
from .producer import Producer
from .ring import Ring
from .state import StateMismatchError, StreamState, settings_fingerprint

__all__ = ["BatchSource", "BatchStream", "LoaderClosedError"]


class LoaderClosedError(RuntimeError):
    """The loader was closed; it cannot be iterated any more."""


class BatchSource(Protocol):
    """What a loader plugs into :class:`BatchStream`. Must not reference the stream.

    ``allocate(capacity, output)`` returns one ring slot's named host buffers, each
    with ``capacity`` rows. ``fill(buffers, plan)`` writes the samples
    ``plan.sample_ids`` into the first ``len(plan.sample_ids)`` rows of the kernel
    views ``buffers`` (runs on the producer thread).
    """

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]: ...

    def fill(self, buffers: dict[str, np.ndarray], plan: BatchPlan) -> None: ...


def _produce(plans: Iterator[BatchPlan], ring: Ring, source: BatchSource) -> Iterator[tuple[BatchPlan, Any]]:
    """Producer body: acquire a free slot, fill it, hand it on. References no stream object."""
    for plan in plans:
        slot = ring.acquire()
        try:
            source.fill(slot.kernel, plan)
        except BaseException:
            slot.in_flight = False
            raise
        yield plan, slot


class _Pass:
    """One running pass: its producer and the ring it fills. Closed exactly once."""

    def __init__(self, producer: Producer, ring: Ring) -> None:
        self.producer = producer
        self.ring = ring
        self.closed = False
        self.stopped = True

    def close(self) -> bool:
        if not self.closed:
            self.closed = True
            self.stopped = self.producer.close()
            if self.stopped:
                self.ring.reclaim()  # slots filled but never handed out are free again
        return self.stopped


class _Resources:
    """What a stream must release. Referenced by the stream's finalizer; never references the stream."""

    def __init__(self, closers: list[Callable[[], None]]) -> None:
        self.closers = closers
        self.active: _Pass | None = None
        self.ring: Ring | None = None
        self.closed = False
        self.thread_leaked = False

    def stop_active(self) -> bool:
        """Stop the running pass; False if its thread outlived the join timeout."""
        active, self.active = self.active, None
        if active is not None and not active.close():
            # The thread is still running: never hand its ring out again, and never unmap what it
            # may still read (its own references keep the maps alive until it exits).
            self.ring = None
            self.thread_leaked = True
            if not active.producer.on_producer_thread:  # else: a finalizer run on that thread; it exits next
                warnings.warn("a producer thread did not stop in time; its buffers are abandoned",
                              RuntimeWarning, stacklevel=2)
        return not self.thread_leaked

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.stop_active():
            return  # a thread may still read the dataset: leave its maps to the process exit
        if self.ring is not None:
            self.ring.close()  # a live iterator still references the ring: drop what it holds
            self.ring = None
        for close in self.closers:
            close()


class _StreamIterator:
    """Iterator of one pass. Dropping it stops the producer (finalizer), so ``break`` is enough."""

    def __init__(self, stream: BatchStream, pass_: _Pass) -> None:
        self._stream = stream
        self._pass = pass_
        self._finalizer = weakref.finalize(self, pass_.close)

    def __iter__(self) -> _StreamIterator:
        return self

    def __next__(self) -> Any:
        if self._pass.closed:
            raise StopIteration
        try:
            plan, slot = next(self._pass.producer)
        except BaseException:
            self.close()
            raise
        stream = self._stream
        try:
            outputs = self._pass.ring.publish(slot, len(plan.sample_ids), stream.output)
            batch = stream._make_batch(outputs, plan)
        except BaseException:
            slot.in_flight = False  # nothing was handed out: the slot is free again
            self.close()
            raise
        stream._advance(plan)
        if plan.last:
            self.close()
        return batch

    def close(self) -> None:
        self._finalizer()


class BatchStream:
    """Base of the batched loaders: order, sharding, state, prefetch and buffers.

    Subclasses call ``super().__init__`` and implement ``_batch_source()`` (called
    once, on first iteration) and ``_make_batch(outputs, plan)``; they extend
    ``_settings()`` with every setting that changes which samples or which
    augmentation draws the stream yields.
    """

    def __init__(
        self,
        *,
        num_samples: int,
        batch_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool,
        prefetch: int,
        rank: int | None,
        world_size: int | None,
        padding: str,
        output: OutputSpec,
        dataset_fingerprint: str,
        closers: list[Callable[[], None]] | None = None,
    ) -> None:
        self._res = _Resources(list(closers or []))
        self._finalizer = weakref.finalize(self, self._res.close)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        if padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {PADDING_MODES}, got {padding!r}")
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        self.num_samples = int(num_samples)
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.prefetch = prefetch
        self.padding = padding
        self.output = output
        self._dataset_fp = dataset_fingerprint
        # Validates the seed once (same rule as the generator).
        EpochOrder(self.num_samples, seed, 0)
        self.seed = int(seed)
        self._epoch = 0
        self._consumed = 0
        self._source: BatchSource | None = None

    # ---- subclass hooks -------------------------------------------------------------------

    def _batch_source(self) -> BatchSource:
        raise NotImplementedError

    def _make_batch(self, outputs: dict[str, Any], plan: BatchPlan) -> Any:
        raise NotImplementedError

    def _settings(self) -> dict[str, Any]:
        """Settings that change the stream (never batch size, prefetch, threads, world size, dtype)."""
        return {"shuffle": self.shuffle, "drop_last": self.drop_last, "padding": self.padding}

    # ---- position ------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def consumed(self) -> int:
        """Global samples of the current epoch consumed so far (all ranks together)."""
        return self._consumed

    def _advance(self, plan: BatchPlan) -> None:
        if plan.last:
            self._epoch, self._consumed = plan.epoch + 1, 0
        else:
            self._consumed = plan.consumed

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch`` (no-op when already in ``epoch``: keeps a resumed position)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        if int(epoch) != self._epoch:
            self._res.stop_active()
            self._epoch, self._consumed = int(epoch), 0

    def _state(self, epoch: int, consumed: int) -> StreamState:
        return StreamState(self.seed, epoch, consumed, self._dataset_fp, settings_fingerprint(self._settings()))

    def state_dict(self) -> dict[str, Any]:
        """Seed, epoch, global samples consumed, dataset and settings fingerprints (a small dict)."""
        return self._state(self._epoch, self._consumed).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position; raises StateMismatchError if it belongs to another stream."""
        saved = StreamState.from_dict(state)
        self._state(saved.epoch, saved.consumed).check_compatible(saved)
        if saved.consumed > self.num_samples:
            raise StateMismatchError(f"state consumed {saved.consumed} samples of a {self.num_samples}-sample dataset")
        self._res.stop_active()
        self._epoch, self._consumed = saved.epoch, saved.consumed

    # ---- iteration ------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches of one full epoch on this rank."""
        n, w = self.num_samples, self.world_size
        per_rank = -(-n // w) if self.padding == "wrap" else n // w
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def epoch_order(self) -> EpochOrder:
        """The rest of the current epoch for this rank, from the current position."""
        return EpochOrder(
            self.num_samples,
            self.seed,
            self._epoch,
            shuffle=self.shuffle,
            world_size=self.world_size,
            rank=self.rank,
            padding=self.padding,
            start=self._consumed,
        )

    def __iter__(self) -> Iterator[Any]:
        if self._res.closed:
            raise LoaderClosedError("this loader was closed")
        self._res.stop_active()
        order = self.epoch_order()
        if order.num_batches(self.batch_size, self.drop_last) == 0:
            self._epoch, self._consumed = self._epoch + 1, 0  # nothing left of this epoch on this rank
            return iter(())
        if self._source is None:
            self._source = self._batch_source()
        # The closures below capture locals only (never self): the producer thread must not keep
        # the stream alive.
        source, capacity, output = self._source, self.batch_size, self.output
        if self._res.ring is None:
            self._res.ring = Ring(lambda: source.allocate(capacity, output), size=self.prefetch + 2)
        ring = self._res.ring
        plans = order.batches(self.batch_size, self.drop_last)
        producer = Producer(lambda: _produce(plans, ring, source), self.prefetch, name="tbl-loader-producer")
        pass_ = _Pass(producer, ring)
        self._res.active = pass_
        return _StreamIterator(self, pass_)

    def _release_sources(self) -> None:
        """Drop every reference to mapped data (subclass hook), so closing the dataset unmaps it."""
        self._source = None

    def close(self) -> None:
        """Stop the producer, release the buffers, close the dataset if this loader opened it."""
        if self._res.closed:
            return
        if self._res.stop_active():
            self._release_sources()
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._res.closed

    def __enter__(self) -> BatchStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
