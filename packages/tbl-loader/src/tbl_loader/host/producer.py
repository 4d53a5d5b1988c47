"""Run an iterator ahead of its consumer on a background thread, through a bounded queue.

``Producer(make_items, depth)`` pulls ``make_items()`` on a daemon thread and keeps
at most ``depth`` finished items waiting; ``depth=0`` runs the iterator in the
consumer's thread instead (no thread at all). The rules loaders rely on:

* An exception raised by the iterator reaches the consumer as the same exception
  object (original type and traceback, with the consumer's frames appended).
* ``close()`` stops the thread promptly: a blocked ``put`` wakes at once, the
  iterator is closed (its ``finally`` blocks run) and the thread is joined.
* The thread references only ``make_items`` and the queue. Give it a callable
  that does not reference the loader, so that the loader can be garbage
  collected; the loader's finalizer then calls ``close()``.
* At interpreter exit every live producer is closed and joined (``atexit``)
  before modules are torn down; the thread is a daemon so that a producer stuck
  in a long call cannot hold the process open.
"""

from __future__ import annotations

import atexit
import os
import sys
import sysconfig
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from ..errors import ProducerClosedError

__all__ = ["Producer"]

T = TypeVar("T")

JOIN_TIMEOUT_S = 30.0
"""How long close() waits for the thread to finish the item in progress."""


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class _Channel:
    """A bounded FIFO whose blocked put/get wake immediately when it is stopped."""

    def __init__(self, depth: int) -> None:
        self._items: deque[Any] = deque()
        self._depth = depth
        self._cond = threading.Condition(threading.Lock())
        self._stopped = False

    def put(self, item: Any, *, force: bool = False) -> bool:
        """Append ``item`` once there is room; False if the channel was stopped meanwhile."""
        with self._cond:
            while not force and len(self._items) >= self._depth and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return False
            self._items.append(item)
            self._cond.notify_all()
            return True

    def get(self) -> Any:
        with self._cond:
            while not self._items and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return _END
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def stop(self) -> None:
        """Stop the channel, dropping what was still queued, and wake every waiter."""
        with self._cond:
            self._stopped = True
            self._items.clear()
            self._cond.notify_all()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def __len__(self) -> int:
        return len(self._items)  # read without the lock: a gauge, not a decision


def _run(make_items: Callable[[], Iterator[Any]], channel: _Channel) -> None:
    """Thread body. Holds no reference to the producer object (it may be collected)."""
    items: Iterator[Any] | None = None
    try:
        items = make_items()
        for item in items:
            if not channel.put(item):
                return
        channel.put(_END, force=True)
    except BaseException as exc:  # forwarded to the consumer, re-raised there
        channel.put(_Failure(exc), force=True)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            try:
                close()
            except Exception:  # the consumer already has the real outcome
                pass


_live: weakref.WeakSet[Producer[Any]] = weakref.WeakSet()


@atexit.register
def _close_all_at_exit() -> None:
    for producer in list(_live):
        producer.close()


class Producer(Generic[T]):
    """Iterator over ``make_items()``, produced ``depth`` items ahead on a thread.

    Items produced but never handed to the consumer are dropped by ``close()``;
    a caller whose items hold resources (ring slots) reclaims them once ``close()``
    has returned True, when nothing can be producing any more.
    """

    def __init__(
        self,
        make_items: Callable[[], Iterator[T]],
        depth: int,
        *,
        name: str = "tbl-producer",
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
            raise ValueError(f"prefetch depth must be an int >= 0, got {depth!r}")
        self.depth = depth
        self._closed = False
        self._done = False
        self._thread: threading.Thread | None = None
        self._sync: Iterator[T] | None = None
        self._channel: _Channel | None = None
        if depth == 0:
            self._sync = make_items()
        else:
            self._channel = _Channel(depth)
            self._thread = threading.Thread(target=_run, args=(make_items, self._channel), name=name, daemon=True)
            _live.add(self)
            self._thread.start()

    def __iter__(self) -> Producer[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        if self._closed:
            raise ProducerClosedError("this producer was closed")
        if self._sync is not None:
            try:
                return next(self._sync)
            except StopIteration:
                self._done = True
                raise
        item = self._channel.get()
        if item is _END:
            self._done = True
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            self.close()
            raise item.error
        return item

    @property
    def queued(self) -> int:
        """Items produced and waiting for the consumer (0 without a thread)."""
        return 0 if self._channel is None else len(self._channel)

    @property
    def on_producer_thread(self) -> bool:
        """True when called from this producer's own thread (e.g. a finalizer run by the collector there)."""
        return self._thread is threading.current_thread()

    def stuck_at(self) -> str:
        """Where the producer thread is now, innermost first, up to the first frame outside Python's own
        library (the user's transform or the source call that blocks): ``"wait (threading.py:359) <-
        my_transform (train.py:12)"``; ``""`` when no thread runs."""
        thread = self._thread
        frame = None if thread is None or thread.ident is None else sys._current_frames().get(thread.ident)
        stdlib = sysconfig.get_paths()["stdlib"]
        parts = []
        while frame is not None:
            code = frame.f_code
            parts.append(f"{code.co_name} ({os.path.basename(code.co_filename)}:{frame.f_lineno})")
            if not code.co_filename.startswith(stdlib):
                break
            frame = frame.f_back
        return " <- ".join(parts)

    @property
    def joined(self) -> bool:
        """True when no thread of this producer is running (always True with depth 0)."""
        return self._thread is None or not self._thread.is_alive()

    def close(self) -> bool:
        """Stop producing, discard queued items, join the thread. Idempotent.

        Returns True when the thread has stopped (False only if the item in progress
        outlasted ``JOIN_TIMEOUT_S``). Safe to call from any thread, including from
        a finalizer that the garbage collector happens to run on the producer thread.
        """
        if self._closed:
            return self.joined
        self._closed = True
        if self._sync is not None:
            close = getattr(self._sync, "close", None)
            self._sync = None
            if close is not None:
                close()
            return True
        self._channel.stop()
        thread = self._thread
        if thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT_S)
        _live.discard(self)
        return not thread.is_alive()
