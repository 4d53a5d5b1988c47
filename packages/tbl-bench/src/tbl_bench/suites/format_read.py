"""Pytree row reads from tbl_format: in-order iteration and random ds[i], against litdata on the same rows.

Rows: 80,000 dicts {"i": int, "f": float, "s": str, "b": bool}, written once
with `tbl_format.write` (and, with --peers, with `litdata.optimize` in the peer
interpreter). One warm-up epoch, then 5 timed epochs (2 in a quick run). Two
consumption levels: *produce* (the row is fetched and dropped) and *consume*
(every leaf is read: ints and floats summed, string lengths added). Random
order is one permutation per epoch, drawn untimed (litdata reads the first
2,000 of it per epoch: its ds[i] is slow enough that all 80,000 would take
hours; the rate is what is compared).

Targets (produce): in order >= 400,000 rows/s, random >= 300,000 rows/s.

Baseline: litdata 0.2.76 `StreamingDataset` (iteration and `ds[i]`, in the main
process, no DataLoader workers, like tbl_format here). Ceiling: the same rows as
a Python list of dicts in RAM. The module imports only the standard library at
top level: the peer interpreter runs it.
"""

from __future__ import annotations

import random

from tbl_bench.config import Config
from tbl_bench.context import BenchContext, DataUnavailable

NAME = "format_read"
TITLE = "tbl_format row reads"
UNIT = "rows/s"
COMPARE_ON = ("order", "level")

ROWS = 80_000
QUICK_ROWS = 20_000
TARGETS = {"sequential": 400_000, "random": 300_000}
ORDERS = ("sequential", "random")
LEVELS = ("produce", "consume")
LITDATA_RANDOM_READS = 2_000


def make_row(i: int) -> dict:
    """Row i of the benchmark dataset (module level so that litdata's worker processes can pickle it)."""
    return {"i": i, "f": i * 0.25, "s": f"item-{i:06d}", "b": i % 3 == 0}


def _consume(row: dict) -> float:
    return row["i"] + row["f"] + len(row["s"]) + row["b"]


def write_tbl(dst: str, rows: int) -> None:
    import tbl_format

    tbl_format.write((make_row(i) for i in range(rows)), dst)


def write_litdata(dst: str, rows: int) -> None:
    """Peer preparation: the rows through `litdata.optimize`."""
    import litdata

    litdata.optimize(fn=make_row, inputs=list(range(rows)), output_dir=dst, chunk_bytes="64MB",
                     num_workers=1, mode="overwrite")


class _Reads:
    """Epochs of reading rows in order, or the first `limit` of a fresh permutation of them."""

    def __init__(self, ds, rows: int, order: str, level: str, limit: int):
        if order not in ORDERS or level not in LEVELS:
            raise ValueError(f"order must be one of {ORDERS} and level one of {LEVELS}, got {order!r}, {level!r}")
        if ds[rows - 1] != make_row(rows - 1) or ds[0] != make_row(0):
            raise RuntimeError(f"the dataset does not return the rows that were written: {ds[0]!r}")
        self.ds, self.rows, self.order, self.level, self.limit = ds, rows, order, level, limit
        self.items_per_epoch = rows if order == "sequential" else min(rows, limit)
        self.perm: list[int] | None = None
        self.info = {}

    def prepare_epoch(self, epoch: int) -> None:
        if self.order == "random":
            perm = list(range(self.rows))
            random.Random(1000 + epoch).shuffle(perm)
            self.perm = perm[: self.limit]

    def run_epoch(self, epoch: int) -> int:
        ds, perm, count = self.ds, self.perm, 0
        if self.level == "produce":
            if perm is None:
                for _row in ds:
                    count += 1
            else:
                get = ds.__getitem__
                for i in perm:
                    get(i)
                    count += 1
        else:
            acc = 0.0
            if perm is None:
                for row in ds:
                    acc += _consume(row)
                    count += 1
            else:
                get = ds.__getitem__
                for i in perm:
                    acc += _consume(get(i))
                    count += 1
        return count

    def close(self) -> None:
        self.ds = None


def read_rows(tool: str, path: str, rows: int, order: str, level: str, limit: int):
    """Workload factory: rows read from tbl_format ("tbl_format"), litdata ("litdata") or a list ("list")."""
    if tool == "tbl_format":
        import tbl_format

        ds = tbl_format.open(path)
    elif tool == "litdata":
        import litdata

        ds = litdata.StreamingDataset(path)
    elif tool == "list":
        ds = [make_row(i) for i in range(rows)]
    else:
        raise ValueError(f"unknown tool {tool!r}")
    return _Reads(ds, rows, order, level, limit)


def configurations(ctx: BenchContext) -> list[Config]:
    rows = QUICK_ROWS if ctx.quick else ROWS
    epochs = 2 if ctx.quick else 5
    tbl_path = ctx.artifact(f"read-rows-{rows}.tbl", {"kind": "format_read", "rows": rows},
                            lambda p: write_tbl(str(p), rows))
    lit_path, lit_skip = "", None
    if ctx.peers:
        try:
            lit_path = str(ctx.peer_artifact(f"read-rows-{rows}-litdata", {"kind": "format_read", "rows": rows},
                                             "tbl_bench.suites.format_read:write_litdata", {"rows": rows}))
        except DataUnavailable as e:
            lit_skip = str(e)
    common = {"warmup": 1, "epochs": epochs, "unit": UNIT, "rss": False, "preimport": [], "timeout_s": 1800}
    configs = []
    for order in ORDERS:
        for level in LEVELS:
            params = {"rows": rows, "order": order, "level": level, "limit": rows}
            target = "tbl_bench.suites.format_read:read_rows"
            configs.append(Config(NAME, f"tbl_format/{order}/{level}", "tbl_format", target,
                                  {**params, "tool": "tbl_format", "path": str(tbl_path)}, **common))
            configs.append(Config(NAME, f"list/{order}/{level}", "list", target,
                                  {**params, "tool": "list", "path": ""}, role="ceiling", **common))
            if ctx.peers:
                configs.append(Config(NAME, f"litdata/{order}/{level}", "litdata", target,
                                      {**params, "tool": "litdata", "path": lit_path, "limit": LITDATA_RANDOM_READS},
                                      role="baseline", peer=True, skip=lit_skip, **common))
    return configs
