"""Dataset: one .tbl file, a TBL v2 file, or a dataset directory, behind one API.

A directory's shards are opened lazily on first access and at most
``max_open`` of them are held open at once (least recently used dropped
first; each open shard holds one map and one descriptor). Dropping a shard
never unmaps memory a caller still holds: a column view from ``segments()``
keeps its map alive until the view dies.

A shard opened again after it was dropped must still be the file the
manifest listed. When it is not (missing, or another header), or when a
shard first opened late cannot be opened and the manifest has been replaced
or removed since the dataset was opened, the dataset changed under the
reader: ``DatasetChangedError`` names it. Shards are not held open by
descriptor to avoid this: a dataset of thousands of shards would exhaust
the process's descriptor limit, which ``max_open`` exists to respect.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterator
from operator import index as _index
from pathlib import Path
from typing import Any

from .errors import (
    DataChecksumError,
    DatasetChangedError,
    FormatError,
    ManifestMismatchError,
    MissingShardError,
)
from .layout import MANIFEST_NAME
from .manifest import read_manifest
from .opener import open_file
from .schema import Schema
from .shard import Progress, Shard, check_rows, fixed_leaf
from .token_index import check_document_index

#: Shard files a dataset maps at once by default (each costs one file descriptor and one mapping).
DEFAULT_MAX_OPEN = 64
# In-order iteration decodes this many bytes' worth of rows per column batch.
_CHUNK_BYTES = 4 << 20
_CHUNK_MAX_ROWS = 4096

__all__ = ["DEFAULT_MAX_OPEN", "Dataset", "open"]


FetchShard = Callable[[int], "str | os.PathLike[str]"]
"""``fetch_shard(k)``: make shard ``k`` of a dataset directory present and return its file's path.
If the file is gone when the dataset opens it (a cache evicted it meanwhile), the hook is called again."""

_FETCH_ATTEMPTS = 3  # calls of a fetch hook for one open of a shard whose file keeps vanishing before it is mapped

ReadAhead = Callable[[list[int]], None]
"""``read_ahead(shards)``: the shards reads will need next, in the order they first need them."""


def open(path: str | os.PathLike[str], *, verify: bool = False, max_open: int = DEFAULT_MAX_OPEN,
         fetch_shard: FetchShard | None = None, read_ahead: ReadAhead | None = None) -> Dataset:
    """Open a .tbl file, a TBL v2 file or a dataset directory; validates headers now (and every checksum if verify).

    ``fetch_shard`` (a dataset directory only): called with a shard's index each time the
    shard is opened, before it is mapped; it returns the path of the shard's file, which it
    may have just made (a cache of a remote dataset downloads it). The file is then checked
    against the manifest like any shard. Without it, shards are the files beside the manifest.
    ``read_ahead`` (with ``fetch_shard``): what :meth:`Dataset.read_ahead` passes its shards
    to, so the fetcher can make them present before they are opened; :meth:`Dataset.close`
    passes it ``[]`` (nothing more is read ahead), and a fetcher stops there, before close returns.
    """
    if read_ahead is not None and fetch_shard is None:
        raise ValueError("read_ahead goes with a fetch_shard hook")
    ds = Dataset(path, verify=verify, max_open=max_open, fetch_shard=fetch_shard, read_ahead=read_ahead)
    ds._open()
    return ds


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells one version of a file from another: its inode, size and modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _restore(path: str, fingerprint: str, max_open: int, fetch_shard: FetchShard | None = None,
             read_ahead: ReadAhead | None = None) -> Dataset:
    return Dataset(path, max_open=max_open, expect_fingerprint=fingerprint, fetch_shard=fetch_shard,
                   read_ahead=read_ahead)


class Dataset:
    """Rows of a dataset as sample pytrees. Build with ``tbl_format.open``.

    ``len(ds)``; ``ds[i]``; ``ds[a:b]`` (a list of rows); ``ds.values(leaf, rows)``; ``iter(ds)``; ``ds.schema``; ``ds.metadata``;
    ``ds.fingerprint``; ``ds.leaf_paths``; ``ds.segments(leaf)``; ``ds.present_segments(leaf)``; ``ds.segment_rows``;
    ``ds.shard_entries``; ``ds.open_shards``; ``ds.verify()``; ``ds.verify_rows(rows, leaves)``; ``ds.read_ahead(shards)``; ``ds.close()``. Pickling keeps the path and the schema
    fingerprint; the unpickled copy maps the files again on first use and
    raises DatasetChangedError if the schema changed meanwhile.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        verify: bool = False,
        max_open: int = DEFAULT_MAX_OPEN,
        expect_fingerprint: str | None = None,
        fetch_shard: FetchShard | None = None,
        read_ahead: ReadAhead | None = None,
    ) -> None:
        if max_open < 1:
            raise ValueError(f"max_open must be >= 1, got {max_open}")
        self.path = Path(path)
        self._verify_at_open = verify
        self._max_open = max_open
        self._expect = expect_fingerprint
        self._fetch_shard = fetch_shard
        self._read_ahead = read_ahead
        self._opened = False
        self._get = self._lazy_get
        self._lock = threading.RLock()

    # ---- opening --------------------------------------------------------------------------------
    def _open(self) -> None:
        self._shards: OrderedDict[int, Shard] = OrderedDict()
        if self.path.is_dir():
            m = read_manifest(self.path)
            self._schema: Schema = m["schema"]
            self._metadata: dict[str, Any] = m["metadata"]
            self._entries = m["shards"]
            self._files = [self.path / s["file"] for s in self._entries]
            self._manifest_stat = _identity(m["stat"])
            self._single = False
        else:
            if self._fetch_shard is not None:
                raise ValueError(f"{self.path}: fetch_shard needs a dataset directory (a manifest), not one file")
            shard = open_file(self.path, verify=self._verify_at_open)
            self._schema, self._metadata = shard.schema, shard.metadata
            self._entries = [{"file": self.path.name, "rows": shard.rows, "header_crc32": shard.header_crc32}]
            self._files = [self.path]
            self._shards[0] = shard
            self._single = True
        if self._expect is not None and self._expect != self._schema.fingerprint:
            raise DatasetChangedError(f"{self.path}: schema changed since this dataset was pickled")
        self._rows_per = [s["rows"] for s in self._entries]
        self._starts = []
        total = 0
        for r in self._rows_per:
            self._starts.append(total)
            total += r
        self._len = total
        self._fingerprint: str | None = None
        self._seen: set[int] = set(self._shards)  # shards opened at least once: opening again must find the same file
        # verify_rows: per shard, one flag per checksummed block (created on first use); leaves checked in full.
        self._block_flags: dict[int, bytearray] = {}
        self._leaf_done: dict[int, set[str]] = {}
        self._leaf_done_count: dict[str, int] = {}
        self._verified_leaves: set[str] = set()
        self._nonempty = sum(1 for r in self._rows_per if r)
        self._get = self._shards[0].get if self._single else self._get_multi
        self._opened = True
        if self._verify_at_open and not self._single:
            self.verify()

    def _ensure(self) -> None:
        if not self._opened:
            with self._lock:
                if not self._opened:
                    self._open()

    def _lazy_get(self, i: Any) -> Any:
        self._ensure()
        return self._get(i)

    def _shard(self, k: int) -> Shard:
        if len(self._entries) <= self._max_open:
            # Nothing is ever evicted, so the LRU order is irrelevant: an open shard needs no
            # lock (a dict lookup is atomic) and random reads stay as fast as on one file.
            shard = self._shards.get(k)
            if shard is not None:
                return shard
        with self._lock:  # loader threads share one dataset; the LRU order must stay consistent
            shard = self._shards.get(k)
            if shard is not None:
                self._shards.move_to_end(k)
                return shard
            return self._open_shard(k)

    def _open_shard(self, k: int) -> Shard:
        shards = self._shards
        entry = self._entries[k]
        where = f"{self._files[k]}"
        try:
            try:
                shard = self._open_file(k)
            except OSError as exc:
                raise MissingShardError(f"{where}: cannot open the shard the manifest lists: "
                                        f"{exc.strerror or exc}") from None
            try:
                if shard.rows != entry["rows"]:
                    raise ManifestMismatchError(f"{where}: {shard.rows} rows, the manifest says {entry['rows']}")
                if shard.header_crc32 != entry["header_crc32"]:
                    raise ManifestMismatchError(f"{where}: header CRC-32 differs from the manifest's")
                if shard.schema != self._schema:
                    raise ManifestMismatchError(f"{where}: schema differs from the manifest's")
            except BaseException:
                shard.close()
                raise
        except FormatError as exc:
            if k in self._seen or self._manifest_changed():
                raise DatasetChangedError(
                    f"{self.path}: the dataset changed while open (shard {entry['file']!r}: {exc}); open it again"
                ) from None
            raise
        self._seen.add(k)
        shards[k] = shard
        # Dropping the reference is enough: the map closes once no view of it is alive.
        while len(shards) > self._max_open:
            shards.popitem(last=False)
        return shard

    def _open_file(self, k: int) -> Shard:
        """Shard ``k``'s file, mapped. A fetch hook's file may be evicted by its cache between the hook's
        return and this open (another reader of the cache made room): the hook is asked again, a bounded
        number of times, before the file counts as missing."""
        if self._fetch_shard is None:
            return open_file(self._files[k])
        for _ in range(_FETCH_ATTEMPTS - 1):
            with contextlib.suppress(FileNotFoundError):
                return open_file(Path(self._fetch_shard(k)))
        return open_file(Path(self._fetch_shard(k)))

    def _manifest_changed(self) -> bool:
        """Whether manifest.json is no longer the one this dataset read (replaced, rewritten or removed)."""
        try:
            return _identity(os.stat(self.path / MANIFEST_NAME)) != self._manifest_stat
        except OSError:
            return True

    # ---- rows -----------------------------------------------------------------------------------
    def _get_multi(self, i: Any) -> Any:
        if i.__class__ is not int:
            i = _index(i)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"row {i} out of range for {self._len} rows")
        k = bisect_right(self._starts, i) - 1
        # Shards with zero rows share their start with the next shard; bisect_right lands past them.
        return self._shard(k).get(i - self._starts[k])

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            # Rows of the slice as a list of samples, with Python's slice rules (as PyTreeDataset's ds[a:b]).
            return [self._get(k) for k in range(*i.indices(len(self)))]
        return self._get(i)

    def values(self, leaf_path: str, rows: list[int]) -> list[Any]:
        """Leaf ``leaf_path`` of each of ``rows`` (ints in ``[0, len)``, else IndexError), in order.

        Each value is what ``ds[i]`` holds at that leaf, read without decoding
        the rest of the row. Rows are read shard by shard, each shard's rows in
        one call.
        """
        self._ensure()
        if leaf_path not in self._schema.leaves:
            raise KeyError(f"no leaf {leaf_path!r}; leaves are {list(self._schema.leaves)}")
        check_rows(rows, self._len)
        if self._single:
            return self._shards[0].values(leaf_path, rows)
        starts = self._starts
        by_shard: dict[int, tuple[list[int], list[int]]] = {}
        for pos, i in enumerate(rows):
            k = bisect_right(starts, i) - 1
            group = by_shard.get(k)
            if group is None:
                group = by_shard[k] = ([], [])
            group[0].append(pos)
            group[1].append(i - starts[k])
        out: list[Any] = [None] * len(rows)
        for k, (positions, local) in by_shard.items():
            for pos, value in zip(positions, self._shard(k).values(leaf_path, local), strict=True):
                out[pos] = value
        return out

    def __len__(self) -> int:
        self._ensure()
        return self._len

    def _chunk_rows(self) -> int:
        row = 0
        for leaf in self._schema.leaves.values():
            row += leaf.row_bytes if leaf.fixed_size else 64
        return max(16, min(_CHUNK_MAX_ROWS, _CHUNK_BYTES // max(row, 1)))

    def __iter__(self) -> Iterator[Any]:
        self._ensure()
        step = self._chunk_rows()
        for k, rows in enumerate(self._rows_per):
            if not rows:
                continue
            shard = self._shard(k)  # held here so LRU eviction elsewhere cannot drop it mid-iteration
            for a in range(0, rows, step):
                yield from shard.read_range(a, min(rows, a + step))

    # ---- metadata -------------------------------------------------------------------------------
    @property
    def schema(self) -> Schema:
        self._ensure()
        return self._schema

    @property
    def metadata(self) -> dict[str, Any]:
        self._ensure()
        return self._metadata

    @property
    def fingerprint(self) -> str:
        """32 hex digits naming this dataset's contents, from the header and manifest alone (nothing is read).

        SHA-256 of the canonical JSON of the row count, the rows per shard, every
        shard's header CRC-32 (which covers the shard's schema, metadata and table
        checksums), the schema fingerprint and the metadata. Loaders record it in
        their state dicts to refuse resuming on another dataset.
        """
        self._ensure()
        if self._fingerprint is None:
            body = {
                "rows": self._len,
                "segment_rows": list(self._rows_per),
                "shard_headers": [entry["header_crc32"] for entry in self._entries],
                "schema": self._schema.fingerprint,
                "metadata": self._metadata,
            }
            text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
            self._fingerprint = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
        return self._fingerprint

    @property
    def leaf_paths(self) -> list[str]:
        return list(self.schema.leaves)

    @property
    def segment_rows(self) -> list[int]:
        self._ensure()
        return list(self._rows_per)

    @property
    def files(self) -> list[Path]:
        self._ensure()
        return list(self._files)

    @property
    def shard_entries(self) -> list[dict[str, Any]]:
        """What the manifest records for each shard file, without opening any: dicts with
        ``file``, ``rows`` and ``header_crc32`` (plus ``size`` for a directory). A single
        file is its own one entry."""
        self._ensure()
        return [dict(e) for e in self._entries]

    @property
    def max_open(self) -> int:
        """The most shard files this dataset holds open (mapped) at once."""
        return self._max_open

    @property
    def open_shards(self) -> int:
        """Shard files this dataset holds open right now (never more than ``max_open``)."""
        return len(self._shards) if self._opened else 0

    def segments(self, leaf_path: str) -> list[Any]:
        """Zero-copy (rows, *shape) column views of a fixed-size leaf, one per shard file."""
        fixed_leaf(self.schema, leaf_path)
        return [self._shard(k).column(leaf_path) for k in range(len(self._entries))]

    def present_segments(self, leaf_path: str) -> list[Any]:
        """Zero-copy (rows,) presence views of an optional leaf, one per shard file (nonzero: a value is stored)."""
        leaf = self.schema.leaves.get(leaf_path)
        if leaf is None:
            raise KeyError(f"no leaf {leaf_path!r}; leaves are {list(self.schema.leaves)}")
        if not leaf.optional:
            raise ValueError(f"leaf {leaf_path!r} is not optional: every row holds a value")
        return [self._shard(k).present(leaf_path) for k in range(len(self._entries))]

    def shard(self, k: int) -> Shard:
        """The k-th shard file (opened if needed)."""
        self._ensure()
        return self._shard(k)

    def verify(self, progress: Progress | None = None) -> None:
        """Check every data-block checksum of every shard, then a token dataset's document index (SPEC.md
        section 9); raises a FormatError subclass on the first failure."""
        self._ensure()
        for k in range(len(self._entries)):
            self._shard(k).verify(progress)
        check_document_index(self)

    def read_ahead(self, shards: list[int]) -> None:
        """Tell the dataset's ``read_ahead`` hook (see :func:`open`) the shards reads will need next, in the
        order they first need them; nothing happens without one (local shards are present already)."""
        if self._read_ahead is not None:
            self._read_ahead([int(k) for k in shards])

    def verify_rows(self, rows: list[int], leaves: list[str] | None = None) -> None:
        """Check the CRC-32 of every data block holding ``leaves`` (default: all) of ``rows``, lazily.

        Each block is checked once per open dataset (a flag per block, per shard;
        a failed block stays unchecked and fails again). Rows are ints in
        ``[0, len)`` (else IndexError). Raises DataChecksumError naming the file,
        the block and the rows asked for that it holds (``exc.path``,
        ``exc.block``, ``exc.rows``: global row numbers). Once every block of the
        leaves asked for is checked the call returns at once, without looking at ``rows``. Safe to call from a
        producer thread while others read: a block two threads check at the same
        time is checked twice, never skipped. TurboLoader files are checked whole,
        once. Tables (offsets, shapes, items, index) are checked at every open.
        """
        self._ensure()
        if leaves is None:
            wanted = self._schema.leaves
        else:
            for leaf in leaves:
                if leaf not in self._schema.leaves:
                    raise KeyError(f"no leaf {leaf!r}; leaves are {list(self._schema.leaves)}")
            wanted = leaves
        if all(leaf in self._verified_leaves for leaf in wanted):
            return
        check_rows(rows, self._len)
        pending = [leaf for leaf in wanted if leaf not in self._verified_leaves]
        if self._single:
            self._verify_shard_rows(0, rows, pending)
            return
        starts = self._starts
        by_shard: dict[int, list[int]] = {}
        for i in rows:
            k = bisect_right(starts, i) - 1
            group = by_shard.get(k)
            if group is None:
                group = by_shard[k] = []
            group.append(i - starts[k])
        for k, local in by_shard.items():
            self._verify_shard_rows(k, local, pending)

    def _verify_shard_rows(self, k: int, local: list[int], leaves: list[str]) -> None:
        done = self._leaf_done.get(k)
        if done is None:
            done = self._leaf_done.setdefault(k, set())
        todo = [leaf for leaf in leaves if leaf not in done]
        if not todo:
            return
        shard = self._shard(k)
        flags = self._block_flags.get(k)
        if flags is None:
            flags = self._block_flags.setdefault(k, shard.block_flags())
        try:
            finished = shard.verify_rows(local, todo, flags)
        except DataChecksumError as exc:
            base = self._starts[k]
            rows = tuple(base + i for i in exc.rows)
            raise DataChecksumError(f"{exc} (dataset rows {list(rows)})" if not self._single else str(exc),
                                    path=exc.path, block=exc.block, rows=rows) from None
        with self._lock:
            for leaf in finished:
                if leaf not in done:
                    done.add(leaf)
                    n = self._leaf_done_count[leaf] = self._leaf_done_count.get(leaf, 0) + 1
                    if n == self._nonempty:
                        self._verified_leaves.add(leaf)

    def close(self) -> None:
        """Release every map this dataset holds and end the read-ahead. A later access opens the files again."""
        if self._read_ahead is not None:
            # No download ahead may outlive the dataset: it would keep reading (and mapping) the cache after
            # the caller is done with it, while the caller may be changing it.
            self._read_ahead([])
        if not self._opened:
            return
        with self._lock:
            for shard in self._shards.values():
                shard.close()
            self._shards.clear()
            self._opened = False
            self._get = self._lazy_get

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        # A copy that was never opened passes its expected fingerprint on without mapping anything.
        fingerprint = self._expect if not self._opened and self._expect else self.schema.fingerprint
        return _restore, (str(self.path), fingerprint, self._max_open, self._fetch_shard, self._read_ahead)

    def __repr__(self) -> str:
        if not self._opened:
            return f"Dataset({str(self.path)!r}, not opened)"
        return f"Dataset({str(self.path)!r}, rows={self._len}, shards={len(self._entries)})"
