"""RemoteDataset: a TBL dataset at a URL, served from the local shard cache with few shards mapped at a time.

Opening reads the manifest first (from the store, every time: it is small, and
a dataset republished under the same URL must be seen as such) and keeps it in
the cache; shards are downloaded lazily, through :class:`~tbl_loader.source.cache.ShardCache`
(checked, renamed into place, shared by the node's processes, evicted LRU by
unlink within ``cache_limit``).

To the loaders it looks like a ``tbl_format.Dataset`` (``leaf_paths``,
``schema``, ``metadata``, ``fingerprint`` -- the same as the local copy's --,
``segment_rows``, ``segments``, ``verify_rows``, ``close``), plus two calls the
image loader makes on its producer thread:

- ``schedule(indices)`` at the start of a pass: the rest of the epoch's sample
  ids in order. The background :class:`~tbl_loader.source.fetcher.Fetcher` downloads
  the shards in the order they will be needed, ``lookahead`` shards ahead.
- ``prepare_rows(rows)`` before each batch: every shard holding ``rows`` is
  downloaded (if needed) and mapped, shards no batch needs now are unmapped
  beyond ``max_mapped``;
- ``columns(leaves, rows)`` then: the mapped columns of exactly the shards
  holding ``rows``, and ``rows`` as positions in their concatenation. That is
  all a batch's kernel call sees, so a shard that is not mapped is never read:
  asking for its rows raises :class:`ShardNotMappedError`, and so does
  ``segments(leaf)`` / ``segment(leaf, k)`` for a shard not mapped.

Binding the image columns (shapes, dtypes, rows per shard) reads no pixel:
``layout()`` gives a stand-in dataset for it whose columns are address-space-only
arrays of the right shapes; the loaders never keep them for reading. A single
``.tbl`` file at a URL is downloaded whole.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

import tbl_format

from ..errors import CacheFullError, RemoteChecksumError, ShardNotMappedError
from .cache import CacheCounters, ShardCache
from .fetcher import Fetcher, read_ahead_depth, shards_in_read_order
from .storage import open_store, redact

__all__ = ["RemoteDataset", "RemoteShards", "materialize", "open_remote", "open_streaming"]

MANIFEST = "manifest.json"


class RemoteDataset:
    """A dataset directory (``.../prefix/`` with ``manifest.json``) or one ``.tbl`` file at a URL.

    ``cache_dir`` / ``cache_limit``: see :class:`~tbl_loader.source.cache.ShardCache`.
    ``storage_options``: passed to the storage library (endpoint, region,
    credentials profile, client options). ``verify_data``: check every data
    block's CRC-32 of each downloaded shard before it enters the cache (the
    header and table checksums are always checked). ``lookahead``: shards the
    fetcher keeps downloaded ahead of the reader (default:
    :func:`~tbl_loader.source.fetcher.read_ahead_depth`: every shard when the cache holds the
    dataset, else two thirds of what it holds when ``shard_local`` (the reader's order moves through a
    few shards at a time: a block shuffle or none), else 4); ``concurrency``: parallel downloads; ``max_mapped``: shards kept mapped when no batch needs them (default:
    as many as ``cache_limit`` holds, so unlinked-but-mapped files stay within it too; all
    without a limit). ``counters``: the :class:`~tbl_loader.source.cache.CacheCounters` its
    lookups add to (a loader's ``stats()["cache"]``; default: its cache's own). ``manifest``: the
    manifest's bytes as another process of the same job read them (``options`` carries them), so
    a DataLoader worker or a copy opens the dataset its parent opened without asking the store;
    None reads it from the store.
    """

    def __init__(self, url: str, *, cache_dir: Any = None, cache_limit: Any = None,
                 storage_options: dict[str, Any] | None = None, verify_data: bool = False,
                 lookahead: int | None = None, concurrency: int = 4, max_mapped: int | None = None,
                 counters: CacheCounters | None = None, manifest: bytes | None = None,
                 shard_local: bool = False) -> None:
        self.url = url
        # What another process needs to open the same dataset on the same cache (ImageDataset pickles it);
        # the manifest's bytes join it below.
        self.options: dict[str, Any] = {"cache_dir": cache_dir, "cache_limit": cache_limit,
                                        "storage_options": storage_options, "verify_data": verify_data}
        self.cache = ShardCache(cache_dir, cache_limit, counters)
        self.verify_data = bool(verify_data)
        self._single = single = not url.endswith("/") and url.lower().endswith(".tbl")
        base, _, name = url.rpartition("/") if single else (url, "", "")
        self.store = open_store(base, storage_options)
        self.local_dir = self.cache.dataset_dir(url, storage_options)
        if single:
            head = self.store.head(name)  # no manifest: the object's ETag is its identity in the cache
            entry = {"file": name, "rows": None, "header_crc32": None, "size": head["size"], "tag": head["tag"]}
            self.cache.store_manifest(self.local_dir, _file_list(name), name=".tbl-cache-files.json")
            path = self.cache.fetch(self.store, self.local_dir, entry, verify_data=self.verify_data)
            self._meta = tbl_format.open(path)
            self._entries = [{**self._meta.shard_entries[0], "size": entry["size"]}]
        else:
            if manifest is None:
                manifest = self.store.read_bytes(MANIFEST)
            self.options["manifest"] = manifest
            self.cache.store_manifest(self.local_dir, manifest)
            self._meta = tbl_format.open(self.local_dir)  # reads the manifest only
            self._entries = self._meta.shard_entries
        rows = self._meta.segment_rows
        if max_mapped is None:  # as many as the cache holds: a warm cache serves with no map churn
            largest = max((e.get("size") or 0 for e in self._entries), default=0) or 1
            limit = self.cache.limit
            max_mapped = len(self._entries) if limit is None else max(1, limit // largest)
        self.max_mapped = max(1, int(max_mapped))
        self._starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]).astype(np.int64)
        self._counts = np.diff(self._starts)
        self._columns: dict[tuple[int, str], Any] = {}  # (shard, leaf) -> column view of a mapped shard
        self._lock = threading.RLock()
        self._mapped: OrderedDict[int, Any] = OrderedDict()  # shard -> open single-file tbl_format.Dataset
        self._templates: dict[str, np.ndarray] = {}
        self._prepared: list[int] = []  # the shards the last prepare_rows mapped
        self._nonempty = [k for k, count in enumerate(self._counts.tolist()) if count]
        self._whole: dict[tuple[str, ...], dict[str, list[Any]]] = {}  # by leaves: see _whole_columns
        if lookahead is None:
            lookahead = read_ahead_depth(self._entries, self.cache.limit, self.max_mapped, shard_local=shard_local)
        self.fetcher = Fetcher(self._prefetch, lookahead=lookahead, concurrency=concurrency)
        self._closed = False

    # ---- what the manifest says ---------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._meta)

    dataset = property(lambda self: self, doc="The dataset behind this shard source: itself.")
    schema = property(lambda self: self._meta.schema)
    metadata = property(lambda self: self._meta.metadata)
    fingerprint = property(lambda self: self._meta.fingerprint, doc="The local copy's ``Dataset.fingerprint``.")
    leaf_paths = property(lambda self: self._meta.leaf_paths)
    segment_rows = property(lambda self: self._meta.segment_rows)
    shard_entries = property(lambda self: [dict(e) for e in self._entries])

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        """The shard index of every row (int64)."""
        return np.searchsorted(self._starts, np.asarray(rows, dtype=np.int64), side="right") - 1

    # ---- shards -------------------------------------------------------------------------------------
    def _prefetch(self, k: int, wanted: list[int]) -> None:
        if k in self._mapped:  # mapped here already: its bytes are at hand, nothing to fetch or lock
            return
        if self._entries[k]["rows"]:
            self.cache.fetch_ahead(self.store, self.local_dir, self._entries[k], verify_data=self.verify_data,
                                   wanted=[self.local_dir / self._entries[j]["file"] for j in wanted])

    def _map(self, k: int) -> Any:
        """Shard ``k`` open (downloaded first if it is not cached); most recently used."""
        shard = self._mapped.get(k)
        if shard is not None:
            self._mapped.move_to_end(k)
            return shard
        entry = self._entries[k]
        self.fetcher.join(k)
        with self.cache.holding(self.store, self.local_dir, entry, verify_data=self.verify_data) as path:
            shard = tbl_format.open(path)  # mapped under the shard's lock: no process evicts it first
        self._mapped[k] = shard
        return shard

    def _unmap_beyond(self, keep: set[int]) -> None:
        for k in list(self._mapped):
            if len(self._mapped) <= self.max_mapped:
                break
            if k not in keep:
                for leaf in self._meta.leaf_paths:
                    self._columns.pop((k, leaf), None)
                self._whole.clear()
                self._mapped.pop(k).close()  # the map goes when the last view of it goes

    def _locate(self, rows: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``rows`` as int64, the shard of each, and the shards they touch (ascending)."""
        ids = np.asarray(rows, dtype=np.int64).reshape(-1)
        shard = self.shard_of(ids)
        return ids, shard, np.unique(shard)

    def _prepare(self, used: np.ndarray) -> None:
        shards = used.tolist()
        with self._lock:
            # Consecutive batches mostly read the same few shards: then they are mapped already (only this
            # call unmaps) and the fetcher's position has not moved.
            if shards == self._prepared:
                return
            # A batch over many shards (a global shuffle) downloads them side by side, as many at a time
            # as the cache holds beside the maps, each group mapped (so held) before the next evicts.
            missing = [k for k in shards if k not in self._mapped]
            width = max(1, self.max_mapped - 1)
            for at in range(0, len(missing), width):
                group = missing[at:at + width]
                if len(group) > 1:
                    self.fetcher.fetch_now(group)
                for k in group:
                    self._map(k)
            for k in shards:
                self._map(k)
            self._unmap_beyond(set(shards))
            self._prepared = shards
        self.fetcher.reached(shards)

    def prepare_rows(self, rows: Any) -> None:
        """Map every shard holding ``rows`` (downloading what is not cached); tell the fetcher where we are."""
        self._prepare(self._locate(rows)[2])

    # ---- the shard-source protocol (tbl_loader.source.local) -----------------------------------------
    def begin_pass(self, epoch_order: Any, leaf: str, batch_size: int) -> None:
        """The fetcher downloads the pass's shards in the order its batches first read them."""
        self.schedule(epoch_order.dataset_rows)

    def before_batch(self, number: int) -> None:
        """Nothing: a batch maps its shards itself (``batch_columns``)."""

    def end_pass(self) -> None:
        """Nothing: the fetcher follows the next pass's schedule."""

    def schedule(self, indices: Any) -> None:
        """The rest of the epoch's sample ids, in order: the fetcher downloads its shards in that order."""
        if self._all_mapped():  # nothing will be fetched
            return
        self.fetcher.schedule(shards_in_read_order(self._counts, indices))

    def _template(self, leaf: str) -> np.ndarray:
        """One real column of ``leaf`` (its dtype and row shape), from the first non-empty shard."""
        template = self._templates.get(leaf)
        if template is None:
            k = next((k for k, e in enumerate(self._entries) if e["rows"]), 0)
            with self._lock:
                template = self._map(k).segments(leaf)[0]
            self._templates[leaf] = template = template[:0]
        return template

    def _not_mapped(self, k: int, leaf: str) -> ShardNotMappedError:
        return ShardNotMappedError(f"{self.store.where(self._entries[k]['file'])}: leaf {leaf!r} of shard {k} was "
                                   f"read while the shard is not mapped (prepare_rows(rows) maps it)")

    def segment(self, leaf: str, k: int) -> Any:
        """Shard ``k``'s column of fixed-size ``leaf`` (ShardNotMappedError when shard ``k`` is not mapped)."""
        with self._lock:
            column = self._columns.get((k, leaf))
            if column is None:
                shard = self._mapped.get(k)
                if shard is None:
                    raise self._not_mapped(k, leaf)
                column = self._columns[(k, leaf)] = shard.segments(leaf)[0]
            return column

    def segments(self, leaf: str) -> list[Any]:
        """Every shard's column of ``leaf`` (ShardNotMappedError unless every non-empty shard is mapped)."""
        rows = self._meta.segment_rows
        with self._lock:
            return [self.segment(leaf, k) if rows[k] else self._template(leaf) for k in range(len(rows))]

    def columns(self, leaves: list[str], rows: Any) -> tuple[dict[str, list[Any]], np.ndarray]:
        """The columns a batch of ``rows`` reads: for each leaf, the columns of the shards holding ``rows``
        (ascending shard order), and ``rows`` as int64 positions in their concatenation.

        ShardNotMappedError when one of those shards is not mapped (``prepare_rows(rows)`` maps them)."""
        return self._gather(leaves, *self._locate(rows))

    def batch_columns(self, leaves: list[str], rows: Any) -> tuple[dict[str, list[Any]], np.ndarray]:
        """What a batch does: ``prepare_rows(rows)`` then ``columns(leaves, rows)``, the rows located once.

        The lists returned may be the same objects batch after batch (read them, do not change them)."""
        whole = self._whole_columns(leaves)
        if whole is not None:
            return whole, np.ascontiguousarray(rows, dtype=np.int64)
        ids, shard, used = self._locate(rows)
        self._prepare(used)
        return self._gather(leaves, ids, shard, used)

    def _all_mapped(self) -> bool:
        """Whether every shard holding rows is mapped (only those are ever mapped)."""
        return len(self._mapped) >= len(self._nonempty)

    def _whole_columns(self, leaves: list[str]) -> dict[str, list[Any]] | None:
        """Every non-empty shard's columns when all of them are mapped, else None.

        A warm cache that holds the whole dataset ends up with every shard mapped, and then nothing is
        unmapped again (only more than ``max_mapped`` maps are). A batch then reads the columns as a local
        dataset's are read, its rows as they are: nothing to locate or map batch by batch."""
        with self._lock:
            if not self._all_mapped():
                return None
            key = tuple(leaves)
            found = self._whole.get(key)
            if found is None:
                found = self._whole[key] = {leaf: [self.segment(leaf, k) for k in self._nonempty] for leaf in leaves}
            return found

    def _gather(self, leaves: list[str], ids: np.ndarray, shard: np.ndarray,
                used: np.ndarray) -> tuple[dict[str, list[Any]], np.ndarray]:
        shards = used.tolist()
        with self._lock:
            found = {leaf: [self.segment(leaf, k) for k in shards] for leaf in leaves}
        counts = self._counts[used]
        # Row r of shard k sits at r - starts[k] + (rows of the used shards before k) in the concatenation.
        shift = np.zeros(self._counts.shape[0], dtype=np.int64)
        shift[used] = np.cumsum(counts) - counts - self._starts[used]
        return found, ids + shift[shard]

    def layout(self) -> _Layout:
        """A stand-in of this dataset for binding columns (shapes, dtypes, rows per shard): see the module
        docstring. Its arrays are never read for samples."""
        return _Layout(self)

    def verify_rows(self, rows: list[int], leaves: list[str] | None = None, *, heal: bool = True) -> None:
        """``tbl_format.Dataset.verify_rows`` shard by shard (the shards are mapped first).

        A block that fails is the cached copy's fault until shown otherwise: the shard is evicted and
        downloaded again with every block checked (``ShardCache.refetch``; RemoteChecksumError naming the
        URL when the store's copy fails too), then, with ``heal``, mapped anew and checked again. Without
        ``heal`` (another reader may hold the old file mapped) RemoteChecksumError is raised after the
        download: the next open reads the new copy."""
        ids = np.asarray(rows, dtype=np.int64)
        shards = self.shard_of(ids)
        with self._lock:
            for k in np.unique(shards).tolist():
                local = (ids[shards == k] - self._starts[k]).tolist()
                try:
                    self._map(int(k)).verify_rows(local, leaves)
                except tbl_format.DataChecksumError as exc:
                    self._unmap(int(k))
                    self.refetch(int(k), exc)
                    if not heal:
                        raise self._refetched(int(k), exc) from None
                    self._map(int(k)).verify_rows(local, leaves)

    def refetch(self, k: int, exc: tbl_format.DataChecksumError) -> None:
        """Shard ``k``'s cached copy failed a data check (``exc``): evict it and download it again, checked."""
        self.cache.refetch(self.store, self.local_dir, self._entries[k])

    def _refetched(self, k: int, exc: tbl_format.DataChecksumError) -> RemoteChecksumError:
        return RemoteChecksumError(
            f"{self.store.where(self._entries[k]['file'])}: the cached copy failed a data check "
            f"({' '.join(str(exc).split())}); the shard was downloaded again, checked, and replaces it: "
            "open the dataset again to read the new copy")

    def evicting(self, verify: Any) -> Any:
        """``verify`` (a lazy check by another reader of this cache: the streaming dataset of heap rows) with a
        failed block's shard evicted and downloaded again, checked, before RemoteChecksumError is raised: that
        reader may hold the old file mapped, so this run stops, and the next open reads the new copy."""

        def check(rows: list[int], leaves: list[str] | None = None) -> None:
            try:
                verify(rows, leaves)
            except tbl_format.DataChecksumError as exc:
                k = int(self.shard_of(np.asarray(exc.rows[:1] or rows[:1]))[0])
                self.refetch(k, exc)
                raise self._refetched(k, exc) from None

        return check

    def _unmap(self, k: int) -> None:
        """Forget shard ``k``'s map and the column views made of it (views a caller holds keep it alive)."""
        for leaf in self._meta.leaf_paths:
            self._columns.pop((k, leaf), None)
        self._whole.clear()
        self._prepared = []
        shard = self._mapped.pop(k, None)
        if shard is not None:
            shard.close()

    def ensure_all(self) -> Path:
        """Download every shard into the cache; the local dataset path (the folder, or the one file).

        The whole dataset must fit ``cache_limit`` (CacheFullError otherwise): what is
        returned is then read as an ordinary local dataset.
        """
        total = sum(e.get("size") or 0 for e in self._entries)
        if self.cache.limit is not None and total > self.cache.limit:
            raise CacheFullError(f"{redact(self.url)}: the whole dataset ({total} bytes) does not fit cache_limit "
                                 f"({self.cache.limit} bytes); raise the limit, or stream it with ImageLoader")
        for entry in self._entries:
            if entry["rows"]:
                self.cache.fetch(self.store, self.local_dir, entry, verify_data=self.verify_data)
        return self.local_dir / self._entries[0]["file"] if self._single else self.local_dir

    @property
    def mapped_shards(self) -> list[int]:
        return list(self._mapped)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.fetcher.close()
        with self._lock:
            self._columns.clear()
            self._whole.clear()
            self._prepared = []
            for shard in self._mapped.values():
                shard.close()
            self._mapped.clear()
        self._meta.close()

    def __enter__(self) -> RemoteDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Layout:
    """A remote dataset's schema, leaves and column shapes, for ``ImageSpec.bind``: each shard's column is an
    array of the right shape and dtype made by ``np.zeros`` (calloc: address space, no memory), never read.
    The loaders read a remote dataset through ``RemoteDataset.columns`` only."""

    def __init__(self, remote: RemoteDataset) -> None:
        self.leaf_paths = remote.leaf_paths
        self.schema = remote.schema
        self.metadata = remote.metadata
        self._remote = remote

    def segments(self, leaf: str) -> list[np.ndarray]:
        template = self._remote._template(leaf)
        return [np.zeros((rows, *template.shape[1:]), dtype=template.dtype) for rows in self._remote.segment_rows]


