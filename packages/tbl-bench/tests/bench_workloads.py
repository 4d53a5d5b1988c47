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
