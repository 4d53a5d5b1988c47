"""PyTreeDataset: a map-style dataset of sample pytrees, read from memory maps.

``ds[i]`` is the dataset's compiled row accessor (one ``struct`` read per
scalar leaf, zero-copy views for arrays). ``ds.get_batch(indices)`` (also
``ds[list]``, ``ds[array]``, ``ds[slice]`` and ``ds.__getitems__``) returns one
collated pytree: every fixed-size leaf gathered into its own fresh array, all
of them by one ``gather_columns`` kernel call reading straight from the maps,
variable-size leaves as
lists or padded arrays (see :mod:`tbl_loader.pytree.batch`).

Processes. The maps belong to the process that opened them. Pickling (torch
DataLoader ``spawn`` workers) keeps only the path, the options and a
fingerprint of the contents; the copy maps the files again on first use and
raises ``tbl_format.DatasetChangedError`` if the dataset changed meanwhile. A
forked child (``fork`` workers) closes the maps it inherited right after the
fork and opens its own on first use, so no process shares another's
descriptors or LRU state. At most ``max_open`` shards are mapped per process.
``close()`` unmaps everything; a later access maps again.
"""

from __future__ import annotations

import functools
import os
import weakref
from collections.abc import Iterator, Sequence
from operator import index as _index
from pathlib import Path
from typing import Any

import numpy as np

import tbl_format
from tbl_format import DEFAULT_MAX_OPEN

from ..host.batch import PyTreeBatch, pytree_batch
from ..source.fetcher import shards_in_read_order
from ..source.storage import is_url
from ..source.verify import verify_mode
from ..stream.subset import resolve_rows
from .batch import Collator, RowSource, field_paths

__all__ = ["BATCH_FORMATS", "CollatedBatch", "PyTreeDataset", "as_indices", "collate_arrow", "collate_identity",
           "collate_tensors"]

#: What ``PyTreeDataset.get_batch(..., format=)`` returns: the collated pytree, or a pyarrow.RecordBatch.
BATCH_FORMATS = ("pytree", "arrow")

# Datasets holding maps in this process; a forked child closes its inherited copies.
_OPEN: weakref.WeakSet[PyTreeDataset] = weakref.WeakSet()


def _close_inherited() -> None:
    for ds in list(_OPEN):
        ds.close()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited)


def as_indices(indices: Any, num_rows: int) -> np.ndarray:
    """Row indices as a contiguous int64 array; negatives count from the end; IndexError when out of range."""
    if isinstance(indices, range):
        idx = np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
    else:
        idx = np.asarray(indices)
    if idx.ndim != 1:
        raise ValueError(f"indices must be one-dimensional, got shape {idx.shape}")
    if idx.shape[0] == 0:
        return np.empty(0, dtype=np.int64)
    if idx.dtype.kind not in "iu" or idx.dtype == np.bool_:
        raise TypeError(f"indices must be integers, got dtype {idx.dtype}")
    lo, hi = int(idx.min()), int(idx.max())
    if lo < -num_rows or hi >= num_rows:
        bad = lo if lo < -num_rows else hi
        raise IndexError(f"row {bad} out of range for {num_rows} rows")
    idx = np.ascontiguousarray(idx, dtype=np.int64)
    if lo < 0:
        idx = np.where(idx < 0, idx + num_rows, idx)
    return idx


class CollatedBatch(Sequence):
    """What a map-style dataset's ``__getitems__`` returns to torch's DataLoader: the rows of one batch.

    ``collate_identity`` turns it into the batch collated once by the dataset
    (``dataset.get_batch(indices)``: one kernel call per batch). Any other
    ``collate_fn`` (torch's default collate included) sees a sequence of
    ``len(indices)`` samples, each ``dataset.collate_row(indices, k)`` (``ds[indices[k]]`` with writable
    array copies), and collates them as for any map-style dataset: the same values,
    row by row. Nothing is read until one of the two is asked for.
    """

    def __init__(self, dataset: Any, indices: Any) -> None:
        self.dataset = dataset
        self.indices = indices

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self.indices)))]
        return self.dataset.collate_row(self.indices, k)

    @property
    def collated(self) -> Any:
        """The batch as the dataset collates it (``dataset.get_batch(indices)``)."""
        return self.dataset.get_batch(self.indices)


