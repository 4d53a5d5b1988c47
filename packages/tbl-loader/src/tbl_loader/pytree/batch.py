"""How rows of a pytree dataset become a batch: per-schema generated code plus the row-gather kernel.

A :class:`Collator` is built once per schema and leaf selection. It generates
(Python source compiled with ``exec``; only ``repr()`` of dict keys and
validated integers reach the source) two small functions:

- ``select(sample)``: the selected leaves of a full sample, as the pruned pytree
  (and copies of array leaves when asked); used by ``ds[i]``;
- ``build(values)``: the pruned pytree around one value per selected leaf.

A batch is assembled leaf by leaf, as the leaf kind's ``batch`` rule in
``tbl_format.kinds.KINDS`` says. Fixed-size leaves (``int``, ``float``,
``bool``, ``array``, ``image``) are gathered together, by one ``gather_columns``
kernel call straight from the mapped columns, into one fresh array per leaf: ``(B,)`` int64 / float64 /
bool for scalars, ``(B, *shape)`` of the stored dtype for arrays. Variable-size
leaves are read with ``Dataset.values`` and become, with ``var="list"``, a list of ``B``
values (``str``, ``bytes``, a list for ``var_list`` leaves, or a fresh writable numpy array per
row), and with ``var="pad"`` a :class:`Padded` pair for ``bytes`` / ``encoded_image`` /
``var_array`` leaves and ``var_list`` leaves of int, float or bool items (``str`` leaves and
lists of str stay lists). A ``none`` leaf is a list of ``B`` Nones.

Optional leaves (rows that may hold None): a fixed-size one is a :class:`Masked` pair, its
``(B, *shape)`` array (zeros where a row holds None) and a ``(B,)`` bool ``present`` mask, both
gathered by the kernel like any fixed-size leaf; a variable-size one is, with ``var="list"``, the
list with None where a row holds None, and with ``var="pad"`` a :class:`Masked` pair around the
:class:`Padded` pair (a None row padded as an empty one) where the leaf pads, else the list.

Pruning (``fields=``): a dict keeps the keys under which a selected leaf lives;
a list or tuple keeps its selected elements, in order.

A :class:`RowSource` is what a batch is read from: an open ``tbl_format.Dataset``
(which maps shards lazily, at most ``max_open`` at once) plus the one thing the
dataset has no call for, gathering rows of the fixed-size leaves from several
shards with one kernel call.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

import tbl_format
from tbl_format import DEFAULT_MAX_OPEN, KINDS, Kind, Leaf, Schema

from .._kernels import kernels

__all__ = ["VAR_MODES", "Collator", "FixedLeaf", "IndexedBatch", "Masked", "Padded", "RowSource", "VarLeaf",
           "field_paths", "torch_column"]

VAR_MODES = ("list", "pad")



def field_paths(fields: Iterable[str] | None, leaves: Iterable[str] | None) -> list[str] | None:
    """The ``fields=`` argument of the pytree readers, accepting the older spelling ``leaves=``.

    Every loader names the sample leaves it serves ``fields=`` (ImageLoader's extra leaves, the pytree
    readers' selection); ``leaves=`` still works with a DeprecationWarning."""
    if leaves is not None:
        if fields is not None:
            raise TypeError("pass fields= only (leaves= is its older name)")
        warnings.warn("leaves= is now fields= (the name every loader uses)", DeprecationWarning, stacklevel=3)
        fields = leaves
    if fields is None or isinstance(fields, str):
        return fields  # type: ignore[return-value]  # (a single string is refused by name by the Collator)
    return list(fields)


class Padded(NamedTuple):
    """A variable-size leaf of a batch in ``var="pad"`` mode.

    ``data``: ``(B, *max_shape)`` array, each row's values at the start of its
    slot and zeros after (uint8 ``(B, max_len)`` for bytes leaves).
    ``lengths``: int64 ``(B, ndim)`` shape of every row for ``var_array`` leaves,
    ``(B,)`` byte count for bytes leaves.
    """

    data: Any
    lengths: Any


class IndexedBatch(NamedTuple):
    """What ``PyTreeLoader(return_indices=True)`` yields: the collated pytree and the dataset row of every sample.

    A pytree batch is the user's own structure (dicts, lists, tuples), so its rows travel beside it rather than
    on it; ``batch, indices = item`` unpacks it as the former pair, ``item.indices`` names them as on an image
    :class:`~tbl_loader.Batch`. A named tuple, so that torch's collate and pin_memory and Lightning's
    ``apply_to_collection`` rebuild it as they rebuild any named tuple.
    """

    batch: Any
    indices: Any


class Masked(NamedTuple):
    """An optional leaf of a batch: the values, and ``present`` (``(B,)`` bool), False where a row holds None.

    ``data``: for a fixed-size leaf the ``(B, *shape)`` array with zeros where a row holds None;
    for a variable-size leaf in ``var="pad"`` mode the :class:`Padded` pair, a None row padded as an
    empty one.
    """

    data: Any
    present: Any


class FixedLeaf(NamedTuple):
    slot: int  # position among the selected leaves
    path: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    row_bytes: int
    #: the leaf's presence flags (``(rows,)`` bool, one byte a row) rather than its values
    present: bool = False


class VarLeaf(NamedTuple):
    slot: int
    path: str
    leaf: Leaf


def _fixed(slot: int, path: str, leaf: Leaf) -> FixedLeaf:
    dtype = np.dtype(leaf.spec.numpy or leaf.dtype).newbyteorder("<")
    return FixedLeaf(slot, path, dtype, leaf.row_shape, leaf.row_bytes)


def _access(schema: Schema) -> dict[str, str]:
    """Leaf path -> Python expression reading that leaf out of a sample named ``s``."""
    out: dict[str, str] = {}

    def walk(node: Any, path: str, expr: str) -> None:
        if isinstance(node, Leaf):
            out[path] = expr
        elif isinstance(node, dict):
            for key, sub in node.items():
                walk(sub, f"{path}/{key}" if path else key, f"{expr}[{key!r}]")
        else:
            for i, sub in enumerate(node):
                walk(sub, f"{path}/{i}" if path else str(i), f"{expr}[{i}]")

    walk(schema.tree, "", "s")
    return out


def _pruned(schema: Schema, selected: set[str], leaf_expr: Callable[[str], str]) -> str:
    """Source of the pruned pytree with ``leaf_expr(path)`` at every selected leaf."""

    def walk(node: Any, path: str) -> str | None:
        if isinstance(node, Leaf):
            return leaf_expr(path) if path in selected else None
        if isinstance(node, dict):
            items = []
            for key, sub in node.items():
                inner = walk(sub, f"{path}/{key}" if path else key)
                if inner is not None:
                    items.append(f"{key!r}: {inner}")
            return "{" + ", ".join(items) + "}" if items else None
        parts = [walk(sub, f"{path}/{i}" if path else str(i)) for i, sub in enumerate(node)]
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        if isinstance(node, list):
            return "[" + ", ".join(parts) + "]"
        return "(" + "".join(p + ", " for p in parts) + ")"

    src = walk(schema.tree, "")
    if src is None:
        raise ValueError("no leaf selected")
    return src


def _copy_array(a: Any) -> Any:
    return None if a is None else np.array(a)


class Collator:
    """Generated per-schema code that selects leaves, and assembles batches from them."""

    def __init__(self, schema: Schema, leaves: Iterable[str] | None = None, var: str = "list",
                 copy_arrays: bool = False) -> None:
        if var not in VAR_MODES:
            raise ValueError(f"var must be one of {VAR_MODES}, got {var!r}")
        all_paths = list(schema.leaves)
        if leaves is None:
            paths = all_paths
        else:
            if isinstance(leaves, str):
                raise TypeError("fields must be a list of leaf paths, not a single string")
            wanted = list(leaves)
            unknown = [p for p in wanted if p not in schema.leaves]
            if unknown:
                raise KeyError(f"no leaves {unknown} in this dataset; its leaves are {all_paths}")
            if not wanted:
                raise ValueError("fields is empty: select at least one leaf")
            chosen = set(wanted)
            paths = [p for p in all_paths if p in chosen]
        self.schema = schema
        self.var_mode = var
        self.paths = paths
        self.fixed: list[FixedLeaf] = []
        self.var: list[VarLeaf] = []
        # Optional fixed-size leaves: their values and presence flags, gathered per batch (see var_columns).
        self.masked: dict[str, tuple[FixedLeaf, ...]] = {}
        for slot, path in enumerate(paths):
            leaf = schema.leaves[path]
            if leaf.spec.batch == Kind.COLUMN and not leaf.optional:
                self.fixed.append(_fixed(slot, path, leaf))
                continue
            self.var.append(VarLeaf(slot, path, leaf))
            if leaf.spec.batch == Kind.COLUMN:
                flags = FixedLeaf(slot, path, np.dtype(np.bool_), (), 1, present=True)
                self.masked[path] = (_fixed(slot, path, leaf), flags)
        # The fixed-size leaves that hold bytes: gathered together, in one kernel call per batch.
        self.gathered: tuple[FixedLeaf, ...] = tuple(leaf for leaf in self.fixed if leaf.row_bytes)
        access = _access(schema)
        selected = set(paths)
        slot_of = {p: k for k, p in enumerate(paths)}
        # Array leaves (the kinds whose rows read as numpy views rather than Python objects).
        copies = {p for p in paths if KINDS[schema.leaves[p].kind].python is None} if copy_arrays else set()
        # ds[i] needs no post-processing when every leaf is kept as read and nothing is copied.
        self.identity = len(paths) == len(all_paths) and not copies
        ns: dict[str, Any] = {"COPY": _copy_array}
        select_tree = _pruned(schema, selected, lambda p: f"COPY({access[p]})" if p in copies else access[p])
        build_tree = _pruned(schema, selected, lambda p: f"v[{slot_of[p]}]")
        src = (
            f"def select(s):\n    return {select_tree}\n\n"
            f"def build(v):\n    return {build_tree}\n"
        )
        exec(compile(src, "<tbl pytree collator>", "exec"), ns)
        self.select: Callable[[Any], Any] = ns["select"]
        self.build: Callable[[list[Any]], Any] = ns["build"]

    # ---- batches ------------------------------------------------------------------------------
    def var_columns(self, source: RowSource, indices: np.ndarray) -> list[Any]:
        """One finished batch value per leaf of ``self.var`` (list, Padded or Masked), in ``self.var`` order.

        ``indices`` must lie in ``[0, len)`` (IndexError otherwise, before anything is read).
        """
        if not self.var:
            return []
        rows = indices.tolist()
        out = []
        for v in self.var:
            masked = self.masked.get(v.path)
            out.append(self._masked(source, masked, indices) if masked else self._finish(v.leaf, source.values(v.path, rows)))
        return out

    @staticmethod
    def _masked(source: RowSource, leaves: tuple[FixedLeaf, FixedLeaf], indices: np.ndarray) -> Masked:
        """An optional fixed-size leaf of rows ``indices``: its values and presence flags, in one kernel call."""
        n = indices.shape[0]
        data, flags = leaves
        values = np.empty((n, *data.row_shape), dtype=data.dtype)
        present = np.empty(n, dtype=np.bool_)
        targets = [(flags, present.view(np.uint8).reshape(n, 1))]
        if data.row_bytes:
            targets.insert(0, (data, values.view(np.uint8).reshape(n, data.row_bytes)))
        if n:
            source.gather(tuple(leaf for leaf, _ in targets), indices, [out for _, out in targets])
        return Masked(values, present)

    def _finish(self, leaf: Leaf, values: list[Any]) -> Any:
        batch = leaf.spec.batch
        pad = self.var_mode == "pad"
        if batch == Kind.PAD_ARRAY:
            if not pad:
                # Fresh writable copies: the row values are read-only views of the map.
                return [None if a is None else np.array(a) for a in values]
            return self._optional(leaf, values, _pad_arrays(_filled(values, leaf), leaf))
        if batch == Kind.PAD_BYTES and pad:  # bytes objects are already copies
            return self._optional(leaf, values, _pad_bytes(_filled(values, leaf)))
        if batch == Kind.PAD_LIST and pad and leaf.item != "str":
            return self._optional(leaf, values, _pad_lists(_filled(values, leaf), leaf))
        return values

    @staticmethod
    def _optional(leaf: Leaf, values: list[Any], padded: Padded) -> Any:
        if not leaf.optional:
            return padded
        return Masked(padded, np.fromiter((v is not None for v in values), dtype=np.bool_, count=len(values)))

    def batch(self, source: RowSource, indices: np.ndarray) -> Any:
        """The collated pytree of rows ``indices`` (validated contiguous int64) of a RowSource."""
        n = indices.shape[0]
        values: list[Any] = [None] * len(self.paths)
        outs = []
        for leaf in self.fixed:
            out = np.empty((n, *leaf.row_shape), dtype=leaf.dtype)
            values[leaf.slot] = out
            if leaf.row_bytes:
                outs.append(out.view(np.uint8).reshape(n, leaf.row_bytes))
        if n and outs:
            source.gather(self.gathered, indices, outs)
        if self.var:
            for v, col in zip(self.var, self.var_columns(source, indices), strict=True):
                values[v.slot] = col
        return self.build(values)


class RowSource:
    """Rows of one ``tbl_format.Dataset``, opened here, for ``ds[i]`` and batch gathers.

    ``get(i)`` reads one row; ``values(leaf, rows)`` one variable-size leaf of
    many rows (``Dataset.values``); ``gather`` copies rows of fixed-size leaves with
    ``gather_columns`` straight from the mapped columns: in one call over every
    shard when all of them fit in ``max_open`` (the dataset then never evicts
    one, so the column views are kept between batches), otherwise per batch in
    groups of at most ``max_open`` of the shards the batch touches, fetched
    through ``dataset.shard(k)``, so that the bound on maps holds inside one
    batch too (views of every shard would keep every map alive).

    Belongs to one process and one thread at a time (a loader's producer
    thread, or the process using a ``PyTreeDataset``); never pickled.
    """

    def __init__(self, path: str | os.PathLike[str] | None, *, max_open: int = DEFAULT_MAX_OPEN, verify: bool = False,
                 dataset: Any = None, own_dataset: bool = False) -> None:
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open must be an int >= 1, got {max_open!r}")
        # dataset: an open tbl_format.Dataset to read instead of opening ``path`` (closed by its owner,
        # this source when own_dataset).
        self._owned = dataset is None or own_dataset
        if dataset is None:
            dataset = tbl_format.open(path, max_open=max_open, verify=verify)
        try:
            self.schema = dataset.schema
            self.metadata = dataset.metadata
            self.fingerprint = dataset.fingerprint
            rows = dataset.segment_rows
        except BaseException:
            if self._owned:
                dataset.close()
            raise
        self.dataset = dataset
        # Never more shards at once than the dataset itself keeps open (a dataset streamed from a URL
        # bounds its maps by what the cache holds).
        self.max_open = max_open = min(max_open, dataset.max_open)
        self.num_rows = sum(rows)
        self._rows = np.asarray(rows, dtype=np.int64)
        self._starts = np.cumsum(self._rows) - self._rows
        self._all_fit = len(rows) <= max_open
        self._all_columns: dict[tuple[FixedLeaf, ...], list[list[np.ndarray]]] = {}
        # A single file is its only shard, mapped by open() and never evicted: its compiled row
        # reader is the dataset's ds[i] without the per-call dispatch.
        self.get = dataset.shard(0).get if dataset.files == [dataset.path] else dataset.__getitem__
        self.values = dataset.values

    @property
    def open_shards(self) -> int:
        return self.dataset.open_shards

    def _column(self, k: int, leaf: FixedLeaf) -> np.ndarray:
        shard = self.dataset.shard(k)
        col = shard.present(leaf.path) if leaf.present else shard.column(leaf.path)
        return col.view(np.uint8).reshape(col.shape[0], leaf.row_bytes)

    def _segments(self, leaf: FixedLeaf) -> list[np.ndarray]:
        """Every non-empty shard's column of ``leaf`` as ``(rows, row_bytes)`` uint8 (all shards fit)."""
        views = self.dataset.present_segments(leaf.path) if leaf.present else self.dataset.segments(leaf.path)
        return [
            col.view(np.uint8).reshape(col.shape[0], leaf.row_bytes)
            for col, r in zip(views, self._rows.tolist(), strict=True)
            if r
        ]

    def gather(self, leaves: tuple[FixedLeaf, ...], indices: np.ndarray, outs: list[np.ndarray]) -> None:
        """``outs[l][b] = row indices[b]`` of fixed-size leaf ``leaves[l]``, every leaf in one kernel call.

        ``indices``: validated int64; ``outs[l]``: ``(B, leaves[l].row_bytes)`` uint8.
        """
        if self._all_fit:
            columns = self._all_columns.get(leaves)
            if columns is None:
                columns = [self._segments(leaf) for leaf in leaves]
                self._all_columns[leaves] = columns
            kernels.gather_columns(columns, indices, outs)
            return
        starts = self._starts
        shard_of = np.searchsorted(starts, indices, side="right") - 1
        touched = np.unique(shard_of)
        step = self.max_open
        for a in range(0, touched.shape[0], step):
            group = touched[a : a + step]
            # Rows of the group's shards, addressed in the concatenation of just those shards.
            bases = np.concatenate(([0], np.cumsum(self._rows[group])[:-1]))
            columns = [[self._column(k, leaf) for k in group.tolist()] for leaf in leaves]
            if group.shape[0] == touched.shape[0]:
                local = indices - starts[shard_of] + bases[np.searchsorted(group, shard_of)]
                kernels.gather_columns(columns, np.ascontiguousarray(local, dtype=np.int64), outs)
                return
            sel = np.flatnonzero((shard_of >= group[0]) & (shard_of <= group[-1]))
            ks = shard_of[sel]
            local = indices[sel] - starts[ks] + bases[np.searchsorted(group, ks)]
            parts = [np.empty((sel.shape[0], leaf.row_bytes), dtype=np.uint8) for leaf in leaves]
            kernels.gather_columns(columns, np.ascontiguousarray(local, dtype=np.int64), parts)
            for out, part in zip(outs, parts, strict=True):
                out[sel] = part
            del columns  # the next group's shards may evict these: their maps must be free to go

    def __iter__(self) -> Iterator[Any]:
        """Every row in order, through the dataset's batched in-order decoder."""
        return iter(self.dataset)

    def close(self) -> None:
        """Unmap every shard (views still held by callers keep their own map alive until dropped)."""
        self._all_columns.clear()
        self.get = self.values = None
        if self._owned:
            self.dataset.close()


def _pad_arrays(values: list[Any], leaf: Leaf) -> Padded:
    ndim = leaf.ndim or 1
    n = len(values)
    lengths = np.zeros((n, ndim), dtype=np.int64)
    for b, a in enumerate(values):
        lengths[b] = a.shape
    top = lengths.max(axis=0) if n else np.zeros(ndim, np.int64)
    data = np.zeros((n, *top.tolist()), dtype=np.dtype(leaf.dtype))
    for b, a in enumerate(values):
        data[(b, *(slice(0, d) for d in a.shape))] = a
    return Padded(data, lengths)


def _filled(values: list[Any], leaf: Leaf) -> list[Any]:
    """values with every None (a row of an optional leaf holding None) replaced by an empty value of the leaf."""
    if not leaf.optional:
        return values
    if leaf.kind == "var_array":
        empty: Any = np.zeros((0,) * (leaf.ndim or 1), dtype=np.dtype(leaf.dtype))
    elif leaf.kind == "var_list":
        empty = []
    else:
        empty = b""
    return [empty if v is None else v for v in values]


def _pad_lists(values: list[list[Any]], leaf: Leaf) -> Padded:
    """A var_list leaf of int, float or bool items as (B, max_len) of int64 / float64 / bool, and (B,) lengths."""
    n = len(values)
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=n)
    dtype = np.dtype(KINDS[leaf.item].numpy)
    data = np.zeros((n, int(lengths.max()) if n else 0), dtype=dtype)
    for b, v in enumerate(values):
        data[b, : len(v)] = v
    return Padded(data, lengths)


def _pad_bytes(values: list[Any]) -> Padded:
    n = len(values)
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=n)
    data = np.zeros((n, int(lengths.max()) if n else 0), dtype=np.uint8)
    for b, v in enumerate(values):
        data[b, : len(v)] = np.frombuffer(v, dtype=np.uint8)
    return Padded(data, lengths)


def torch_column(col: Any, device: Any) -> Any:
    """A variable-size batch value with its numpy arrays as torch tensors (on ``device``, None: host)."""
    import torch  # only torch outputs get here

    def convert(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            t = torch.from_numpy(value)  # a fresh writable array: no copy, no warning
            return t if device is None else t.to(device)
        if isinstance(value, (Padded, Masked)):
            return type(value)(*(convert(part) for part in value))
        return value

    if isinstance(col, list):
        return [convert(v) for v in col] if any(isinstance(v, np.ndarray) for v in col) else col
    return convert(col)
