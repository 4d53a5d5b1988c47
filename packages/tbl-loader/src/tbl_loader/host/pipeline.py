"""The host pipeline: a batch source, a buffer ring and a background producer.

A :class:`HostPipeline` makes the batches a :class:`~tbl_loader.stream.cursor.StreamCursor`
plans. Its :class:`BatchSource` fills one ring slot per batch on the producer
thread (kernel calls that release the GIL) and may return a Python payload
(values that are not arrays, such as strings) which travels with the slot; on
the consumer thread the slot is published (host views, or device copies) and
the loader's ``make_batch`` turns buffers and payload into the user's batch.

Lifetime. The producer thread references only the source, the ring and the
epoch's plans, never the loader, the cursor or the iterator: dropping the
iterator (``break``) or the loader (garbage collection) runs a finalizer that
stops and joins the thread. ``close()`` does the same explicitly and then runs
the closers (closing the dataset if the loader opened it). Only one pass runs
at a time: a new pass, or a jump of the cursor (``set_epoch`` to another epoch,
``load_state_dict``), stops the running one.

User transforms (:mod:`tbl_loader.host.transforms`): with a ``transform``, the
producer thread builds the batch from host views of the slot and runs the
transform on it; the consumer only moves the result to the device. A
``device_transform`` runs on the consumer thread on the batch handed out.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from ..errors import LoaderClosedError, LoaderInWorkersError
from ..stream.cursor import Resumable, StreamCursor
from ..stream.order import BatchPlan
from . import producer as producer_module
from .output import HostArray, OutputSpec
from .producer import Producer
from .ring import Ring, Slot
from .stats import StageStats

__all__ = ["BatchSource", "HostLoader", "HostPipeline", "refuse_dataloader_workers"]


def refuse_dataloader_workers(loader: object) -> None:
    """Raise LoaderInWorkersError when ``loader`` is iterated inside one of several torch DataLoader workers.

    A loader is already parallel and holds the whole epoch's order: wrapped as an iterable dataset in a
    DataLoader with ``num_workers > 1``, every worker would serve every batch (duplicates that train
    silently). One worker, or no DataLoader, serves each batch once."""
    data = sys.modules.get("torch.utils.data")  # torch is never imported here for this check
    info = data.get_worker_info() if data is not None else None
    if info is not None and info.num_workers > 1:
        name = type(loader).__name__
        raise LoaderInWorkersError(
            f"{name} iterated in {info.num_workers} DataLoader workers would serve every batch {info.num_workers} "
            f"times; iterate {name} itself (it prefetches on its own thread), or give the DataLoader a map-style "
            "dataset (ImageDataset.from_loader + EpochBatchSampler, PyTreeDataset)")


class BatchSource(Protocol):
    """What a loader plugs into :class:`HostPipeline`. Must not reference the loader.

    ``allocate(capacity, output)`` returns one ring slot's named host buffers, each
    with ``capacity`` rows. ``begin_pass(epoch_order)`` learns a pass's order before
    its first batch is filled (a source that reads ahead schedules it; others do
    nothing). ``fill(buffers, plan)`` writes the samples ``plan.sample_ids`` into
    the first ``len(plan.sample_ids)`` rows of the kernel views ``buffers`` and
    returns the batch's payload (any Python object, or None); it runs on the
    producer thread.
    """

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]: ...

    def begin_pass(self, epoch_order: Any) -> None: ...

    def fill(self, buffers: dict[str, np.ndarray], plan: BatchPlan) -> Any: ...


MakeBatch = Callable[[dict[str, Any], Any, BatchPlan], Any]
"""``make_batch(outputs, payload, plan)``: the user's batch from the published buffers and the payload."""


def _produce(plans: Iterator[BatchPlan], ring: Ring, source: BatchSource, stats: StageStats,
             stage: Any = None, threaded: bool = True) -> Iterator[tuple[BatchPlan, Slot]]:
    """Producer body: acquire a free slot, fill it (and run the user's transform), hand it on.
    References no loader object. ``threaded``: the time this generator stays suspended in ``yield`` is the
    producer thread blocked on a full prefetch queue (without a thread it is the consumer's own time)."""
    for plan in plans:
        clock = stats.clock  # read per batch: time_stages() may switch it between batches
        slot = ring.acquire()
        try:
            t0 = clock()
            slot.payload = source.fill(slot.kernel, plan)
            t1 = clock()
            stats.fill_s += t1 - t0
            if stage is not None:
                stage.on_producer(slot, plan)
                stats.transform_s += clock() - t1
        except BaseException:
            slot.release()
            raise
        stats.batches_produced += 1
        t0 = clock()
        yield plan, slot
        if threaded:
            stats.producer_wait_s += clock() - t0


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