def _file_list(name: str) -> bytes:
    import json

    return json.dumps({"shards": [{"file": name}]}).encode("utf-8")


def open_remote(url: str, **options: Any) -> RemoteDataset:
    """A :class:`RemoteDataset` for ``url`` (keywords as its constructor's)."""
    return RemoteDataset(url, **options)


def materialize(url: str, **options: Any) -> Path:
    """The whole dataset at ``url`` in the local cache (downloaded as needed); its local path.

    The resolver of ``tbl inspect URL`` / ``tbl verify URL`` (entry point group
    ``tbl.url_resolvers``), and what ``PyTreeDataset(URL)`` reads. The store is
    configured by its standard environment variables when ``storage_options``
    is not given.
    """
    with RemoteDataset(url, **options) as remote:
        return remote.ensure_all()


class RemoteShards:
    """The ``fetch_shard`` hook of a dataset at a URL: shard ``k``'s file in the local cache, downloaded if needed.

    With it, ``tbl_format.open(cache folder, fetch_shard=..., max_open=...)`` reads a remote
    dataset exactly as a local one (Mosaic's model: a remote fills a local directory): every
    row, column or heap read maps the shard it needs, downloading it first, and the dataset's
    own bound on open shards keeps the maps within what the cache holds. Picklable and
    fork-safe: the storage client, the cache handle and the fetcher are made in the process
    that first fetches (a storage client does not survive fork), so DataLoader workers under
    fork, spawn or forkserver each open their own.

    Read-ahead: :meth:`read_ahead` (``tbl_format.Dataset.read_ahead``'s hook) hands the
    fetcher the order of the shards a pass will read; each shard the dataset then opens tells
    it how far the reads are, and it keeps ``lookahead`` shards downloaded or downloading
    beyond that (``concurrency`` at a time).
    """

    def __init__(self, url: str, local_dir: Path, entries: list[dict[str, Any]], *, cache_dir: Any,
                 cache_limit: Any, storage_options: dict[str, Any] | None, verify_data: bool,
                 lookahead: int = 4, concurrency: int = 4, counters: CacheCounters | None = None) -> None:
        self.url = url
        self.counters = counters if counters is not None else CacheCounters()
        self.local_dir = Path(local_dir)
        self.entries = [dict(e) for e in entries]
        self.cache_dir, self.cache_limit = cache_dir, cache_limit
        self.storage_options = storage_options
        self.verify_data = bool(verify_data)
        self.lookahead, self.concurrency = lookahead, concurrency
        self._pid: int | None = None
        self._store: Any = None
        self._cache: ShardCache | None = None
        self._fetcher: Fetcher | None = None
        self._lock = threading.Lock()

    def _clients(self) -> tuple[Any, ShardCache, Fetcher]:
        with self._lock:
            if self._pid != os.getpid():
                self._cache = ShardCache(self.cache_dir, self.cache_limit, self.counters)
                self._store = open_store(self.url, self.storage_options)
                # An inherited fetcher's threads did not survive fork: this process makes its own.
                self._fetcher = Fetcher(self._download, lookahead=self.lookahead, concurrency=self.concurrency)
                self._pid = os.getpid()
            return self._store, self._cache, self._fetcher

    @property
    def cache(self) -> ShardCache:
        return self._clients()[1]

    def _download(self, k: int, wanted: list[int]) -> None:
        store, cache, _ = self._clients()
        cache.fetch_ahead(store, self.local_dir, self.entries[k], verify_data=self.verify_data,
                          wanted=[self.local_dir / self.entries[j]["file"] for j in wanted])

    def __call__(self, k: int) -> Path:
        store, cache, fetcher = self._clients()
        fetcher.join(k)  # a download of this shard under way here: wait for it rather than queue behind its lock
        path = cache.fetch(store, self.local_dir, self.entries[k], verify_data=self.verify_data)
        fetcher.reached([k])
        return path

    def read_ahead(self, shards: list[int]) -> None:
        """The shards the next reads need, in order: the fetcher downloads them ahead of the reads. Empty
        (what ``Dataset.close`` passes): this process's fetcher stops once its downloads under way end."""
        if not shards:
            self.close()
            return
        self._clients()[2].schedule(shards)

    def close(self) -> None:
        """Stop this process's downloads ahead (the shards already cached stay)."""
        with self._lock:
            fetcher, self._fetcher, self._pid = self._fetcher, None, None
        if fetcher is not None:
            fetcher.close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.update(_pid=None, _store=None, _cache=None, _fetcher=None, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()


def streamed_manifest(dataset: tbl_format.Dataset) -> bytes | None:
    """The manifest bytes of a dataset :func:`open_streaming` opened (its cache folder's copy): what a copy of
    the reader in another process passes as ``manifest`` to open the same dataset without asking the store.
    None for a single ``.tbl`` file, which has no manifest."""
    path = Path(dataset.path)
    return (path / MANIFEST).read_bytes() if path.is_dir() else None


def open_streaming(url: str, *, cache_dir: Any = None, cache_limit: Any = None,
                   storage_options: dict[str, Any] | None = None, verify_data: bool = False,
                   counters: CacheCounters | None = None, manifest: bytes | None = None) -> tbl_format.Dataset:
    """The dataset at ``url`` as a ``tbl_format.Dataset`` over the local cache, each shard fetched when first read.

    The manifest is read from the store now (every time: a republished dataset is seen as
    such), unless ``manifest`` gives the bytes another process of the job read (see
    :class:`RemoteDataset`); no shard is downloaded until a read needs it, and at most as many
    shards stay mapped as ``cache_limit`` holds. A single ``.tbl`` file at a URL is downloaded
    whole. ``counters``: the :class:`~tbl_loader.source.cache.CacheCounters` its shard lookups add to.
    """
    with RemoteDataset(url, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options,
                       verify_data=verify_data, lookahead=0, counters=counters, manifest=manifest) as remote:
        if remote._single:
            return tbl_format.open(remote.local_dir / remote._entries[0]["file"])
        depth = read_ahead_depth(remote.shard_entries, remote.cache.limit, remote.max_mapped)
        hook = RemoteShards(url, remote.local_dir, remote.shard_entries, cache_dir=cache_dir, cache_limit=cache_limit,
                            storage_options=storage_options, verify_data=verify_data, counters=counters,
                            lookahead=depth)
        return tbl_format.open(remote.local_dir, max_open=remote.max_mapped, fetch_shard=hook,
                               read_ahead=hook.read_ahead)
