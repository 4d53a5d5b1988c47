"""The shard files of one pytree dataset, with a bounded number of them mapped at once.

A dataset is one ``.tbl`` file (or TurboLoader v2 file) or a directory with a
manifest. Each shard is opened on first use through ``tbl_format.open`` and at
most ``max_open`` shards stay mapped; the least recently used one is *closed*
(not merely dropped) when another one is opened. Closing matters: CPython's
``mmap`` holds a duplicate of the file descriptor, and a dropped-but-unclosed
``tbl_format`` shard lingers until the cyclic garbage collector runs (its
generated accessors reference their own namespace), so only explicit closing
keeps the process's descriptor count bounded with thousands of shards.

Rows are addressed globally (shard ``k`` holds rows ``starts[k]`` ..
``starts[k] + rows[k] - 1``). ``gather`` copies fixed-size leaf rows with the
``gather_rows`` kernel straight from the mapped columns: in one call over every
shard when all of them fit in ``max_open``, otherwise in groups of at most
``max_open`` shards, so that the bound holds inside one batch too.

A ``ShardSet`` belongs to one process and one thread (a loader's producer
thread, or the process using a ``PyTreeDataset``); it is never pickled.
"""

from __future__ import annotations

import hashlib
import json
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator
from operator import index as _index
from pathlib import Path
from typing import Any

import numpy as np

import tbl_format
from tbl_format.manifest import read_manifest

from ._kernels import kernels

__all__ = ["DEFAULT_MAX_OPEN", "ShardSet"]

DEFAULT_MAX_OPEN = 64
"""Shards mapped at once by default (each costs one file descriptor and one mapping)."""


class _Open:
    """One mapped shard: its single-file dataset, row getter and uint8 column views."""

    __slots__ = ("dataset", "get", "views")

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.get = dataset.shard(0).get
        self.views: dict[str, np.ndarray] = {}

    def close(self) -> None:
        self.views.clear()
        self.get = None
        self.dataset.close()


