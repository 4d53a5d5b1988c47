"""How rows of a pytree dataset become a batch: per-schema generated code plus the row-gather kernel.

A :class:`Collator` is built once per schema and leaf selection. It generates
(Python source compiled with ``exec``; only ``repr()`` of dict keys and
validated integers reach the source) three small functions:

- ``select(sample)``: the selected leaves of a full sample, as the pruned pytree
  (and copies of array leaves when asked); used by ``ds[i]``;
- ``pick_var(sample)``: the tuple of the variable-size leaves of a sample;
- ``build(values)``: the pruned pytree around one value per selected leaf.

A batch is assembled leaf by leaf. Fixed-size leaves (``int``, ``float``,
``bool``, ``array``, ``image``) are gathered with ``gather_rows`` straight from
the mapped columns into one fresh array per leaf: ``(B,)`` int64 / float64 /
bool for scalars, ``(B, *shape)`` of the stored dtype for arrays. Variable-size
leaves are read row by row and become, with ``var="list"``, a list of ``B``
values (``str``, ``bytes``, or a fresh writable numpy array per row), and with
``var="pad"`` a :class:`Padded` pair for ``bytes`` / ``encoded_image`` /
``var_array`` leaves (``str`` leaves stay lists of ``str``).

Pruning (``leaves=``): a dict keeps the keys under which a selected leaf lives;
a list or tuple keeps its selected elements, in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from tbl_format import Leaf, Schema

__all__ = ["VAR_MODES", "Collator", "FixedLeaf", "Padded", "VarLeaf"]

VAR_MODES = ("list", "pad")

_SCALAR_DTYPES = {"int": np.dtype("<i8"), "float": np.dtype("<f8"), "bool": np.dtype("bool")}


class Padded(NamedTuple):
    """A variable-size leaf of a batch in ``var="pad"`` mode.

    ``data``: ``(B, *max_shape)`` array, each row's values at the start of its
    slot and zeros after (uint8 ``(B, max_len)`` for bytes leaves).
    ``lengths``: int64 ``(B, ndim)`` shape of every row for ``var_array`` leaves,
    ``(B,)`` byte count for bytes leaves.
    """

    data: Any
    lengths: Any


class FixedLeaf(NamedTuple):
    slot: int  # position among the selected leaves
    path: str
    dtype: np.dtype
    row_shape: tuple[int, ...]
    row_bytes: int


class VarLeaf(NamedTuple):
    slot: int
    path: str
    leaf: Leaf


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
    return np.array(a)


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
                raise TypeError("leaves must be a list of leaf paths, not a single string")
            wanted = list(leaves)
            unknown = [p for p in wanted if p not in schema.leaves]
            if unknown:
                raise KeyError(f"no leaves {unknown} in this dataset; its leaves are {all_paths}")
            if not wanted:
                raise ValueError("leaves is empty: select at least one leaf")
            chosen = set(wanted)
            paths = [p for p in all_paths if p in chosen]
        self.schema = schema
        self.var_mode = var
        self.paths = paths
        self.fixed: list[FixedLeaf] = []
        self.var: list[VarLeaf] = []
        for slot, path in enumerate(paths):
            leaf = schema.leaves[path]
            if leaf.fixed_size:
                dtype = _SCALAR_DTYPES.get(leaf.kind) or np.dtype(leaf.dtype).newbyteorder("<")
                self.fixed.append(FixedLeaf(slot, path, dtype, leaf.row_shape, leaf.row_bytes))
            else:
                self.var.append(VarLeaf(slot, path, leaf))
        access = _access(schema)
        selected = set(paths)
        slot_of = {p: k for k, p in enumerate(paths)}
        copies = {p for p in paths if schema.leaves[p].kind in ("array", "var_array", "image")} if copy_arrays else set()
        # ds[i] needs no post-processing when every leaf is kept as read and nothing is copied.
        self.identity = len(paths) == len(all_paths) and not copies
        ns: dict[str, Any] = {"COPY": _copy_array}
        select_tree = _pruned(schema, selected, lambda p: f"COPY({access[p]})" if p in copies else access[p])
        build_tree = _pruned(schema, selected, lambda p: f"v[{slot_of[p]}]")
        var_items = "".join(access[v.path] + ", " for v in self.var)
        src = (
            f"def select(s):\n    return {select_tree}\n\n"
            f"def build(v):\n    return {build_tree}\n\n"
            f"def pick_var(s):\n    return ({var_items})\n"
        )
        exec(compile(src, "<tbl pytree collator>", "exec"), ns)
        self.select: Callable[[Any], Any] = ns["select"]
        self.build: Callable[[list[Any]], Any] = ns["build"]
        self.pick_var: Callable[[Any], tuple[Any, ...]] = ns["pick_var"]

    # ---- batches ------------------------------------------------------------------------------
    def var_columns(self, get: Callable[[int], Any], indices: np.ndarray) -> list[Any]:
        """One finished batch value per variable-size leaf (list or Padded), in ``self.var`` order."""
        if not self.var:
            return []
        pick = self.pick_var
        rows = [pick(get(i)) for i in indices.tolist()]
        columns = list(zip(*rows, strict=True)) if rows else [() for _ in self.var]
        return [self._finish(v.leaf, col) for v, col in zip(self.var, columns, strict=True)]

    def _finish(self, leaf: Leaf, values: tuple[Any, ...]) -> Any:
        kind = leaf.kind
        if kind == "str":
            return list(values)
        if kind == "var_array":
            if self.var_mode == "list":
                # Fresh writable copies: the row values are read-only views of the map.
                return [np.array(a) for a in values]
            return _pad_arrays(values, leaf)
        # bytes / encoded_image: bytes objects are already copies.
        if self.var_mode == "list":
            return list(values)
        return _pad_bytes(values)

    def batch(self, shards: Any, indices: np.ndarray) -> Any:
        """The collated pytree of rows ``indices`` (validated contiguous int64) of a ShardSet."""
        n = indices.shape[0]
        values: list[Any] = [None] * len(self.paths)
        for leaf in self.fixed:
            out = np.empty((n, *leaf.row_shape), dtype=leaf.dtype)
            if n and leaf.row_bytes:
                shards.gather(leaf.path, leaf.row_bytes, indices, out.view(np.uint8).reshape(n, leaf.row_bytes))
            values[leaf.slot] = out
        if self.var:
            for v, col in zip(self.var, self.var_columns(shards.get, indices), strict=True):
                values[v.slot] = col
        return self.build(values)


def _pad_arrays(values: tuple[Any, ...], leaf: Leaf) -> Padded:
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


def _pad_bytes(values: tuple[Any, ...]) -> Padded:
    n = len(values)
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=n)
    data = np.zeros((n, int(lengths.max()) if n else 0), dtype=np.uint8)
    for b, v in enumerate(values):
        data[b, : len(v)] = np.frombuffer(v, dtype=np.uint8)
    return Padded(data, lengths)
