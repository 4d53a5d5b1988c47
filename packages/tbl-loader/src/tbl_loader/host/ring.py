"""A ring of preallocated batch buffers that never overwrites memory someone still reads.

Lifetime of a slot (a set of named host buffers, e.g. images + labels):

1. ``acquire()`` (producer thread) picks a *free* slot and marks it in flight.
   Free means: not in flight, no user reference to any of its buffers (see
   :class:`tbl_loader.host.output.HostArray`: any numpy view or torch tensor over the
   memory raises the buffer's reference count) and no pending device copy (its
   CUDA event, if any, has completed).
2. The producer fills it, and may attach a Python ``payload`` (values that are
   not arrays); the slot travels through the prefetch queue.
3. ``publish()`` (consumer thread) turns it into the user's objects: host views,
   or device tensors copied with ``non_blocking=True`` after which a CUDA event
   is recorded on the current stream, and hands the payload over (the slot
   keeps no reference to it). Only then is the in-flight mark cleared:
   from here on the user's references (or the event) keep the slot busy.
4. When the user drops every view (and the copy finished), the slot is free again.

If no slot is free, ``acquire()`` first waits for a slot whose only obstacle is
an unfinished copy (``event.synchronize()``), and otherwise allocates a new slot
rather than overwrite anything. Growth follows what the user keeps alive; extra
slots are dropped again once released, and a warning is issued (once) when the
ring grows past ``warn_slots``. ``reclaim()`` clears the in-flight marks after the
producer thread has been joined (slots it filled but never handed over).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ..errors import RingGrowthWarning
from .output import HostArray, OutputSpec

__all__ = ["Ring", "Slot"]


class Slot:
    """One set of buffers plus its payload, in-flight mark and pending-copy event."""

    __slots__ = ("arrays", "event", "in_flight", "kernel", "payload")

    def __init__(self, arrays: dict[str, HostArray]) -> None:
        self.arrays = arrays
        self.kernel = {name: a.kernel for name, a in arrays.items()}  # what fill() writes
        self.in_flight = False
        self.event: Any = None
        self.payload: Any = None  # the producer's Python values for this batch, until published

    def release(self) -> None:
        """Free again without being handed out (a fill or a publish failed)."""
        self.payload = None
        self.in_flight = False

    def held(self) -> bool:
        """In flight, or some user object still references one of the buffers."""
        return self.in_flight or any(a.in_use() for a in self.arrays.values())

    def copy_pending(self) -> bool:
        return self.event is not None and not self.event.query()

    @property
    def nbytes(self) -> int:
        return sum(a.root.nbytes for a in self.arrays.values())


class Ring:
    """Buffer ring of ``size`` slots made by ``allocate()`` (grows instead of overwriting)."""

    def __init__(self, allocate: Callable[[], dict[str, HostArray]], size: int, *, warn_slots: int | None = None):
        if size < 1:
            raise ValueError(f"ring size must be >= 1, got {size}")
        self._allocate = allocate
        self.size = size
        self.warn_slots = warn_slots if warn_slots is not None else 2 * size + 8
        self._slots = [Slot(allocate()) for _ in range(size)]
        self._next = 0
        self._warned = False
        self.allocations = size  # total slots ever allocated (diagnostics, tests)

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def slots(self) -> tuple[Slot, ...]:
        return tuple(self._slots)

    def acquire(self) -> Slot:
        """A free slot, marked in flight (producer side)."""
        n = len(self._slots)
        if n == 0 and self._allocate is None:
            raise RuntimeError("this ring was closed")
        waiting: Slot | None = None
        chosen: Slot | None = None
        for k in range(n):
            slot = self._slots[(self._next + k) % n]
            if slot.held():
                continue
            if slot.copy_pending():
                waiting = waiting or slot
                continue
            chosen = slot
            self._next = (self._next + k + 1) % n
            break
        if chosen is None and waiting is not None:
            waiting.event.synchronize()  # only a device copy still reads it: wait rather than allocate
            chosen = waiting
        if chosen is None:
            if self._allocate is None:
                raise RuntimeError("this ring was closed")
            chosen = Slot(self._allocate())
            self._slots.append(chosen)
            self.allocations += 1
            if len(self._slots) > self.warn_slots and not self._warned:
                self._warned = True
                mb = sum(s.nbytes for s in self._slots) / 2**20
                warnings.warn(
                    f"{len(self._slots) - 1} batches of this loader are still referenced, so its buffer ring "
                    f"grew to {len(self._slots)} buffers ({mb:.0f} MiB). Drop batches you no longer need, or "
                    "keep copies (tensor.clone() / array.copy()) instead of the batches themselves.",
                    RingGrowthWarning,
                    stacklevel=2,
                )
        else:
            self._trim(chosen)
        chosen.event = None
        chosen.in_flight = True
        return chosen

    def _trim(self, keep: Slot) -> None:
        """Drop free slots beyond ``size`` (memory the user released after a growth)."""
        if len(self._slots) <= self.size:
            return
        for slot in list(self._slots):
            if len(self._slots) <= self.size:
                break
            if slot is not keep and not slot.held() and not slot.copy_pending():
                self._slots.remove(slot)
        self._next %= len(self._slots)

    def publish(self, slot: Slot, rows: int, spec: OutputSpec) -> tuple[dict[str, Any], Any]:
        """The user's objects for the first ``rows`` rows of every buffer, and the slot's payload (consumer side)."""
        if spec.device is None:
            out = {name: a.export(rows, spec) for name, a in slot.arrays.items()}
        else:
            out = {}
            for name, a in slot.arrays.items():
                host = a.pinned_rows(rows) if a.pinned is not None else a.export(rows, spec)
                out[name] = host.to(spec.device, non_blocking=spec.cuda)
            if spec.cuda:
                import torch

                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(spec.device))
                slot.event = event
        payload, slot.payload = slot.payload, None
        slot.in_flight = False  # only now: the user's references / the event protect it from here
        return out, payload

    def hand_over(self, slot: Slot, spec: OutputSpec, convert: Callable[[Any], Any]) -> Any:
        """``convert(payload)`` for a slot whose payload is the user's batch already (a transformed batch):
        the buffers are not exported; on CUDA an event guards the copies ``convert`` queued (consumer side)."""
        payload, slot.payload = slot.payload, None
        try:
            out = convert(payload)
        except BaseException:
            slot.release()
            raise
        if spec.cuda:
            import torch

            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(spec.device))
            slot.event = event
        slot.in_flight = False  # the user's references / the event protect it from here
        return out

    def close(self) -> None:
        """Drop the buffers and the allocator (which may reference the loader's data source)."""
        self._slots = []
        self._allocate = None

    def reclaim(self) -> None:
        """Clear every in-flight mark. Call only when no producer is running."""
        for slot in self._slots:
            slot.release()