class ShardSet:
    """Rows of a dataset file or directory, mapping at most ``max_open`` shards at once."""

    def __init__(self, path: str | Path, *, max_open: int = DEFAULT_MAX_OPEN, verify: bool = False) -> None:
        if isinstance(max_open, bool) or not isinstance(max_open, int) or max_open < 1:
            raise ValueError(f"max_open must be an int >= 1, got {max_open!r}")
        self.path = Path(path)
        self.max_open = max_open
        self._verify = verify
        self._lru: OrderedDict[int, _Open] = OrderedDict()
        self._all_sources: dict[str, list[np.ndarray]] = {}
        if self.path.is_dir():
            manifest = read_manifest(self.path)
            self.schema = manifest["schema"]
            self.metadata = manifest["metadata"]
            entries = manifest["shards"]
            self._files = [self.path / e["file"] for e in entries]
            self._crcs = [e["header_crc32"] for e in entries]
            self.rows_per = [e["rows"] for e in entries]
        else:
            first = _Open(tbl_format.open(self.path, verify=verify))
            self.schema = first.dataset.schema
            self.metadata = first.dataset.metadata
            self._files = [self.path]
            self._crcs = [first.dataset.shard(0).header_crc32]
            self.rows_per = [len(first.dataset)]
            self._lru[0] = first
        starts, total = [], 0
        for r in self.rows_per:
            starts.append(total)
            total += r
        self.starts = starts
        self._starts_arr = np.asarray(starts, dtype=np.int64)
        self._rows_arr = np.asarray(self.rows_per, dtype=np.int64)
        self.num_rows = total
        self.fingerprint = _fingerprint(self.schema, self.metadata, self.rows_per, self._crcs)
        # One file is never evicted (max_open >= 1): its compiled getter is the row reader itself.
        # When every shard fits in max_open nothing is ever evicted either: a plain list of getters
        # replaces the LRU bookkeeping on the ds[i] path.
        if 0 in self._lru:
            self.get = self._lru[0].get
        elif self.num_shards <= max_open:
            self.get = self._all_fit_getter()
        else:
            self.get = self._get_multi

    # ---- shards -------------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        return len(self._files)

    @property
    def open_shards(self) -> int:
        """Shards mapped right now (never more than ``max_open``)."""
        return len(self._lru)

    def _shard(self, k: int) -> _Open:
        lru = self._lru
        shard = lru.get(k)
        if shard is not None:
            lru.move_to_end(k)
            return shard
        if self._all_sources and len(lru) >= self.max_open:
            self._all_sources.clear()  # those views would keep evicted maps alive
        path = self._files[k]
        dataset = tbl_format.open(path, verify=self._verify)
        try:
            if len(dataset) != self.rows_per[k]:
                raise tbl_format.ManifestMismatchError(
                    f"{path}: {len(dataset)} rows, the manifest says {self.rows_per[k]}"
                )
            if dataset.shard(0).header_crc32 != self._crcs[k]:
                raise tbl_format.ManifestMismatchError(f"{path}: header CRC-32 differs from the manifest's")
            if dataset.schema != self.schema:
                raise tbl_format.ManifestMismatchError(f"{path}: schema differs from the manifest's")
            shard = _Open(dataset)
        except BaseException:
            dataset.close()
            raise
        lru[k] = shard
        while len(lru) > self.max_open:
            _, old = lru.popitem(last=False)
            old.close()
        return shard

    def column(self, k: int, leaf_path: str, row_bytes: int) -> np.ndarray:
        """Shard k's column of a fixed-size leaf as a zero-copy ``(rows, row_bytes)`` uint8 view."""
        shard = self._shard(k)
        view = shard.views.get(leaf_path)
        if view is None:
            col = shard.dataset.segments(leaf_path)[0]
            view = col.view(np.uint8).reshape(col.shape[0], row_bytes)
            shard.views[leaf_path] = view
        return view

    # ---- rows ---------------------------------------------------------------------------------
    def _all_fit_getter(self) -> Any:
        starts, n, getters = self.starts, self.num_rows, [None] * self.num_shards
        self._getters = getters
        open_shard = self._shard

        def get(i: Any) -> Any:
            if i.__class__ is not int:
                i = _index(i)
            if i < 0:
                i += n
            if not 0 <= i < n:
                raise IndexError(f"row {i} out of range for {n} rows")
            # Zero-row shards share their start with the next shard: bisect_right lands past them.
            k = bisect_right(starts, i) - 1
            g = getters[k]
            if g is None:
                g = getters[k] = open_shard(k).get
            return g(i - starts[k])

        return get

    def _get_multi(self, i: Any) -> Any:
        if i.__class__ is not int:
            i = _index(i)
        n = self.num_rows
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        starts = self.starts
        # Zero-row shards share their start with the next shard: bisect_right lands past them.
        k = bisect_right(starts, i) - 1
        shard = self._lru.get(k)
        if shard is None:
            shard = self._shard(k)
        else:
            self._lru.move_to_end(k)
        return shard.get(i - starts[k])

    def iter_rows(self) -> Iterator[Any]:
        """Every row in order, decoded a few thousand rows per column at a time."""
        for k, rows in enumerate(self.rows_per):
            if rows:
                # tbl_format's batched in-order decoder (Dataset.__iter__ over the shard file).
                yield from self._shard(k).dataset

    def gather(self, leaf_path: str, row_bytes: int, indices: np.ndarray, out: np.ndarray) -> None:
        """``out[b] = row indices[b]`` of a fixed-size leaf; indices int64, validated, out ``(B, row_bytes)`` uint8."""
        if self.num_shards <= self.max_open:
            sources = self._all_sources.get(leaf_path)
            if sources is None:
                sources = [self.column(k, leaf_path, row_bytes) for k, r in enumerate(self.rows_per) if r]
                self._all_sources[leaf_path] = sources
            kernels.gather_rows(sources, indices, out)
            return
        shard_of = np.searchsorted(self._starts_arr, indices, side="right") - 1
        touched = np.unique(shard_of)
        step = self.max_open
        for a in range(0, touched.shape[0], step):
            group = touched[a : a + step]
            # Rows of the group's shards, addressed in the concatenation of just those shards.
            bases = np.concatenate(([0], np.cumsum(self._rows_arr[group])[:-1]))
            sources = [self.column(int(k), leaf_path, row_bytes) for k in group.tolist()]
            if group.shape[0] == touched.shape[0]:
                pos = np.searchsorted(group, shard_of)
                local = indices - self._starts_arr[shard_of] + bases[pos]
                kernels.gather_rows(sources, np.ascontiguousarray(local, dtype=np.int64), out)
                return
            sel = np.flatnonzero((shard_of >= group[0]) & (shard_of <= group[-1]))
            ks = shard_of[sel]
            local = indices[sel] - self._starts_arr[ks] + bases[np.searchsorted(group, ks)]
            part = np.empty((sel.shape[0], row_bytes), dtype=np.uint8)
            kernels.gather_rows(sources, np.ascontiguousarray(local, dtype=np.int64), part)
            out[sel] = part
            del sources

    def close(self) -> None:
        """Unmap every shard (views still held by callers keep their own map alive until dropped)."""
        self._all_sources.clear()
        getters = getattr(self, "_getters", None)
        if getters is not None:
            getters[:] = [None] * len(getters)
        while self._lru:
            _, shard = self._lru.popitem()
            shard.close()


def _fingerprint(schema: Any, metadata: Any, rows: list[int], crcs: list[int]) -> str:
    """Identity of the dataset's contents from its manifest facts, without mapping any shard."""
    body = {"schema": schema.fingerprint, "metadata": metadata, "rows": rows, "header_crc32": crcs}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
