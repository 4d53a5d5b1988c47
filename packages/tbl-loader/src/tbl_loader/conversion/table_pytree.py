"""Generic tables (Parquet, Arrow, HuggingFace `datasets`) converted to a pytree .tbl, served by `PyTreeDataset`.

`convert_table` stores every column of every row as one leaf of the sample
dict, its kind mapped from the Arrow type exactly as a record source's fields
are (the type table of `tbl_loader.conversion.tables`; the value rules of
`tbl_loader.conversion.extra_columns`): no column is an image, nothing is
decoded. A `datasets` ``ClassLabel`` column stays its integer, and its names
are kept in the metadata as ``{"class_names": {column: [names]}}``.

A null, a type TBL does not store, or a Parquet row group that does not read
is refused by name (`SourceError`) before anything is published. The rows are
held in memory while their kinds are inferred (as a sidecar's are), then
written through `tbl_format.Writer`: the dataset appears at ``dst`` by atomic
rename or not at all. ``dst`` is checked as `tbl convert` checks it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tbl_format

from ..errors import SourceError
from .extra_columns import field_leaf
from .formats import detect_format
from .images import check_destination
from .tables import arrow_table, column_values, dataset_rows, load_dataset, parquet_tables

__all__ = ["TABLE_FORMATS", "convert_table"]

TABLE_FORMATS = ("parquet", "arrow", "hf")


def _tables(src: Any, fmt: str) -> tuple[list[Any], dict[str, list[str]]]:
    """The source's tables in row order, and the names of its ClassLabel columns."""
    if fmt == "hf":
        ds = load_dataset(src)
        import datasets  # loaded by load_dataset

        names = {c: list(f.names) for c, f in ds.features.items() if isinstance(f, datasets.ClassLabel)}
        return list(dataset_rows(ds)), names
    path = Path(os.path.abspath(src))
    if not path.exists():
        raise SourceError(f"source {os.fspath(src)!r} does not exist")
    if fmt == "arrow":
        return [arrow_table(path)], {}
    return [table for table, _ in parquet_tables(path, None)], {}


def convert_table(src: Any, dst: str | os.PathLike[str], *, source_format: str | None = None,
                  shard_rows: int | None = None, overwrite: bool = False) -> int:
    """Convert a Parquet / Arrow file or a `datasets` Dataset to a pytree dataset at ``dst``; returns its rows.

    Args:
        src: a ``.parquet`` file or folder of them, an ``.arrow`` file, a `datasets.Dataset` or its
            ``save_to_disk`` folder.
        dst: the ``.tbl`` file (or, with ``shard_rows``, the dataset folder) to write.
        source_format: "parquet", "arrow" or "hf"; None detects it (`tbl_loader.conversion.formats`).
        shard_rows: rows per shard of a sharded dataset folder; None for one file.
        overwrite: replace an existing dataset at ``dst`` (as `tbl_loader.convert` does).
    """
    fmt = source_format or detect_format(src)
    if fmt not in TABLE_FORMATS:
        raise ValueError(f"convert_table reads {', '.join(TABLE_FORMATS)} sources; {src!r} is {fmt or 'neither'}")
    dst_path = Path(dst)
    inputs = [Path(src)] if isinstance(src, (str, os.PathLike)) else []
    check_destination(dst_path, sharded=shard_rows is not None, overwrite=overwrite, inputs=inputs)
    tables, class_names = _tables(src, fmt)
    if not tables or not sum(t.num_rows for t in tables):
        raise SourceError(f"{src!r} holds no rows")
    names = tables[0].column_names
    columns: dict[str, list[Any]] = {c: [] for c in names}
    for k, table in enumerate(tables):
        if table.column_names != names:
            raise SourceError(f"{src!r}: table {k} has columns {table.column_names}, the first {names}")
        for c in names:
            columns[c].extend(column_values(table.column(c), f"column {c!r}"))
    leaves: dict[str, Any] = {}
    converters = {}
    for c, values in columns.items():
        try:
            leaves[c], converters[c] = field_leaf(c, values)
        except ValueError as e:
            raise SourceError(f"{src!r}: {e}") from None
    metadata = {"class_names": class_names} if class_names else {}
    n = len(columns[names[0]])
    with tbl_format.Writer(dst_path, tbl_format.Schema(leaves), metadata=metadata, shard_rows=shard_rows,
                           overwrite=overwrite) as writer:
        for i in range(n):
            writer.write({c: converters[c](columns[c][i]) for c in names})
    return n