def collate_identity(batch: Any) -> Any:
    """A torch DataLoader ``collate_fn`` for :class:`PyTreeDataset`: the batch, collated once by the dataset.

    Takes the :class:`CollatedBatch` that ``__getitems__`` returns and gives its collated pytree;
    anything else is returned unchanged.
    """
    return batch.collated if isinstance(batch, CollatedBatch) else batch


def collate_arrow(batch: Any) -> Any:
    """A torch DataLoader ``collate_fn`` for :class:`PyTreeDataset`: the batch as a ``pyarrow.RecordBatch``
    (``dataset.get_batch(indices, format="arrow")``); anything else is returned unchanged."""
    if isinstance(batch, CollatedBatch):
        return batch.dataset.get_batch(batch.indices, format="arrow")
    return batch


def collate_tensors(batch: Any) -> Any:
    """Like :func:`collate_identity`, with the arrays as torch tensors (``torch.utils.data.default_convert``,
    zero-copy: the collated arrays are fresh and writable)."""
    from torch.utils.data import default_convert  # only this collate_fn needs torch

    collated = collate_identity(batch)
    if isinstance(collated, PyTreeBatch):  # converted as its plain pytree: a rebuild from items drops .indices
        return pytree_batch(default_convert(collated.tree), default_convert(collated.indices),
                            default_convert(collated.sources))
    return default_convert(collated)


