"""``shared_loop``: run ``work(k)`` for every k of a batch on a few threads that share one counter.

Why not ``ThreadPoolExecutor.map``. Serving JPEG storage decodes a few hundred
small images per batch, each in a few hundred microseconds with the GIL
released. One future per image costs a queue round trip, a lock and a wake-up
per image, and with two threads on two cores that was measured to add about a
third to the CPU time of the decode itself. Here each thread (the calling one
included) takes the next index from one shared counter until the batch is done:
no per-item future, no per-item wake-up, and a thread that is slowed down (a
busy core) simply takes fewer items.

Results and errors do not depend on the threads. ``results[k]`` is
``work(k)``'s value whichever thread made it. When items fail, the error of the
smallest failing k is raised: once an item fails no thread takes a new index,
and every index below a failing one was taken before it (the counter only goes
up), so it has run to its end too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

__all__ = ["shared_loop"]


def shared_loop(pool: Executor | None, threads: int, count: int, work: Callable[[int], Any]) -> list[Any]:
    """``[work(0), ..., work(count - 1)]`` computed by the calling thread and ``threads - 1`` tasks of ``pool``.

    ``pool`` may be None when ``threads`` is 1. Raises the exception of the
    smallest k whose ``work(k)`` raised (after every started item has ended).
    """
    if threads > 1 and pool is None:
        raise ValueError(f"shared_loop needs a pool for {threads} threads")
    results: list[Any] = [None] * count
    failures: list[tuple[int, BaseException]] = []
    # next() on itertools.count runs in C under the GIL: each index goes to exactly one thread
    take = itertools.count().__next__

    def loop() -> None:
        while not failures:
            k = take()
            if k >= count:
                return
            try:
                results[k] = work(k)
            except BaseException as e:  # re-raised below, in the caller, for the smallest k
                failures.append((k, e))
                return

    helpers = [pool.submit(loop) for _ in range(min(threads, count) - 1)] if pool is not None else []
    try:
        loop()
    finally:
        for helper in helpers:
            helper.result()  # loop() catches work()'s errors: this only waits
    if failures:
        raise min(failures, key=lambda failure: failure[0])[1]
    return results
