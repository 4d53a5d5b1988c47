"""Arrow export: rows of a dataset as a ``pyarrow.RecordBatch`` built on the stored columns.

Needs ``pyarrow`` (and numpy), the ``tbl-format[arrow]`` extra; nothing else in tbl-format imports this module.

One column per leaf, named by its leaf path (``"meta/lang"``): nested dicts,
lists and tuples are flattened rather than turned into struct columns, so that
every leaf is a column of its own, as it is on disk, and any engine (a
``pyarrow.dataset`` scan, DuckDB, Polars) projects single leaves; a struct
column would be read whole, and a list or tuple node has no field names.

Leaf kinds and Arrow types:

============================  ==================================================
int / float / bool            int64 / float64 / bool
array, image (dtype, shape)   fixed_size_list nested per dimension around dtype
str                           large_string
bytes, encoded_image          large_binary
var_list of int/float/bool    large_list of int64 / float64 / bool
var_list of str               large_list of large_string
var_array (dtype, ndim)       ``ndim`` nested large_lists around dtype
none                          null
============================  ==================================================

Optional leaves carry a validity bitmap (null where a row holds None).

Zero-copy. For a row range of one shard, every buffer that Arrow lays out as
TBL does is a view of the map: fixed-size values, the u64 offsets (Arrow
offsets need not start at 0, so a range's offsets are a slice and the heap is
shared whole), var_list items and str item offsets, and var_array values when
the range's rows are packed without alignment gaps. Built fresh (small):
validity bitmaps and bool values (Arrow packs them 8 to a byte, TBL stores a
byte each), var_array element offsets (TBL stores byte offsets). Copied:
an LZ4-compressed heap is decoded (compression cannot be zero-copy); a
var_array range with alignment gaps gathers its values; a range over several
shards concatenates the shards' pieces. Index batches gather (fixed-size leaves
with numpy ``take`` on the mapped column, variable ones with Arrow ``take``).

The arrays hold references to the maps: a batch outlives ``Dataset.close()``
and keeps the shards it reads mapped until it is dropped.
"""

from __future__ import annotations

import os
from typing import Any

from .dataset import Dataset
from .dataset import open as open_dataset
from .schema import Leaf, Schema
from .shard import LeafBuffers, Shard

__all__ = ["arrow_schema", "shard_batch", "to_arrow_batch", "to_arrow_dataset"]


def _deps() -> tuple[Any, Any]:
    try:
        import numpy as np
        import pyarrow as pa
    except ImportError as exc:
        raise ImportError(f"Arrow export needs pyarrow and numpy: pip install 'tbl-format[arrow]' ({exc})") from None
    return pa, np


def _value_type(pa: Any, dtype: str) -> Any:
    return pa.bool_() if dtype == "bool" else pa.from_numpy_dtype(dtype)


_ITEM_TYPES = {"int": "int64", "float": "float64", "bool": "bool"}


def leaf_type(leaf: Leaf) -> Any:
    """The Arrow type of a leaf (see the module docstring)."""
    pa, _ = _deps()
    kind = leaf.kind
    if kind in ("int", "float", "bool"):
        return _value_type(pa, leaf.spec.numpy)
    if kind in ("array", "image"):
        t = _value_type(pa, leaf.dtype or "uint8")
        for d in reversed(leaf.row_shape):
            t = pa.list_(t, d)
        return t
    if kind == "str":
        return pa.large_string()
    if kind in ("bytes", "encoded_image"):
        return pa.large_binary()
    if kind == "var_list":
        item = pa.large_string() if leaf.item == "str" else _value_type(pa, _ITEM_TYPES[leaf.item])
        return pa.large_list(item)
    if kind == "var_array":
        t = _value_type(pa, leaf.dtype)
        for _ in range(leaf.ndim):
            t = pa.large_list(t)
        return t
    if kind == "none":
        return pa.null()
    raise ValueError(f"no Arrow type for leaf kind {kind!r}")


def arrow_schema(schema: Schema, leaves: list[str] | None = None) -> Any:
    """The Arrow schema of a TBL schema: one field per leaf path (``leaves``: a selection, in schema order)."""
    pa, _ = _deps()
    paths = _paths(schema, leaves)
    return pa.schema([pa.field(p, leaf_type(schema.leaves[p]), nullable=schema.leaves[p].optional or
                               schema.leaves[p].kind == "none") for p in paths])


def _paths(schema: Schema, leaves: list[str] | None) -> list[str]:
    if leaves is None:
        return list(schema.leaves)
    if isinstance(leaves, str):
        raise TypeError("leaves must be a list of leaf paths, not a single string")
    unknown = [p for p in leaves if p not in schema.leaves]
    if unknown:
        raise KeyError(f"no leaves {unknown} in this dataset; its leaves are {list(schema.leaves)}")
    chosen = set(leaves)
    return [p for p in schema.leaves if p in chosen]


