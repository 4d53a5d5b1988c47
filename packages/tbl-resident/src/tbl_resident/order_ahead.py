"""The next epoch's sample ids and flip draws, computed on a background thread while this epoch is served.

A pass needs its rank's sample ids (a hash and a stable argsort of the whole
epoch: about 0.1 s per million samples) and the flip draws, computed on the CPU
by :mod:`tbl_loader.stream.order`. When the device serves a million images a second,
an epoch lasts about as long as that, so the loader computes epoch ``e + 1``'s
order while epoch ``e`` is being served. Numpy releases the GIL in the hash and
the sort, so the work overlaps with the serving loop. The values are the same
pure functions of ``(seed, epoch, sample_id)`` whichever thread computes them.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from tbl_loader.stream import EpochOrder, order

__all__ = ["OrderAhead", "pass_order"]

_MAX_EPOCH = (1 << 64) - 1
_THREAD_PREFIX = "tbl-resident-order"


def pass_order(plan_order: EpochOrder, seed: int, hflip: float,
               rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """This rank's sample ids for the rest of the epoch and their flip draws (None without flips).

    ``rows``: the loader's subset (``StreamCursor.rows``): the order's positions are mapped to these rows."""
    ids = plan_order.indices if rows is None else np.ascontiguousarray(rows[plan_order.indices])
    flips = order.flip_draws(seed, plan_order.epoch, ids, hflip) if hflip > 0.0 else None
    return ids, flips


class OrderAhead:
    """``get(order)`` returns :func:`pass_order` and starts computing the next epoch's in the background.

    Holds at most one pending result. ``close()`` cancels it and joins the
    thread; the thread holds no device memory and no reference to the loader.
    """

    def __init__(self, seed: int, hflip: float, rows: np.ndarray | None = None) -> None:
        self.seed = seed
        self.hflip = hflip
        self.rows = rows
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[EpochOrder, Future] | None = None
        self._closed = False

    def get(self, plan_order: EpochOrder) -> tuple[np.ndarray, np.ndarray | None]:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == plan_order:
            result = pending[1].result()
        else:
            if pending is not None:
                pending[1].cancel()
            result = pass_order(plan_order, self.seed, self.hflip, self.rows)
        if not self._closed and plan_order.epoch < _MAX_EPOCH:
            following = dataclasses.replace(plan_order, epoch=plan_order.epoch + 1, start=0)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=_THREAD_PREFIX)
            self._pending = (following, self._pool.submit(pass_order, following, self.seed, self.hflip,
                                                              self.rows))
        return result

    def close(self) -> None:
        self._closed = True
        self._pending = None
        if self._pool is not None:
            # The garbage collector may run the loader's finalizer on an order thread itself,
            # which cannot join itself: there the thread is left to finish its (short) task.
            on_worker = threading.current_thread().name.startswith(_THREAD_PREFIX)
            self._pool.shutdown(wait=not on_worker, cancel_futures=True)
            self._pool = None