class _PassIterator:
    """Iterator of one pass. Dropping it stops the producer (finalizer), so ``break`` is enough."""

    def __init__(self, pass_: _Pass, cursor: StreamCursor, output: OutputSpec, make_batch: MakeBatch,
                 stats: StageStats, stage: Any = None) -> None:
        self._pass = pass_
        self._stats = stats
        self._cursor = cursor
        self._output = output
        self._make_batch = make_batch
        self._stage = stage
        self._finalizer = weakref.finalize(self, pass_.close)

    def __iter__(self) -> _PassIterator:
        return self

    def __next__(self) -> Any:
        if self._pass.closed:
            raise StopIteration
        stats = self._stats
        clock = stats.clock
        producer = self._pass.producer
        try:
            stats.queue_depth_sum += producer.queued
            t0 = clock()
            plan, slot = next(producer)
            t1 = clock()
            stats.consumer_wait_s += t1 - t0
        except BaseException:
            self.close()
            raise
        stage = self._stage
        try:
            if stage is not None and stage.transform is not None:  # the producer made the batch already
                batch = self._pass.ring.hand_over(slot, self._output, stage.to_output)
            else:
                outputs, payload = self._pass.ring.publish(slot, len(plan.sample_ids), self._output)
                batch = self._make_batch(outputs, payload, plan)
            t2 = clock()
            stats.device_copy_s += t2 - t1
            if stage is not None and stage.device_transform is not None:
                batch = stage.device_transform(batch)
                stats.device_transform_s += clock() - t2
        except BaseException:
            slot.release()  # nothing was handed out: the slot is free again
            self.close()
            raise
        self._cursor.advance(plan)
        if plan.last:
            self.close()
        stats.served(len(plan.sample_ids))
        return batch

    def close(self) -> None:
        self._finalizer()