# ---- one shard, one row range: zero-copy where the layouts agree ----------------------------------------
def _u64(np: Any, view: Any, start: int, stop: int) -> Any:
    """Entries start..stop-1 of a u64 table as an int64 array (a view: offsets are far below 2**63)."""
    return np.frombuffer(view, dtype="<i8", count=stop - start, offset=8 * start)


def _validity(pa: Any, np: Any, present: Any) -> Any:
    """Arrow's validity bitmap from TBL's byte-per-row presence flags (a uint8 array); None when all set."""
    if present is None or bool(present.all()):
        return None
    return pa.py_buffer(np.packbits(present != 0, bitorder="little"))


def _bool_values(pa: Any, np: Any, flags: Any) -> Any:
    return pa.py_buffer(np.packbits(flags != 0, bitorder="little"))


def _fixed(pa: Any, np: Any, typ: Any, leaf: Leaf, values: Any, n: int, validity: Any) -> Any:
    """A fixed-size leaf from ``values``: a buffer of ``n`` rows of ``row_bytes`` each."""
    if leaf.kind == "none":
        return pa.nulls(n)
    if leaf.kind == "bool":
        return pa.Array.from_buffers(typ, n, [validity, _bool_values(pa, np, np.frombuffer(values, np.uint8))])
    if leaf.kind in ("int", "float"):
        return pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(values)])
    dtype = leaf.dtype or "uint8"
    shape = leaf.row_shape
    total = n
    for d in shape:
        total *= d
    inner = typ
    for _ in shape:
        inner = inner.value_type
    buf = _bool_values(pa, np, np.frombuffer(values, np.uint8)) if dtype == "bool" else pa.py_buffer(values)
    arr = pa.Array.from_buffers(inner, total, [None if shape else validity, buf])
    levels = []
    t = typ
    for _ in shape:
        levels.append(t)
        t = t.value_type
    count = total
    for lt in reversed(levels):
        count //= lt.list_size
        outer_validity = validity if lt is levels[0] else None
        arr = pa.Array.from_buffers(lt, count, [outer_validity], children=[arr])
    return arr


