"""Pytree reads in one process: TBL's PyTreeDataset against litdata's StreamingDataset on the same rows.

Workload: 80,000 rows (20,000 in a quick run) of ``{"id": int, "score": float,
"name": str, "flag": bool}`` in one .tbl file. Configurations:

=================  ==========================================================
tbl/iter           ``for row in PyTreeDataset(path)`` (file order)
tbl/item           ``ds[i]`` over a random permutation of every row
tbl/batch-fixed    ``get_batch`` of 256 random rows, fixed-size leaves
                   (``fields=["id", "score", "flag"]``)
tbl/batch-all      ``get_batch`` of 256 random rows, every leaf (str included)
ram/take-fixed     ceiling: ``np.take`` of the same three columns held in RAM
litdata/iter       baseline: ``for row in StreamingDataset(dir)`` (litdata 0.2.76, file order)
litdata/item       baseline: ``StreamingDataset[i]`` over 2,000 random rows per epoch
=================  ==========================================================

Every configuration fetches rows and does nothing else with them (the
*produce* level). One warm-up epoch, then at least 5 timed epochs (2 in a
quick run) and as many more as fill one second; drawing each epoch's random
indices is not timed. litdata runs with --peers, in the peer interpreter. The
module imports only the standard library and numpy at top level.
"""

from __future__ import annotations

import numpy as np

from tbl_bench.config import Config
from tbl_bench.context import BenchContext, DataUnavailable

NAME = "pytree_read"
TITLE = "PyTreeDataset reads"
UNIT = "rows/s"
COMPARE_ON = ("op",)

BATCH = 256
ROWS = 80_000
QUICK_ROWS = 20_000
TBL_OPS = ("iter", "item", "batch-fixed", "batch-all")
LITDATA_OPS = ("iter", "item")
LITDATA_ITEM_ROWS = 2_000  # litdata's random access is slow: time a fixed subset per epoch
MIN_TIMED_S = 1.0
MAX_EPOCHS = 200
FIXED_LEAVES = ["id", "score", "flag"]


def sample(i: int) -> dict:
    return {"id": i, "score": i * 0.25, "name": f"sample-{i:08d}", "flag": i % 3 == 0}


def write_tbl(dst: str, rows: int) -> None:
    from tbl_format import write

    write((sample(i) for i in range(rows)), dst)


def write_litdata(dst: str, rows: int) -> None:
    """Peer preparation: the rows through `litdata.optimize`."""
    import litdata

    litdata.optimize(fn=sample, inputs=list(range(rows)), output_dir=dst, chunk_bytes="64MB", num_workers=1,
                     verbose=False, mode="overwrite")


def _batches(rows: int, epoch: int, batch: int = BATCH) -> list[np.ndarray]:
    perm = np.random.default_rng(epoch).permutation(rows)
    return [perm[a : a + batch] for a in range(0, rows, batch)]


class _Reads:
    """One epoch of `op`; random indices are drawn in prepare_epoch (untimed)."""

    def __init__(self, ds, op: str, rows: int, item_rows: int, batch: int = BATCH):
        self.ds, self.op, self.rows, self.item_rows, self.batch = ds, op, rows, item_rows, batch
        self.items_per_epoch = item_rows if op == "item" else rows
        self.indices = None
        self.info = {}

    def prepare_epoch(self, epoch: int) -> None:
        if self.op == "item":
            self.indices = np.random.default_rng(epoch).permutation(self.rows)[: self.item_rows].tolist()
        elif self.op != "iter":
            self.indices = _batches(self.rows, epoch, self.batch)

    def run_epoch(self, epoch: int) -> int:
        ds = self.ds
        if self.op == "iter":
            n = 0
            for _ in ds:
                n += 1
            return n
        if self.op == "item":
            for i in self.indices:
                ds[i]
            return len(self.indices)
        if self.op == "take-fixed":
            for b in self.indices:
                for c in ds:
                    c.take(b)
            return self.rows
        get_batch = ds.get_batch
        for b in self.indices:
            get_batch(b)
        return self.rows

    def close(self) -> None:
        self.ds = None


def tbl_reads(path: str, op: str, rows: int):
    """Workload factory: PyTreeDataset(path) read by `op` (iter, item, batch-fixed, batch-all)."""
    from tbl_loader import PyTreeDataset

    if op not in TBL_OPS:
        raise ValueError(f"op must be one of {TBL_OPS}, got {op!r}")
    ds = PyTreeDataset(path, fields=FIXED_LEAVES if op == "batch-fixed" else None)
    return _Reads(ds, op, rows, rows)


def user_reads(path: str, op: str, batch_size: int = BATCH):
    """Workload factory: PyTreeDataset over the user's .tbl, every row per epoch, by `op` (iter, item, batch-all)."""
    from tbl_loader import PyTreeDataset

    if op not in ("iter", "item", "batch-all"):
        raise ValueError(f"op must be iter, item or batch-all on a user's dataset, got {op!r}")
    ds = PyTreeDataset(path)
    rows = len(ds)
    return _Reads(ds, op, rows, rows, batch_size)


def ram_take(rows: int, op: str = "batch-fixed"):
    """Workload factory (ceiling): np.take of the three fixed-size columns held in RAM."""
    cols = [np.arange(rows, dtype=np.int64), np.arange(rows) * 0.25, np.arange(rows) % 3 == 0]
    return _Reads(cols, "take-fixed", rows, rows)


def litdata_reads(path: str, op: str, rows: int):
    """Workload factory: litdata.StreamingDataset(path), iterated or read at 2,000 random rows per epoch."""
    import litdata

    if op not in LITDATA_OPS:
        raise ValueError(f"op must be one of {LITDATA_OPS}, got {op!r}")
    reads = _Reads(litdata.StreamingDataset(input_dir=path, shuffle=False), op, rows, min(rows, LITDATA_ITEM_ROWS))
    reads.info["litdata"] = litdata.__version__
    return reads


def configurations(ctx: BenchContext) -> list[Config]:
    rows = QUICK_ROWS if ctx.quick else ROWS
    common = {"warmup": 1, "epochs": 2 if ctx.quick else 5, "min_time_s": MIN_TIMED_S, "max_epochs": MAX_EPOCHS,
              "unit": UNIT, "rss": False, "preimport": ["numpy"]}
    tbl_path = ctx.artifact(f"pytree-read-{rows}.tbl", {"kind": "pytree_read", "rows": rows},
                            lambda p: write_tbl(str(p), rows))
    configs = [Config(NAME, f"tbl/{op}", "tbl", "tbl_bench.suites.pytree_read:tbl_reads",
                      {"path": str(tbl_path), "op": op, "rows": rows}, **common) for op in TBL_OPS]
    configs.append(Config(NAME, "ram/take-fixed", "numpy", "tbl_bench.suites.pytree_read:ram_take",
                          {"rows": rows, "op": "batch-fixed"}, role="ceiling", **common))
    if ctx.peers:
        try:
            lit_path, skip = str(ctx.peer_artifact(f"pytree-read-{rows}-litdata", {"kind": "pytree_read",
                                                   "rows": rows}, "tbl_bench.suites.pytree_read:write_litdata",
                                                   {"rows": rows})), None
        except DataUnavailable as e:
            lit_path, skip = "", str(e)
        configs += [Config(NAME, f"litdata/{op}", "litdata", "tbl_bench.suites.pytree_read:litdata_reads",
                           {"path": lit_path, "op": op, "rows": rows}, role="baseline", peer=True, skip=skip,
                           **common) for op in LITDATA_OPS]
    return configs
