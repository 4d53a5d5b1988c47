"""TblDatasink: a Ray Data datasink that writes a TBL dataset folder.

Protocol (Ray Data's `Datasink`):

- ``on_write_start`` (driver, once, before any write task): the destination
  is checked (a new folder, or an empty one, never an existing dataset) and
  the staging folder is created (`staging.LocalStaging`).
- ``write`` (a worker, once per write task): the task's rows go through
  `tbl_format.Writer` into its own part in the staging folder, as shards of
  at most ``shard_rows`` rows (one shard per task without ``shard_rows``);
  no row passes through the driver. The task returns the part's path and row
  count.
- ``on_write_complete`` (driver, once, after every write task succeeded):
  the parts are published in write-task order (Ray Data's ``task_idx``) as
  one dataset: shard files hard-linked into the destination, the manifest
  written last. The staging folder is then removed.
- ``on_write_failed`` (driver): the staging folder is removed; nothing was
  published.

Retries: Ray Data retries a write task whose worker died. Each attempt
writes a part of its own; only the part named by the result the driver
received is published, and the staging folder (with any part of a failed or
superseded attempt) is removed in the end, so a retry never duplicates rows
and a failed job leaves neither a manifest nor shards. Only a driver killed
outright, or interrupted (Ray calls ``on_write_failed`` for an Exception,
not for a KeyboardInterrupt), leaves its clearly named
``.<name>.tbl-tmp-ray-*`` staging folder.
Every part's files carry a distinct ``file_id`` (``task<task_idx>``), so
tasks that wrote equal rows still have distinct shard checksums.

Rows and order: a row is what Ray Data's ``iter_rows`` gives (a dict of
column name to value: ints, floats, bools, str, bytes, numpy arrays, nested
dicts and lists; Ray has no tuples). Rows are published in ``task_idx``
order, each task's rows in the order it received them; that is the
dataset's order when ``DataContext.execution_options.preserve_order`` is
True (otherwise Ray Data hands blocks to write tasks as they finish).
``schema`` (a `tbl_format.Schema`, or its tree of `tbl_format.Leaf`) is
every part's schema; without it each part infers its own and publishing
refuses parts whose schemas differ (`tbl_format.SchemaMismatchError`): give
``schema`` when rows may differ in shape between blocks.

The destination must be a filesystem path every node of the cluster sees (a
local path on a one-machine cluster); the staging module is the one place a
remote storage backend would slot in.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from ray.data import Datasink
from ray.data.block import Block, BlockAccessor

import tbl_format

from ..errors import OrderError
from .staging import LocalStaging

__all__ = ["TblDatasink"]

# Without shard_rows each write task's rows make one shard: a row limit no task reaches.
ONE_SHARD_ROWS = 1 << 62


class TblDatasink(Datasink):
    """Write a Ray dataset as the TBL dataset folder ``path``: ``ds.write_datasink(TblDatasink(path, ...))``.

    ``shard_rows``: rows per shard file (a task's last shard may hold fewer;
    shards do not span write tasks); None: one shard per write task.
    ``schema``: the schema of every row (a `tbl_format.Schema` or a tree of
    `tbl_format.Leaf`), or None to infer it. ``metadata``: the dataset's
    metadata (JSON). ``compression``: None, ``"lz4"`` or ``"zstd"``
    (variable-size leaves). After the write, `result` holds ``{"path", "rows", "parts"}``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        shard_rows: int | None = None,
        schema: tbl_format.Schema | Any | None = None,
        metadata: dict[str, Any] | None = None,
        compression: str | None = None,
    ) -> None:
        if shard_rows is not None and (isinstance(shard_rows, bool) or not isinstance(shard_rows, int)
                                       or shard_rows < 1):
            raise ValueError(f"shard_rows must be a positive int or None, got {shard_rows!r}")
        if compression not in (None, "lz4", "zstd"):
            raise ValueError(f"compression must be None, 'lz4' or 'zstd', got {compression!r}")
        self.staging = LocalStaging(path)
        self.path = self.staging.dst
        self.shard_rows = shard_rows
        self.schema = schema if schema is None or isinstance(schema, tbl_format.Schema) else tbl_format.Schema(schema)
        self.metadata = dict(metadata or {})
        self.compression = compression
        self.result: dict[str, Any] | None = None
        # Refused here too, before Ray plans anything: the same check runs again in on_write_start.
        self.staging.check()

    # ------------------------------------------------------------------ driver
    def on_write_start(self, schema: Any = None) -> None:
        self.staging.start()

    def on_write_complete(self, write_result: Any) -> None:
        try:
            returns = sorted(write_result.write_returns, key=self._order_key)
            tasks = [r["task"] for r in returns]
            if len(set(tasks)) != len(tasks):
                raise OrderError(f"{self.path}: a write task reported twice ({sorted(tasks)}); nothing was published")
            self._check_results(returns)
            parts = [r["part"] for r in returns if r["part"] is not None]
            if parts:
                self.staging.publish(parts)
            elif self.schema is not None:
                self.staging.publish_empty(self.schema, self.metadata)
            else:
                raise ValueError(f"{self.path}: no rows were written and no schema was given: nothing defines the "
                                 "dataset's schema")
        finally:
            self.staging.discard()
        self.result = {"path": str(self.path), "rows": sum(r["rows"] for r in returns), "parts": len(parts)}

    def on_write_failed(self, error: Exception) -> None:
        self.staging.discard()

    def _order_key(self, ret: dict[str, Any]) -> Any:
        """Where a task's part goes in the dataset: by write-task index."""
        return ret["task"]

    def _check_results(self, returns: list[dict[str, Any]]) -> None:
        """Hook: refuse the results before anything is published (they are in publishing order)."""

    # ------------------------------------------------------------------ worker
    def write(self, blocks: Iterable[Block], ctx: Any) -> dict[str, Any]:
        part = self.staging.part_path(ctx.task_idx)
        info = self._new_info()
        writer: tbl_format.Writer | None = None
        try:
            for block in blocks:
                for sample in self._samples(block, info):
                    if writer is None:
                        writer = tbl_format.Writer(
                            part, self.schema, metadata=self.metadata, compression=self.compression,
                            shard_rows=self.shard_rows or ONE_SHARD_ROWS, file_id=f"task{ctx.task_idx}",
                        )
                    writer.write(sample)
            if writer is not None:
                writer.close()
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        return {"task": ctx.task_idx, "part": None if writer is None else str(part),
                "rows": 0 if writer is None else writer.rows, **info}

    def _new_info(self) -> dict[str, Any]:
        """Hook: what a write task reports besides its part (filled in by `_samples`)."""
        return {}

    def _samples(self, block: Block, info: dict[str, Any]) -> Iterator[Any]:
        """The samples a block holds: its rows as plain dicts."""
        for row in BlockAccessor.for_block(block).iter_rows(public_row_format=True):
            yield dict(row)