class PyTreeDataset:
    """Map-style dataset over a ``.tbl`` file or dataset directory of sample pytrees.

    ``path``: a ``.tbl`` file, a TurboLoader v2 file or a dataset directory.
    ``fields``: leaf paths to read (default: all); the pytree is pruned to them (``leaves=`` is
    the older name, still accepted).
    ``var``: ``"list"`` or ``"pad"``, how ``get_batch`` returns variable-size leaves.
    ``copy_arrays``: ``ds[i]`` returns writable copies of array leaves instead of
    read-only views of the map. ``max_open``: shards mapped at once.
    ``verify`` (``"never"``, ``"open"``, ``"lazy"``, as on every loader: :mod:`tbl_loader.source.verify`):
    ``"open"`` checks every data checksum of every shard whenever the dataset is opened (on
    creation, and again in a process that maps it after pickling or ``close()``); ``"lazy"``
    checks each data block the first time a read touches it. ``rows`` / ``subsample``: the
    dataset is that subset of rows (:mod:`tbl_loader.stream.subset`): ``len(ds)`` is its size
    and ``ds[i]`` its ``i``-th row. A URL (``s3://bucket/prefix/``, needs ``tbl-loader[remote]``)
    streams through the shard cache (``cache_dir``, ``cache_limit``; ``storage_options`` for
    the store): a read downloads just the shards it touches.

    Return types of ``ds[i]``: int leaves -> ``int``, float -> ``float``, bool ->
    ``bool``, str -> ``str``, bytes and encoded images -> ``bytes``, var_list ->
    ``list``, none -> ``None`` (an optional leaf: None where a row holds None), arrays ->
    numpy arrays that are *read-only views of the map* (``writeable=False``;
    ``torch.from_numpy`` would warn on them: pass ``copy_arrays=True`` or use
    ``get_batch``, whose arrays are always fresh and writable).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fields: list[str] | None = None,
        var: str = "list",
        copy_arrays: bool = False,
        max_open: int = DEFAULT_MAX_OPEN,
        verify: str | bool = "never",
        cache_dir: Any = None,
        cache_limit: Any = None,
        storage_options: dict[str, Any] | None = None,
        rows: Any = None,
        subsample: float | None = None,
        leaves: list[str] | None = None,
    ) -> None:
        fields = field_paths(fields, leaves)
        verify = verify_mode(verify)
        # A URL streams through the local shard cache: a read maps (downloading first) just the shards
        # it needs. The opener is a picklable partial, so a DataLoader worker opens its own client.
        self._open_remote: Any = None
        if is_url(path):
            from ..source.remote import open_streaming

            self.url = path
            self._open_remote = functools.partial(open_streaming, path, cache_dir=cache_dir, cache_limit=cache_limit,
                                                  storage_options=storage_options, verify_data=verify == "open")
        self.path = path if is_url(path) else Path(path)
        self._fields = fields
        self._var = var
        self._copy_arrays = bool(copy_arrays)
        self._max_open = max_open
        self._verify = verify
        self._source: RowSource | None = None
        self._item: Any = None
        self._rows: np.ndarray | None = None
        self._row_copier: Any = None
        source = self._open()
        self._fingerprint = source.fingerprint
        if self._open_remote is not None:
            # Copies (DataLoader workers, pickles) open the dataset this one opened, without reading the
            # manifest from the store again (in a forked worker that would start a storage helper process).
            from ..source.remote import streamed_manifest

            self._open_remote = functools.partial(self._open_remote, manifest=streamed_manifest(source.dataset))
        try:
            self._rows = resolve_rows(source.num_rows, rows, subsample)
        except BaseException:
            self.close()
            raise
        self._len = source.num_rows if self._rows is None else self._rows.shape[0]
        if self._rows is not None:
            self.close()
            self._open()  # the row accessor now maps subset positions to dataset rows

    @classmethod
    def from_loader(cls, loader: Any) -> PyTreeDataset:
        """The map-style twin of a PyTreeLoader: its dataset (a URL through the same cache and storage options),
        leaves, var mode, subset, verify mode and bound on open shards."""
        where = loader.remote_options if is_url(loader.path) else {}
        return cls(loader.path, fields=loader.leaf_paths, var=loader.collator.var_mode, rows=loader.cursor.rows,
                   verify=loader.verify, max_open=loader.max_open, **where)

    # ---- opening ------------------------------------------------------------------------------
    def _open(self) -> RowSource:
        # Always a fresh tbl_format.open (never a reopen of a closed Dataset): the contents are
        # checked against the fingerprint taken at creation before any row is served.
        if self._open_remote is not None:
            dataset = self._open_remote()
            source = RowSource(None, dataset=dataset, own_dataset=True, max_open=min(self._max_open, dataset.max_open))
        else:
            source = RowSource(self.path, max_open=self._max_open, verify=self._verify == "open")
        try:
            expected = getattr(self, "_fingerprint", None)
            if expected is not None and source.fingerprint != expected:
                raise tbl_format.DatasetChangedError(
                    f"{self.path}: the dataset changed since this PyTreeDataset was created"
                )
            collator = Collator(source.schema, self._fields, self._var, self._copy_arrays)
        except BaseException:
            source.close()
            raise
        self._collator = collator
        get = source.get
        if self._verify == "lazy":
            # verify="lazy": a row's data blocks are checked before the first read of them.
            check, paths, n = source.dataset.verify_rows, list(collator.paths), source.num_rows

            def get(i: int, _get: Any = get) -> Any:
                row = i + n if i < 0 else i
                if 0 <= row < n:  # else _get raises the IndexError plain reads raise
                    check([row], paths)
                return _get(i)

        if not collator.identity:
            select = collator.select

            def get(i: int, _get: Any = get, _select: Any = select) -> Any:
                return _select(_get(i))

        if self._rows is not None:
            rows = self._rows

            def get(i: int, _get: Any = get, _rows: np.ndarray = rows) -> Any:
                return _get(int(_rows[i]))  # numpy's rule: negatives from the end, IndexError past it

        self._source = source
        self._item = get
        _OPEN.add(self)
        return source

    def _ensure(self) -> RowSource:
        source = self._source
        return source if source is not None else self._open()

    # ---- rows ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: Any) -> Any:
        item = self._item
        if i.__class__ is int and item is not None:
            return item(i)
        if isinstance(i, slice):
            return self.get_batch(range(*i.indices(self._len)))
        if isinstance(i, (list, tuple, range, np.ndarray)) and not (isinstance(i, np.ndarray) and i.ndim == 0):
            return self.get_batch(i)
        i = _index(i)
        self._ensure()
        return self._item(i)

    def get_batch(self, indices: Any, format: str = "pytree") -> Any:
        """Rows ``indices`` (ints, negative from the end) as one collated pytree (see the module docstring): a
        :class:`~tbl_loader.PyTreeBatch` whose ``indices`` are the dataset rows read.

        Args:
            indices: row indices, a ``range`` or a ``slice``-made range.
            format: ``"pytree"`` (the collated pytree) or ``"arrow"``: a ``pyarrow.RecordBatch`` with one column
                per selected leaf path (``tbl_format.to_arrow_batch``; needs ``tbl-loader[arrow]``). A step-1
                ``range`` within one shard is zero-copy (views of the maps); indices are gathered.
        """
        if format not in BATCH_FORMATS:
            raise ValueError(f"format must be one of {BATCH_FORMATS}, got {format!r}")
        source = self._ensure()
        if format == "arrow":
            return self._arrow_batch(source, indices)
        rows = self._batch_rows(indices)
        if self._verify == "lazy":
            source.dataset.verify_rows(rows.tolist(), list(self._collator.paths))
        return pytree_batch(self._collator.batch(source, rows), rows)

    def _read_ahead(self, positions: np.ndarray, epochs: np.ndarray | None = None) -> None:
        """The positions the next reads take, in order: over a URL their shards download ahead of the reads
        (what a Mix of streamed sources calls); a local dataset has nothing to do. ``epochs``: unused (a row is
        the same in every epoch)."""
        if not is_url(str(self.path)):
            return
        dataset = self._ensure().dataset
        dataset.read_ahead(shards_in_read_order(dataset.segment_rows, self._batch_rows(positions)))

    def _batch_rows(self, indices: Any) -> np.ndarray:
        """The dataset rows of positions ``indices``: a contiguous int64 array of the batch's own (IndexError for a
        position out of range)."""
        rows = as_indices(indices, self._len)
        if self._rows is not None:
            return np.ascontiguousarray(self._rows[rows])
        return rows.copy() if np.shares_memory(rows, np.asarray(indices)) else rows

    def _arrow_batch(self, source: RowSource, indices: Any) -> Any:
        if isinstance(indices, slice):
            indices = range(*indices.indices(self._len))
        if self._rows is not None:
            rows: Any = self._rows[as_indices(indices, self._len)]
        elif isinstance(indices, range) and indices.step == 1:
            if not (0 <= indices.start and indices.stop <= self._len) and len(indices):
                raise IndexError(f"rows {indices.start}..{indices.stop} out of range for {self._len} rows")
            rows = indices
        else:
            rows = as_indices(indices, self._len)
        return tbl_format.to_arrow_batch(source.dataset, rows, leaves=self._collator.paths)

    def __getitems__(self, indices: list[int]) -> CollatedBatch:
        """torch DataLoader's batched fetch (torch >= 2.2): a :class:`CollatedBatch`.

        With ``collate_fn=collate_identity`` the DataLoader yields ``get_batch(indices)``;
        with torch's default collate it collates the rows one by one (same values, slower).
        """
        return CollatedBatch(self, indices)

    def collate_row(self, indices: Any, k: int) -> Any:
        """``ds[indices[k]]`` with writable copies of its array leaves (what a collate_fn may stack or wrap)."""
        i = indices[k]
        if self._row_copier is None:
            self._ensure()
            self._row_copier = Collator(self.schema, self._fields, self._var, copy_arrays=True).select
        source = self._ensure()
        row = int(self._rows[i]) if self._rows is not None else _index(i)
        if self._verify == "lazy":
            source.dataset.verify_rows([row + source.num_rows if row < 0 else row], list(self._collator.paths))
        return self._row_copier(source.get(row))

    def __iter__(self) -> Iterator[Any]:
        """Every row in order, decoded in column batches (much faster than ``ds[i]`` in a loop)."""
        if self._rows is not None:
            return (self[i] for i in range(self._len))
        source = self._ensure()
        collator = self._collator
        if self._verify == "lazy":
            source.dataset.verify_rows(list(range(source.num_rows)), list(collator.paths))
        rows = iter(source)
        if collator.identity:
            return rows
        return map(collator.select, rows)

    # ---- description --------------------------------------------------------------------------
    @property
    def schema(self) -> tbl_format.Schema:
        return self._ensure().schema

    @property
    def metadata(self) -> dict[str, Any]:
        return self._ensure().metadata

    @property
    def leaf_paths(self) -> list[str]:
        """The selected leaves, in schema order."""
        self._ensure()
        return list(self._collator.paths)

    @property
    def fingerprint(self) -> str:
        """The dataset's ``tbl_format.Dataset.fingerprint`` (taken when this PyTreeDataset was created)."""
        return self._fingerprint

    @property
    def open_shards(self) -> int:
        """Shards mapped by this process right now."""
        return 0 if self._source is None else self._source.open_shards

    # ---- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap every shard; the next access maps them again."""
        source, self._source, self._item = self._source, None, None
        _OPEN.discard(self)
        if source is not None:
            source.close()

    def __enter__(self) -> PyTreeDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        source = self.__dict__.get("_source")
        if source is not None:
            source.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_source"] = None
        state["_item"] = None
        state["_row_copier"] = None
        state.pop("_collator", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"PyTreeDataset({str(self.path)!r}, rows={self._len})"