def _var_array_values(np: Any, leaf: Leaf, heap: Any, starts: Any, counts: Any) -> tuple[Any, Any]:
    """(values buffer, int64 element offsets) of var_array rows at byte ``starts`` with ``counts`` elements.

    A view of the heap when the rows are packed end to end, else the rows' values gathered.
    """
    itemsize = leaf.itemsize
    elem_offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
    np.cumsum(counts, out=elem_offsets[1:])
    total = int(elem_offsets[-1])
    if counts.shape[0] == 0:
        return memoryview(b""), elem_offsets
    base = int(starts[0])
    if np.array_equal(starts - base, elem_offsets[:-1] * itemsize):
        return heap[base : base + total * itemsize], elem_offsets
    # Alignment gaps between rows: gather each row's elements (starts are aligned to the item size).
    items = np.frombuffer(heap, dtype=np.uint8, count=(len(heap) // itemsize) * itemsize).view(f"V{itemsize}")
    first = starts // itemsize
    index = np.repeat(first - elem_offsets[:-1], counts) + np.arange(total, dtype=np.int64)
    return items[index].tobytes(), elem_offsets


def _var_array(pa: Any, np: Any, typ: Any, leaf: Leaf, heap: Any, starts: Any, shapes: Any, validity: Any) -> Any:
    """A var_array leaf of rows at byte ``starts`` with ``(n, ndim)`` ``shapes``: ndim nested large_lists."""
    n, ndim = shapes.shape
    counts = shapes.prod(axis=1) if ndim else np.ones(n, np.int64)
    values, _ = _var_array_values(np, leaf, heap, starts, counts)
    # Lists per level: level d has one list per element of levels < d, each of length shapes[:, d].
    lengths = [shapes[:, 0]]
    per_row = shapes[:, 0]
    for d in range(1, ndim):
        lengths.append(np.repeat(shapes[:, d], per_row))
        per_row = per_row * shapes[:, d]
    value_type = typ
    for _ in range(ndim):
        value_type = value_type.value_type
    total = int(counts.sum())
    buf = _bool_values(pa, np, np.frombuffer(values, np.uint8)) if leaf.dtype == "bool" else pa.py_buffer(values)
    arr = pa.Array.from_buffers(value_type, total, [None, buf])
    types = []
    t = typ
    for _ in range(ndim):
        types.append(t)
        t = t.value_type
    for d in reversed(range(ndim)):
        offs = np.zeros(lengths[d].shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths[d], out=offs[1:])
        arr = pa.Array.from_buffers(types[d], lengths[d].shape[0], [validity if d == 0 else None, pa.py_buffer(offs)],
                                    children=[arr])
    return arr


def _range_array(pa: Any, np: Any, typ: Any, b: LeafBuffers, a: int, z: int) -> Any:
    """Rows a..z-1 of one leaf of one shard (see the module docstring for what is a view)."""
    leaf = b.leaf
    n = z - a
    present = None if b.present is None else np.frombuffer(b.present, np.uint8, count=n, offset=a)
    validity = _validity(pa, np, present)
    if leaf.fixed_size:
        rb = leaf.row_bytes
        return _fixed(pa, np, typ, leaf, b.data[a * rb : z * rb], n, validity)
    offsets = _u64(np, b.offsets, a, z + 1)
    if leaf.kind == "var_array":
        shapes = np.frombuffer(b.shapes, dtype="<i8", count=n * leaf.ndim, offset=8 * a * leaf.ndim)
        return _var_array(pa, np, typ, leaf, b.heap, offsets[:-1], shapes.reshape(n, leaf.ndim), validity)
    offs = pa.py_buffer(offsets)
    if leaf.kind != "var_list":
        return pa.Array.from_buffers(typ, n, [validity, offs, pa.py_buffer(b.heap)])
    count = len(b.items) // 8 - 1 if leaf.item == "str" else len(b.heap) // leaf.itemsize
    if leaf.item == "str":
        child = pa.Array.from_buffers(typ.value_type, count, [None, pa.py_buffer(b.items), pa.py_buffer(b.heap)])
    elif leaf.item == "bool":
        child = pa.Array.from_buffers(typ.value_type, count, [None, _bool_values(pa, np, np.frombuffer(b.heap, np.uint8))])
    else:
        child = pa.Array.from_buffers(typ.value_type, count, [None, pa.py_buffer(b.heap)])
    return pa.Array.from_buffers(typ, n, [validity, offs], children=[child])


def shard_batch(shard: Shard, start: int = 0, stop: int | None = None, leaves: list[str] | None = None) -> Any:
    """Rows ``start..stop-1`` of one open shard file as a ``pyarrow.RecordBatch`` (zero-copy, see the module docstring).

    Args:
        shard: an open shard (``Dataset.shard(k)``); ColumnarLayoutError for a TurboLoader v2 file.
        start: first row.
        stop: one past the last row (default: the shard's rows).
        leaves: leaf paths to export (default: all), in schema order.
    """
    pa, np = _deps()
    stop = shard.rows if stop is None else stop
    if not 0 <= start <= stop <= shard.rows:
        raise IndexError(f"rows {start}..{stop} outside 0..{shard.rows} of {shard.path}")
    schema = arrow_schema(shard.schema, leaves)
    arrays = [_range_array(pa, np, field.type, shard.buffers(field.name), start, stop) for field in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# ---- a dataset: row ranges and index batches ------------------------------------------------------------
def _gather_fixed(pa: Any, np: Any, typ: Any, b: LeafBuffers, local: Any) -> Any:
    leaf = b.leaf
    n = local.shape[0]
    present = None if b.present is None else np.frombuffer(b.present, np.uint8).take(local)
    validity = _validity(pa, np, present)
    if leaf.kind == "none":
        return pa.nulls(n)
    rows = np.frombuffer(b.data, np.uint8).reshape(b.rows, leaf.row_bytes)
    return _fixed(pa, np, typ, leaf, rows.take(local, axis=0), n, validity)


def _gather_var_array(pa: Any, np: Any, typ: Any, b: LeafBuffers, local: Any) -> Any:
    leaf = b.leaf
    present = None if b.present is None else np.frombuffer(b.present, np.uint8).take(local)
    starts = _u64(np, b.offsets, 0, b.rows).take(local)
    shapes = np.frombuffer(b.shapes, dtype="<i8").reshape(b.rows, leaf.ndim).take(local, axis=0)
    return _var_array(pa, np, typ, leaf, b.heap, starts, shapes, _validity(pa, np, present))


def _take(pa: Any, np: Any, typ: Any, b: LeafBuffers, local: Any) -> Any:
    """Rows ``local`` (int64, in ``[0, rows)``) of one leaf of one shard, gathered."""
    leaf = b.leaf
    if leaf.fixed_size:
        return _gather_fixed(pa, np, typ, b, local)
    if leaf.kind == "var_array":
        return _gather_var_array(pa, np, typ, b, local)
    lo, hi = int(local.min()), int(local.max()) + 1
    # The span's array is views only (plus its validity bitmap); Arrow's take copies just the rows asked for.
    return _range_array(pa, np, typ, b, lo, hi).take(pa.array(local - lo))


def _empty(pa: Any, schema: Any) -> Any:
    return pa.RecordBatch.from_arrays([pa.array([], type=f.type) for f in schema], schema=schema)


def to_arrow_batch(dataset: Dataset, rows: Any, leaves: list[str] | None = None) -> Any:
    """Rows of a dataset as one ``pyarrow.RecordBatch`` (one column per leaf path).

    Args:
        dataset: an open ``tbl_format.Dataset``.
        rows: a ``range`` with step 1 (zero-copy within one shard; shards' pieces concatenated otherwise),
            or int row indices (negatives count from the end; gathered).
        leaves: leaf paths to export (default: all).
    """
    pa, np = _deps()
    schema = arrow_schema(dataset.schema, leaves)
    num = len(dataset)
    seg = np.asarray(dataset.segment_rows, dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(seg)))
    if isinstance(rows, range) and rows.step == 1:
        a, z = max(rows.start, 0), min(max(rows.stop, rows.start), num)
        if rows.start < 0 or rows.stop > num:
            raise IndexError(f"rows {rows.start}..{rows.stop} outside 0..{num}")
        pieces = []
        for k in range(seg.shape[0]):
            lo, hi = max(a - int(starts[k]), 0), min(z - int(starts[k]), int(seg[k]))
            if lo < hi:
                pieces.append(shard_batch(dataset.shard(k), lo, hi, leaves))
        if len(pieces) == 1:
            return pieces[0]
        if not pieces:
            return _empty(pa, schema)
        return pa.RecordBatch.from_arrays([pa.concat_arrays([p.column(c) for p in pieces]) for c in range(len(schema))],
                                          schema=schema)
    idx = np.asarray(rows if not isinstance(rows, range) else np.arange(rows.start, rows.stop, rows.step))
    if idx.ndim != 1 or (idx.shape[0] and idx.dtype.kind not in "iu"):
        raise TypeError(f"rows must be a range or one-dimensional int indices, got {idx.dtype} {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    if idx.shape[0] and (idx.min() < -num or idx.max() >= num):
        raise IndexError(f"row {int(idx.min() if idx.min() < -num else idx.max())} out of range for {num} rows")
    idx = np.where(idx < 0, idx + num, idx)
    if idx.shape[0] == 0:
        return _empty(pa, schema)
    shard_of = np.searchsorted(starts, idx, side="right") - 1
    columns: list[list[Any]] = [[] for _ in schema]
    order = []
    for k in np.unique(shard_of).tolist():
        sel = np.flatnonzero(shard_of == k)
        order.append(sel)
        local = idx[sel] - starts[k]
        shard = dataset.shard(k)
        for c, field in enumerate(schema):
            columns[c].append(_take(pa, np, field.type, shard.buffers(field.name), local))
    if len(order) == 1:
        return pa.RecordBatch.from_arrays([parts[0] for parts in columns], schema=schema)
    # Shard by shard, then back into the order asked for.
    back = pa.array(np.argsort(np.concatenate(order), kind="stable"))
    return pa.RecordBatch.from_arrays([pa.concat_arrays(parts).take(back) for parts in columns], schema=schema)


def to_arrow_dataset(path: str | os.PathLike[str], *, leaves: list[str] | None = None,
                     batch_rows: int = 65536) -> Any:
    """A ``.tbl`` file or dataset directory as a ``pyarrow.dataset.Dataset`` that DuckDB and Polars scan in place.

    Every shard is mapped (for as long as the returned dataset lives) and cut into
    zero-copy record batches of at most ``batch_rows`` rows; nothing is converted
    (see the module docstring for the buffers that are built or decoded). Scanners
    project leaves: unread columns are never touched.

    Args:
        path: a ``.tbl`` file or dataset directory.
        leaves: leaf paths to expose (default: all).
        batch_rows: rows per record batch (a scan's unit of work).
    """
    pa, _ = _deps()
    import pyarrow.dataset as pads

    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows}")
    dataset = open_dataset(path, max_open=1 << 30)
    try:
        schema = arrow_schema(dataset.schema, leaves)
        batches = []
        for k, n in enumerate(dataset.segment_rows):
            shard = dataset.shard(k)
            batches.extend(shard_batch(shard, a, min(a + batch_rows, n), leaves) for a in range(0, n, batch_rows))
    finally:
        dataset.close()  # the batches keep the maps they view alive
    return pads.InMemoryDataset(batches, schema=schema)
