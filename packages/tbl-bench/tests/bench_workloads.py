"""Workload factories used by the runner tests (imported by the child interpreter via PYTHONPATH)."""

from __future__ import annotations

import os
import time

import numpy as np

import tbl_bench
from tbl_bench.config import SkipConfig

# Incremented at every factory call: a fresh interpreter per round always sees 1.
CALLS = 0


class _Counter:
    def __init__(self, items: int, alloc_mb: int, sleep_s: float):
        self.items_per_epoch = items
        self.buf = np.ones(alloc_mb << 20, dtype=np.uint8) if alloc_mb else None
        self.sleep_s = sleep_s
        self.info = {"pid": os.getpid(), "calls": CALLS, "events": [], "tbl_bench_file": tbl_bench.__file__,
                     "peer_marker": os.environ.get("TBL_BENCH_TEST_PEER")}

    def prepare_epoch(self, epoch: int) -> None:
        self.info["events"].append(f"prepare {epoch}")

    def run_epoch(self, epoch: int) -> int:
        self.info["events"].append(f"run {epoch}")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.items_per_epoch

    def close(self) -> None:
        self.buf = None


def counter(items: int = 10, alloc_mb: int = 0, sleep_s: float = 0.0):
    global CALLS
    CALLS += 1
    return _Counter(items, alloc_mb, sleep_s)


class _Miscounting(_Counter):
    def run_epoch(self, epoch: int) -> int:
        return self.items_per_epoch + 1


def miscounting():
    return _Miscounting(10, 0, 0.0)


def failing(message: str = "boom"):
    raise RuntimeError(message)


def skipping(reason: str = "not here"):
    raise SkipConfig(reason)


def echo(**kwargs):
    """For `call_in`: returns its arguments and the interpreter's pid."""
    return {"kwargs": kwargs, "pid": os.getpid()}


def _harness_rerun() -> bool:
    """In a pool worker: whether spawn's start-up re-ran the parent's main module.

    multiprocessing aliases ``__mp_main__`` to every process's ``__main__``; only a re-run main module is a
    module of that name.
    """
    import sys

    return sys.modules["__mp_main__"].__name__ == "__mp_main__"


class _PoolProbe(_Counter):
    """Each epoch starts a spawn process pool, as a converter does, and records what its worker found."""

    def run_epoch(self, epoch: int) -> int:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            self.info["worker_reran_main"] = pool.submit(_harness_rerun).result()
        return self.items_per_epoch


def pool_probe():
    return _PoolProbe(1, 0, 0.0)
