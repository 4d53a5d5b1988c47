"""Pytree reads: rows per second from a .tbl of generic samples, random and sequential order.

Two workloads: 80,000 rows of {int, float, str, bool} and 1,000,000 rows of
{(64,) float32 array, str, int}. Every row read is consumed the same way
(every leaf touched, arrays summed). Subjects: `tbl_format.open(...)[i]` in a
shuffled order and `iter(dataset)` in file order. Ceiling: the same rows as a
Python list of dicts already in RAM (its load time is the setup column).
"""

from __future__ import annotations

import pickle

import numpy as np

from tbl_bench.config import Config, SkipConfig
from tbl_bench.context import BenchContext, DataUnavailable

NAME = "pytree"
TITLE = "Pytree reads"
UNIT = "rows/s"
COMPARE_ON = ("rows", "order")

ORDERS = ("random", "sequential")


def _touch(sample: dict) -> float:
    """The consumer: read every leaf; arrays are summed so their bytes are read."""
    total = 0.0
    for v in sample.values():
        if isinstance(v, np.ndarray):
            total += float(v.sum())
        elif isinstance(v, str | bytes):
            total += len(v)
        else:
            total += float(v)
    return total


class _Rows:
    def __init__(self, rows, order: str, seed: int):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        self.rows, self.order, self.seed = rows, order, seed
        self.items_per_epoch = len(rows)
        self.info = {}

    def run_epoch(self, epoch: int) -> int:
        rows = self.rows
        if self.order == "random":
            for i in np.random.default_rng([self.seed, epoch]).permutation(self.items_per_epoch).tolist():
                _touch(rows[i])
        else:
            for sample in rows:
                _touch(sample)
        return self.items_per_epoch

    def close(self) -> None:
        close = getattr(self.rows, "close", None)
        if close is not None:
            close()
        self.rows = None


def tbl_rows(path: str, order: str, rows: str, seed: int = 0):
    """Workload factory: tbl_format.open(path), rows read by index (random) or iterated (sequential)."""
    try:
        import tbl_format
    except ImportError as e:
        raise SkipConfig(f"tbl_format is not importable: {e}") from e
    return _Rows(tbl_format.open(path), order, seed)


def pickled_rows(path: str, order: str, rows: str, seed: int = 0):
    """Workload factory: the rows unpickled into a list of dicts (the all-in-RAM ceiling)."""
    with open(path, "rb") as f:
        return _Rows(pickle.load(f), order, seed)


def configurations(ctx: BenchContext) -> list[Config]:
    s = ctx.sizes
    common = {"warmup": s.warmup, "epochs": s.epochs, "unit": UNIT}
    configs = []
    for kind in ("scalar", "array"):
        try:
            tbl_path, skip = str(ctx.tbl_rows(kind)), None
        except DataUnavailable as e:
            tbl_path, skip = "", str(e)
        pkl = str(ctx.pickled_rows(kind))
        for order in ORDERS:
            params = {"order": order, "rows": kind}
            configs.append(Config(NAME, f"list/{kind}/{order}", "python-list", "tbl_bench.suites.pytree:pickled_rows",
                                  {"path": pkl, **params}, role="ceiling", **common))
            configs.append(Config(NAME, f"tbl/{kind}/{order}", "tbl", "tbl_bench.suites.pytree:tbl_rows",
                                  {"path": tbl_path, **params}, skip=skip, **common))
    return configs
