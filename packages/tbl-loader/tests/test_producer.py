"""The background producer: ordering, bounded prefetch, exception forwarding and prompt shutdown."""

from __future__ import annotations

import threading
import time
import traceback

import pytest

from tbl_loader.errors import ProducerClosedError
from tbl_loader.host.producer import Producer


def _count(n, log=None):
    for i in range(n):
        if log is not None:
            log.append(i)
        yield i


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_items_arrive_in_order(depth):
    p = Producer(lambda: _count(20), depth)
    assert list(p) == list(range(20))
    assert p.joined


def test_depth_bounds_how_far_the_thread_runs_ahead():
    log = []
    p = Producer(lambda: _count(100, log), 3)
    assert next(p) == 0
    # One handed out, three queued, one produced and waiting for room: then the thread blocks.
    end = time.monotonic() + 30
    while len(log) < 5 and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(log) == 5
    assert next(p) == 1
    end = time.monotonic() + 30
    while len(log) < 6 and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.1)
    assert len(log) == 6
    p.close()


def test_depth_zero_runs_in_the_consumer_thread():
    threads = []

    def items():
        threads.append(threading.current_thread())
        yield 1

    before = threading.active_count()
    p = Producer(items, 0)
    assert threading.active_count() == before
    assert list(p) == [1]
    assert threads == [threading.current_thread()]


class _Boom(Exception):
    pass


def _failing():
    yield 1
    raise _Boom("fill failed at item 2")


@pytest.mark.parametrize("depth", [0, 2])
def test_exception_reaches_consumer_as_the_same_object(depth):
    raised = []

    def items():
        try:
            yield from _failing()
        except _Boom as exc:
            raised.append(exc)
            raise

    p = Producer(items, depth)
    assert next(p) == 1
    with pytest.raises(_Boom, match="item 2") as info:
        next(p)
    assert info.value is raised[0]
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_failing" in frames  # the producer-side frames are kept
    assert p.joined
    with pytest.raises(StopIteration):
        next(p)


def test_close_wakes_a_blocked_producer_promptly_and_runs_finally():
    cleaned = threading.Event()

    def items():
        try:
            yield from range(10**9)
        finally:
            cleaned.set()

    base = threading.active_count()
    p = Producer(items, 2)
    next(p)
    time.sleep(0.05)  # the thread is now blocked on a full queue
    t0 = time.perf_counter()
    assert p.close()
    assert time.perf_counter() - t0 < 5.0  # not the 1e9 items it would otherwise produce
    assert cleaned.is_set()
    assert threading.active_count() == base
    with pytest.raises(ProducerClosedError):
        next(p)
    assert p.close()  # idempotent


def test_bad_depth():
    with pytest.raises(ValueError, match="prefetch"):
        Producer(lambda: iter(()), -1)