class HostPipeline:
    """``source`` + ring + producer for one loader; see the module docstring.

    ``capacity``: rows per ring slot (the batch size). ``prefetch``: batches
    prepared ahead on the producer thread (0: no thread, batches are made on
    ``next()``); the ring holds ``prefetch + 2`` slots and grows instead of
    overwriting a batch still referenced. ``closers`` run once at ``close()``.
    ``stats``: the loader's :class:`~tbl_loader.host.stats.StageStats` (default: new ones).
    Attach it to its cursor with ``cursor.on_jump(pipeline.stop)`` and to its
    loader with ``weakref.finalize(loader, pipeline.close)``; it references neither.
    """

    def __init__(self, source: BatchSource, output: OutputSpec, *, capacity: int, prefetch: int,
                 closers: list[Callable[[], None]] | None = None, stage: Any = None,
                 stats: StageStats | None = None) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        self.source: BatchSource | None = source
        self.output = output
        self.capacity = capacity
        self.prefetch = prefetch
        self._closers = list(closers or [])
        self.stage = stage  # a tbl_loader.host.transforms.TransformStage, or None
        self.stats = stats if stats is not None else StageStats(prefetch=prefetch)
        self._active: _Pass | None = None
        self._ring: Ring | None = None
        self.closed = False
        self.thread_leaked = False

    @property
    def ring(self) -> Ring | None:
        """The buffer ring (made at the first pass), or None."""
        return self._ring

    def run(self, cursor: StreamCursor, make_batch: MakeBatch) -> Iterator[Any]:
        """A pass over the rest of ``cursor``'s epoch (stops the running one first)."""
        if self.closed or self.source is None:
            raise LoaderClosedError("this loader was closed")
        self.stop()
        started = cursor.start_pass()
        if started is None:
            return iter(())
        epoch_order, plans = started
        self.source.begin_pass(epoch_order)  # a source that reads ahead learns the pass's order first
        # The closures capture locals only (never self): the producer thread must not keep the pipeline alive.
        source, capacity, output, stage, stats = self.source, self.capacity, self.output, self.stage, self.stats
        if self._ring is None:
            self._ring = Ring(lambda: source.allocate(capacity, output), size=self.prefetch + 2)
        ring = self._ring
        threaded = self.prefetch > 0
        producer = Producer(lambda: _produce(plans, ring, source, stats, stage, threaded), self.prefetch,
                            name="tbl-loader-producer")
        self._active = _Pass(producer, ring)
        return _PassIterator(self._active, cursor, output, make_batch, stats, stage)

    def stop(self) -> bool:
        """Stop the running pass; False if its thread outlived the join timeout."""
        active, self._active = self._active, None
        if active is not None and not active.close():
            # The thread is still running: never hand its ring out again, and never unmap what it
            # may still read (its own references keep the maps alive until it exits).
            self._ring = None
            self.thread_leaked = True
            if not active.producer.on_producer_thread:  # else: a finalizer run on that thread; it exits next
                warnings.warn(f"a producer thread did not stop within {producer_module.JOIN_TIMEOUT_S:g} s; it is "
                              f"in {active.producer.stuck_at() or 'an unknown call'}; its buffers are abandoned "
                              "(a transform or read that never returns keeps it running)",
                              RuntimeWarning, stacklevel=2)
        return not self.thread_leaked

    def close(self) -> None:
        """Stop the pass, drop the buffers and the source, run the closers. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if not self.stop():
            return  # a thread may still read the dataset: leave its maps to the process exit
        self.source = None
        if self._ring is not None:
            self._ring.close()  # a live iterator still references the ring: drop what it holds
            self._ring = None
        closers, self._closers = self._closers, []  # a closer may hold the source (and its maps) alive
        for close in closers:
            close()


class HostLoader(Resumable):
    """A loader made of a :class:`StreamCursor` and a :class:`HostPipeline`: iteration, close, lifetime.

    A subclass builds both, hands them to :meth:`_compose`, and turns each
    published batch into the user's object in ``_make_batch(outputs, payload, plan)``.
    """

    _pipeline: HostPipeline

    def _compose(self, cursor: StreamCursor, pipeline: HostPipeline) -> None:
        self.cursor = cursor
        self._pipeline = pipeline
        pipeline.stats.rank, pipeline.stats.world_size = cursor.options.rank, cursor.options.world_size
        cursor.on_jump(pipeline.stop)  # a jump ends the running pass
        weakref.finalize(self, pipeline.close)  # collection stops the producer and unmaps

    output = property(lambda self: self._pipeline.output, doc="Backend and placement of the batches (OutputSpec).")
    prefetch = property(lambda self: self._pipeline.prefetch, doc="Batches prepared ahead by the producer.")

    def __iter__(self) -> Iterator[Any]:
        refuse_dataloader_workers(self)
        return self._pipeline.run(self.cursor, self._make_batch)

    def stats(self) -> dict[str, Any]:
        """This rank's per-stage counters since the loader was made, as a plain dict (schema ``tbl.stats/1``;
        keys: :mod:`tbl_loader.host.stats`)."""
        return self._pipeline.stats.snapshot()

    def time_stages(self, on: bool = True) -> None:
        """Time every stage (the default) or not: off, ``stats()`` keeps counting batches, samples, rows and
        cache lookups, and its seconds stay where they were (benchmarks measure what the clocks cost with it)."""
        self._pipeline.stats.timed = bool(on)

    def on_stats(self, callback: Callable[[dict[str, Any]], Any] | None, every: int = 100) -> None:
        """Call ``callback(loader.stats())`` after every ``every``-th batch served, on the training thread
        (hand the figures to a logger: TensorBoard's ``add_scalars``, Lightning's ``log_dict``); None stops."""
        self._pipeline.stats.on_stats(callback, every)

    def close(self) -> None:
        """Stop the producer, release the buffers, close the dataset if this loader opened it."""
        self._pipeline.close()

    @property
    def closed(self) -> bool:
        return self._pipeline.closed

    def _indices(self, plan: BatchPlan) -> Any:
        """The batch's dataset rows (int64, host), as a tensor when the output is torch."""
        indices = plan.sample_ids.copy()
        if self.output.backend == "torch":
            import torch  # only loaders that output torch get here

            return torch.from_numpy(indices)
        return indices

    def _make_batch(self, outputs: dict[str, Any], payload: Any, plan: BatchPlan) -> Any:
        raise NotImplementedError
