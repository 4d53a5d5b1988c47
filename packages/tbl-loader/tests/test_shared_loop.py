"""shared_loop: the results and the error raised do not depend on the threads or on timing."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tbl_loader.host.shared_loop import shared_loop


class Boom(ValueError):
    def __init__(self, k: int) -> None:
        super().__init__(f"item {k}")
        self.k = k


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_results_are_in_index_order_whichever_thread_made_them(threads):
    ran_on = set()

    def work(k):
        ran_on.add(threading.get_ident())
        time.sleep(random.random() * 1e-4)
        return k * k

    with ThreadPoolExecutor(max(1, threads - 1)) as pool:
        for count in (0, 1, 3, 100):
            assert shared_loop(pool if threads > 1 else None, threads, count, work) == [k * k for k in range(count)]
    assert threading.get_ident() in ran_on  # the calling thread works too
    assert len(ran_on) <= threads


@pytest.mark.parametrize("seed", range(5))
def test_the_smallest_failing_index_is_raised_after_every_smaller_one_ran(seed):
    rng = random.Random(seed)
    failing = set(rng.sample(range(10, 60), 3))
    done = set()

    def work(k):
        time.sleep(rng.random() * 2e-4)
        if k in failing:
            raise Boom(k)
        done.add(k)
        return k

    with ThreadPoolExecutor(3) as pool, pytest.raises(Boom) as info:
        shared_loop(pool, 4, 60, work)
    assert info.value.k == min(failing)
    assert set(range(min(failing))) <= done


def test_more_threads_than_a_pool_is_refused():
    with pytest.raises(ValueError, match="needs a pool"):
        shared_loop(None, 2, 5, lambda k: k)
