"""read_tbl: a TBL dataset (one file or a dataset folder) as a Ray dataset.

One read task per shard file; a shard larger than its share of the rows
(``rows / parallelism``) is split into row ranges, one task each, so small
datasets of one big file still spread over the cluster. Each task opens the
dataset itself (the manifest and the shard's header are checked against
each other as on any open; every node must see the path) and yields blocks
of at most about `BLOCK_BYTES`.

Rows: a dataset whose rows are dicts gives one column per top-level key;
any other row (a list, a tuple, a scalar) is the single column ``"item"``.
Fixed-size numeric and array leaves at the top level are copied out of the
mapped column in one slice (no per-row work); other values go through the
file's row decoder. Ray stores what it is given in Arrow: tuples come back
as lists, nested dicts as structs. Row order within a task is the file's,
and tasks are listed in dataset order (``preserve_order`` keeps it).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from ray.data import Datasource, ReadTask, read_datasource
from ray.data.block import Block, BlockAccessor, BlockMetadata

import tbl_format

__all__ = ["BLOCK_BYTES", "TblDatasource", "read_tbl"]

BLOCK_BYTES = 64 << 20  # rows per output block are sized to about this many bytes
_VAR_ROW_BYTES = 64  # a guess for one variable-size value, only used to size blocks
_COLUMN_KINDS = ("int", "float", "bool", "array", "image")
SINGLE_COLUMN = "item"


class TblDatasource(Datasource):
    """A Ray Data datasource over the TBL dataset at ``path`` (see `read_tbl`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = os.path.abspath(path)  # workers need not share the driver's working directory
        ds = tbl_format.open(self.path)
        try:
            self.schema = ds.schema
            self.rows_per_shard = ds.segment_rows
            self.files = [str(f) for f in ds.files]
        finally:
            ds.close()
        self.row_bytes = sum(leaf.row_bytes if leaf.fixed_size else _VAR_ROW_BYTES
                             for leaf in self.schema.leaves.values())

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(self.rows_per_shard) * self.row_bytes

    def get_name(self) -> str:
        return "ReadTbl"

    def ranges(self, parallelism: int) -> list[tuple[int, int, int]]:
        """(shard, start, stop) of every read task, in dataset order."""
        total = sum(self.rows_per_shard)
        most = max(1, math.ceil(total / max(1, parallelism)))
        out = []
        for k, rows in enumerate(self.rows_per_shard):
            pieces = max(1, math.ceil(rows / most))
            out.extend((k, p * rows // pieces, (p + 1) * rows // pieces) for p in range(pieces) if rows)
        return out

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        block_rows = max(1, BLOCK_BYTES // max(1, self.row_bytes))
        tasks = []
        for k, a, b in self.ranges(parallelism):
            meta = BlockMetadata(num_rows=b - a, size_bytes=(b - a) * self.row_bytes, exec_stats=None,
                                 input_files=[self.files[k]])
            read = functools.partial(_read_range, self.path, k, a, b, block_rows)
            tasks.append(ReadTask(read, meta, per_task_row_limit=per_task_row_limit))
        return tasks


def read_tbl(path: str | os.PathLike[str], *, override_num_blocks: int | None = None, **kwargs: Any) -> Any:
    """The TBL dataset at ``path`` (a ``.tbl`` file or a dataset folder) as a ``ray.data.Dataset``.

    ``override_num_blocks`` and other keyword arguments go to ``ray.data.read_datasource``.
    """
    return read_datasource(TblDatasource(path), override_num_blocks=override_num_blocks, **kwargs)


def _read_range(path: str, k: int, start: int, stop: int, block_rows: int) -> Iterator[Block]:
    ds = tbl_format.open(path)
    try:
        shard = ds.shard(k)
        tree = ds.schema.tree
        for a in range(start, stop, block_rows):
            b = min(stop, a + block_rows)
            yield _block(shard, tree, ds.schema.leaves, a, b)
    finally:
        ds.close()


def _block(shard: Any, tree: Any, leaves: dict[str, tbl_format.Leaf], a: int, b: int) -> Block:
    if not isinstance(tree, dict):
        return BlockAccessor.batch_to_block({SINGLE_COLUMN: _objects(shard.read_range(a, b))})
    batch: dict[str, Any] = {}
    rows: list[Any] | None = None
    for key, node in tree.items():
        leaf = leaves.get(key)
        if isinstance(node, tbl_format.Leaf) and leaf is not None and leaf.fixed_size and not leaf.optional \
                and leaf.kind in _COLUMN_KINDS:
            batch[key] = np.array(shard.column(key)[a:b])  # one copy out of the map; the block outlives it
        else:
            if rows is None:
                rows = shard.read_range(a, b)
            batch[key] = _objects([row[key] for row in rows])
    return BlockAccessor.batch_to_block(batch)


def _objects(values: list[Any]) -> np.ndarray:
    """A 1-D object array of ``values`` (np.array would turn equal-length lists into a 2-D array)."""
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out
