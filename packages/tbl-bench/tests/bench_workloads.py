"""Workload factories used by the runner tests (imported by the child interpreter via PYTHONPATH)."""

from __future__ import annotations

import os

import numpy as np

from tbl_bench.harness import SkipConfig

# Incremented at every factory call: a fresh interpreter per configuration always sees 1.
CALLS = 0


class _Counter:
    def __init__(self, items: int, alloc_mb: int):
        self.items_per_epoch = items
        self.buf = np.ones(alloc_mb << 20, dtype=np.uint8) if alloc_mb else None
        self.info = {"pid": os.getpid(), "calls": CALLS}
        self.epochs_seen = []

    def run_epoch(self, epoch: int) -> int:
        self.epochs_seen.append(epoch)
        self.info["epochs_seen"] = list(self.epochs_seen)
        return self.items_per_epoch

    def close(self) -> None:
        self.buf = None


def counter(items: int = 10, alloc_mb: int = 0):
    global CALLS
    CALLS += 1
    return _Counter(items, alloc_mb)


def failing(message: str = "boom"):
    raise RuntimeError(message)


def skipping(reason: str = "not here"):
    raise SkipConfig(reason)
