import multiprocessing
import threading

import numpy as np
import pytest

import tbl_kernels as tk
from tbl_kernels import reference as ref

IMAGES = np.random.default_rng(1).integers(0, 256, size=(40, 12, 13, 3), dtype=np.uint8)
TABLE = tk.normalization_table([0.4, 0.5, 0.6], [0.2, 0.3, 0.25], "float32")


def _expected(idx):
    return ref.gather_normalize([IMAGES], idx, np.empty((len(idx), 3, 12, 13), np.float32), TABLE)


def test_set_and_get_num_threads():
    before = tk.get_num_threads()
    try:
        for n in (1, 4, 2):
            tk.set_num_threads(n)
            assert tk.get_num_threads() == n
    finally:
        tk.set_num_threads(before)


def test_concurrent_calls_from_python_threads():
    before = tk.get_num_threads()
    tk.set_num_threads(2)
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            idx = rng.integers(0, 40, size=17).astype(np.int64)
            out = np.empty((17, 3, 12, 13), np.float32)
            tk.gather_normalize([IMAGES], idx, out, TABLE)
            if not np.array_equal(out, _expected(idx)):
                errors.append(seed)

    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        tk.set_num_threads(before)
    assert not errors


def _child(q):
    idx = np.arange(40, dtype=np.int64)[::-1].copy()
    out = np.empty((40, 3, 12, 13), np.float32)
    tk.gather_normalize([IMAGES], idx, out, TABLE)
    q.put(bool(np.array_equal(out, _expected(idx))))


def test_pool_works_in_a_forked_child():
    before = tk.get_num_threads()
    tk.set_num_threads(2)
    try:
        tk.gather_normalize(
            [IMAGES], np.arange(4, dtype=np.int64), np.empty((4, 3, 12, 13), np.float32), TABLE
        )
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=_child, args=(q,))
        p.start()
        ok = q.get(timeout=30)
        p.join(timeout=30)
        assert ok and p.exitcode == 0
    finally:
        tk.set_num_threads(before)


def test_thread_counts_outside_the_bound_are_refused_before_any_thread_is_made():
    before = tk.get_num_threads()
    for bad in (0, -1, tk.max_threads() + 1, 100_000):
        with pytest.raises(ValueError, match="outside 1"):
            tk.set_num_threads(bad)
        assert tk.get_num_threads() == before
    with pytest.raises(TypeError):
        tk.set_num_threads(2.0)
    assert tk.max_threads() >= 256
