"""Pytree batches through a torch DataLoader with 2 spawn workers: TBL's PyTreeDataset against litdata.

Workload: 1,000,000 rows (100,000 in a quick run) of ``{"vec": (64,) float32,
"name": str, "id": int}``, batch 256, shuffled, 2 workers started with
``spawn``, persistent across epochs. Configurations:

===============  ==================================================================
tbl              ``DataLoader(PyTreeDataset(dir), batch_size=256, shuffle=True,
                 collate_fn=collate_identity, ...)``: one ``__getitems__`` call per
                 batch (kernel gather of ``vec`` and ``id``, row reads of ``name``);
                 numpy batches, ``torch.from_numpy`` in the consumer
litdata          baseline, with --peers, in the peer interpreter:
                 ``StreamingDataLoader(StreamingDataset(dir, shuffle=True),
                 batch_size=256, ...)`` (litdata 0.2.76, torch's default collate)
===============  ==================================================================

The consumer sums ``vec`` and counts the names of every batch (the *consume*
level). One warm-up epoch (worker start-up and first touch of the pages; its
time is kept as the round's `warmup_s`), then 2 timed epochs. Memory: the peak
resident memory of the process tree (main process plus workers), split into
anonymous and file-backed pages (a tree sum: pages shared between processes
count once per process).
"""

from __future__ import annotations

import functools

import numpy as np

from tbl_bench.config import Config
from tbl_bench.context import BenchContext, DataUnavailable

NAME = "pytree_dataloader"
TITLE = "PyTreeDataset in a torch DataLoader (2 spawn workers)"
UNIT = "rows/s"
COMPARE_ON = ()

BATCH = 256
WORKERS = 2
PARTS = 8
ROWS = 1_000_000
QUICK_ROWS = 100_000


def sample(i: int) -> dict:
    vec = (np.arange(64, dtype=np.float32) + np.float32(i % 1000)) * np.float32(0.5)
    return {"vec": vec, "name": f"row-{i:09d}", "id": i}


def part_samples(part: int, rows: int):
    """Rows of part ``part`` of ``PARTS`` (module-level: pickled into the writer processes)."""
    per = -(-rows // PARTS)
    return (sample(i) for i in range(part * per, min(rows, (part + 1) * per)))


def write_tbl(dst: str, rows: int) -> None:
    from tbl_format import write_parallel

    write_parallel(functools.partial(part_samples, rows=rows), PARTS, dst, workers=WORKERS, shard_bytes=64 << 20)


def write_litdata(dst: str, rows: int) -> None:
    """Peer preparation: the rows through `litdata.optimize`."""
    import litdata

    litdata.optimize(fn=sample, inputs=list(range(rows)), output_dir=dst, chunk_bytes="64MB",
                     num_workers=WORKERS, verbose=False, mode="overwrite")


def _consume(batch: dict) -> int:
    import torch

    vec = batch["vec"]
    if not isinstance(vec, torch.Tensor):
        vec = torch.from_numpy(vec)  # tbl's batches arrive as fresh writable numpy arrays: zero-copy
    float(vec.sum())
    len(batch["name"])
    return int(batch["id"].shape[0])


class _Epochs:
    def __init__(self, loader, rows: int, info: dict):
        self.loader, self.items_per_epoch, self.info = loader, rows, info

    def run_epoch(self, epoch: int) -> int:
        n = 0
        for batch in self.loader:
            n += _consume(batch)
        return n

    def close(self) -> None:
        self.loader = None  # persistent workers stop when the loader is collected


def tbl_loader_epochs(path: str, rows: int):
    """Workload factory: DataLoader(PyTreeDataset(path)) with 2 spawn workers."""
    from torch.utils.data import DataLoader

    from tbl_loader import PyTreeDataset, collate_identity

    # numpy batches cross the worker pipe pickled (cheaper than torch's per-tensor shared-memory
    # segments); the consumer wraps them with torch.from_numpy.
    loader = DataLoader(PyTreeDataset(path), batch_size=BATCH, shuffle=True, num_workers=WORKERS,
                        collate_fn=collate_identity, multiprocessing_context="spawn", persistent_workers=True)
    return _Epochs(loader, rows, {})


def litdata_loader_epochs(path: str, rows: int):
    """Workload factory: litdata's StreamingDataLoader with 2 spawn workers."""
    import litdata

    ds = litdata.StreamingDataset(input_dir=path, shuffle=True, seed=0)
    loader = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                                         multiprocessing_context="spawn", persistent_workers=True)
    return _Epochs(loader, rows, {"litdata": litdata.__version__})


def configurations(ctx: BenchContext) -> list[Config]:
    rows = QUICK_ROWS if ctx.quick else ROWS
    common = {"warmup": 1, "epochs": 2, "unit": UNIT, "timeout_s": 3600}
    tbl_path = ctx.artifact(f"pytree-dl-{rows}", {"kind": "pytree_dataloader", "rows": rows},
                            lambda p: write_tbl(str(p), rows))
    configs = [Config(NAME, "tbl", "tbl", "tbl_bench.suites.pytree_dataloader:tbl_loader_epochs",
                      {"path": str(tbl_path), "rows": rows}, **common)]
    if ctx.peers:
        try:
            lit_path, skip = str(ctx.peer_artifact(f"pytree-dl-{rows}-litdata", {"kind": "pytree_dataloader",
                                                   "rows": rows}, "tbl_bench.suites.pytree_dataloader:write_litdata",
                                                   {"rows": rows})), None
        except DataUnavailable as e:
            lit_path, skip = "", str(e)
        configs.append(Config(NAME, "litdata", "litdata", "tbl_bench.suites.pytree_dataloader:litdata_loader_epochs",
                              {"path": lit_path, "rows": rows}, role="baseline", peer=True, skip=skip, **common))
    return configs


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """Throughput and peak anonymous memory of the process tree, tbl against litdata."""
    tbl, lit = results.get("tbl"), results.get("litdata")
    if not (tbl and lit):
        return {}
    out = {"throughput tbl / litdata": tbl["throughput"] / lit["throughput"]}
    lit_anon, tbl_anon = (r["rss"]["tree_peak_anon_kb"] for r in (lit, tbl))
    if lit_anon is not None and tbl_anon is not None:  # None where the platform does not split RSS
        out["peak tree anon litdata / tbl"] = lit_anon / max(tbl_anon, 1)
    return out
