"""Buffer liveness (reference counts through views, slices and tensors) and the ring's reuse rules."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

from tbl_loader.errors import RingGrowthWarning
from tbl_loader.host.output import OutputSpec, allocate_host
from tbl_loader.host.ring import Ring

NUMPY = OutputSpec.create("numpy")


def test_numpy_views_and_slices_keep_the_buffer_in_use():
    buf = allocate_host((4, 3, 2), "float32", NUMPY)
    assert not buf.in_use()
    full = buf.export(4, NUMPY)
    assert buf.in_use()
    strided = full[:, ::2]
    part = full[1:3]
    del full
    assert buf.in_use()
    flat = part.reshape(-1)  # a view: part is contiguous
    assert np.shares_memory(flat, buf.root)
    del part
    assert buf.in_use()
    del strided
    assert buf.in_use()
    mv = memoryview(flat)
    del flat
    assert buf.in_use()
    del mv
    gc.collect()
    assert not buf.in_use()
    prefix = buf.export(2, NUMPY)
    assert prefix.shape == (2, 3, 2) and buf.in_use()
    copy = prefix.copy()
    del prefix
    assert not buf.in_use() and copy.shape == (2, 3, 2)


def test_numpy_bfloat16_export_is_uint16_bits():
    buf = allocate_host((2, 2), "bfloat16", NUMPY)
    buf.kernel[...] = 0x3F80
    out = buf.export(2, NUMPY)
    assert out.dtype == np.uint16 and (out == 0x3F80).all()
    assert buf.in_use()
    del out
    assert not buf.in_use()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8", "int64"])
def test_torch_tensors_views_and_slices_keep_the_buffer_in_use(dtype):
    torch = pytest.importorskip("torch")
    spec = OutputSpec.create("torch")
    buf = allocate_host((4, 6), dtype, spec)
    t = buf.export(4, spec)
    assert isinstance(t, torch.Tensor)
    assert t.dtype == {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                       "uint8": torch.uint8, "int64": torch.int64}[dtype]
    assert buf.in_use()
    derived = [t[1:3], t[:, ::2], t.view(-1), t.reshape(2, 12), t.T, t.unsqueeze(0), t[0]]
    del t
    assert buf.in_use()
    while derived:
        derived.pop()  # tensors hold no cycles: reference counting frees them at once
        assert buf.in_use() == bool(derived)
    t = buf.export(3, spec)
    c = t.clone()
    n = t.numpy() if dtype != "bfloat16" else t.view(torch.int16).numpy()
    del t
    assert buf.in_use()  # the numpy view of the tensor still shares the memory
    del n
    gc.collect()
    assert not buf.in_use() and c.shape == (3, 6)


def _slot_ids(ring):
    return [id(s) for s in ring.slots]


def test_ring_never_hands_out_a_held_slot():
    ring = Ring(lambda: {"x": allocate_host((2,), "uint8", NUMPY)}, size=2)
    a = ring.acquire()
    a_out = ring.publish(a, 2, NUMPY)[0]["x"]
    b = ring.acquire()
    assert b is not a
    b_out = ring.publish(b, 2, NUMPY)[0]["x"]
    c = ring.acquire()  # both held: a new slot, never a reused one
    assert c is not a and c is not b and len(ring) == 3
    ring.publish(c, 2, NUMPY)
    del a_out
    d = ring.acquire()
    assert d is a
    assert b_out is not None


def test_in_flight_slots_are_not_reused_until_reclaimed():
    ring = Ring(lambda: {"x": allocate_host((2,), "uint8", NUMPY)}, size=2)
    a = ring.acquire()
    b = ring.acquire()
    assert a is not b and a.in_flight and b.in_flight
    c = ring.acquire()
    assert c not in (a, b)
    ring.reclaim()
    assert not a.in_flight and not b.in_flight and not c.in_flight


def test_ring_growth_warns_once_and_shrinks_back_after_release():
    ring = Ring(lambda: {"x": allocate_host((1000,), "uint8", NUMPY)}, size=2, warn_slots=4)
    kept = []
    with pytest.warns(RingGrowthWarning, match="still referenced"):
        for _ in range(6):
            kept.append(ring.publish(ring.acquire(), 1000, NUMPY)[0]["x"])
    assert len(ring) == 6 and ring.allocations == 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        kept.append(ring.publish(ring.acquire(), 1000, NUMPY)[0]["x"])
    kept.clear()
    ring.publish(ring.acquire(), 1000, NUMPY)
    assert len(ring) == 2  # released extra slots are dropped


class _FakeEvent:
    def __init__(self):
        self.done = False
        self.synchronized = False

    def query(self):
        return self.done

    def synchronize(self):
        self.synchronized = True
        self.done = True


def test_pending_copy_blocks_reuse_and_is_waited_for_before_growing():
    ring = Ring(lambda: {"x": allocate_host((2,), "uint8", NUMPY)}, size=2)
    a, b = ring.acquire(), ring.acquire()
    for s in (a, b):
        ring.publish(s, 2, NUMPY)  # result dropped: only the events hold them
    a.event, b.event = _FakeEvent(), _FakeEvent()
    b.event.done = True
    assert ring.acquire() is b  # the finished one first
    ring.publish(b, 2, NUMPY)
    b.event = _FakeEvent()
    ev_a = a.event
    c = ring.acquire()  # nothing free: waits on the next pending copy rather than allocating
    assert c is a and ev_a.synchronized and len(ring) == 2
    assert c.event is None and c.in_flight


def test_row_view_buffers_track_liveness_too():
    buf = allocate_host((5,), "int64", NUMPY, as_rows=True)
    assert buf.kernel.shape == (5, 8) and buf.kernel.dtype == np.uint8
    assert np.shares_memory(buf.kernel, buf.root)
    assert not buf.in_use()
    out = buf.export(3, NUMPY)
    assert out.dtype == np.int64 and buf.in_use()
    del out
    assert not buf.in_use()


def test_payload_travels_with_its_slot_and_is_handed_over():
    ring = Ring(lambda: {"x": allocate_host((2,), "uint8", NUMPY)}, size=1)
    slot = ring.acquire()
    slot.payload = ["a", "b"]
    out, payload = ring.publish(slot, 2, NUMPY)
    assert payload == ["a", "b"]
    assert slot.payload is None  # the ring keeps no reference to what the user now holds
    del out
    again = ring.acquire()
    assert again is slot and again.payload is None


def test_released_slot_drops_its_payload():
    ring = Ring(lambda: {"x": allocate_host((2,), "uint8", NUMPY)}, size=1)
    slot = ring.acquire()
    slot.payload = object()
    slot.release()
    assert slot.payload is None and not slot.held()
