"""The local shard cache of remote datasets: checked downloads, atomic publication, LRU eviction by unlink.

Layout (everything under ``<cache_dir>/tbl-cache-v1/``, a folder the cache
creates and owns)::

    <dataset key>/manifest.json     the dataset's manifest, as last read from the store
    <dataset key>/<shard file>      shards exactly as the manifest names them
    .locks/<hash>.lock              one lock file per shard, one for eviction

so a cached dataset is an ordinary TBL dataset directory (``tbl_format.open``
reads it), and a reader maps cached shards zero-copy.

Rules (DESIGN.md, "Remote datasets"):

- A shard is downloaded to a temporary name beside its final name, fsynced,
  checked with ``tbl_format.open`` (header, schema and table checksums always,
  every data block's CRC-32 when ``verify_data``), compared with the manifest
  (rows, header CRC-32, size), and only then renamed into place. A process
  killed mid-download leaves a temporary name, which the next holder of that
  shard's lock removes; nothing half-written is ever under a final name.
- A file that fails its checks is downloaded once more; a second failure raises
  :class:`~tbl_loader.source.storage.RemoteChecksumError` naming the URL.
- Several processes share one cache: a shard's download, check and rename
  happen under that shard's file lock (``filelock``), so the second process to
  ask waits and then finds the file in place: no double download, no torn file.
- Eviction is least-recently-used (a file's mtime is touched on every fetch),
  by unlink only, to keep the bytes on disk within ``cache_limit``; it removes
  only shard files named by a manifest inside this cache's own folder, never
  anything else, and never a shard whose lock another process holds (being
  downloaded or opened). A file already mapped by a reader stays readable
  after it is unlinked (the kernel keeps its pages until the last map goes);
  its disk space is freed then. So ``cache_limit`` must hold at least the
  shards a reader keeps open at once. Room is made and the download's
  temporary file created under one eviction lock, so downloads side by side
  never pass the limit together. A read's own fetch goes over the limit when
  every other file is in use; a download ahead (:meth:`ShardCache.fetch_ahead`,
  a fetcher's read-ahead) then downloads nothing.
- A full disk during a download raises :class:`CacheFullError` and leaves
  nothing behind.
- A cached file is served only while it is the shard the current manifest
  names, checked on every open of it: a regular file (``lstat``; a symbolic
  link or anything else under a shard's name is removed, never followed),
  of the manifest's size, whose header CRC-32 (a header covers the checksums
  of all its data, so this is the shard's content identity) and rows are the
  manifest's. A single ``.tbl`` at a URL has no manifest: its identity is the
  object's ETag (or version, or modification time) as the store reports it,
  recorded beside the cached file at download. Anything else there (an older
  publication of a dataset republished at the same URL with shards of the
  same name and size, a file planted in the cache) is removed and the shard
  downloaded again.
- :meth:`ShardCache.refetch` evicts a cached shard whose data failed a check
  after it was cached (``verify="lazy"`` finding a bad block) and downloads it
  again with every data block checked; a second failure raises
  :class:`RemoteChecksumError` naming the URL. A shard that arrived corrupt is
  so never served again from the cache.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import sys
import threading
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import tbl_format

from ..errors import CacheEntryError, CacheFullError, RemoteChecksumError, RemoteSupportMissingError
from .storage import PIP_REMOTE, Store

__all__ = ["CACHE_FOLDER", "CacheCounters", "ShardCache", "default_cache_dir", "parse_size"]

CACHE_FOLDER = "tbl-cache-v1"
_TMP_MARK = ".tbl-cache-tmp-"
_LOCK_POLL_S = 0.002  # how often a process waiting for a shard's lock held by another process tries again
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def default_cache_dir() -> Path:
    """The platform's user cache folder + ``tbl``: ``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux,
    ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = str(Path.home() / "Library" / "Caches")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tbl"


def parse_size(value: Any) -> int | None:
    """``cache_limit`` in bytes: None (no limit), an int, or a string like ``"50GB"`` / ``"512 MiB"``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"cache_limit must be bytes (int) or a size like '50GB', got {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"cache_limit must be >= 1 byte, got {value}")
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"cache_limit must be bytes (int) or a size like '50GB' or '512MiB', got {value!r}")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size < 1:
        raise ValueError(f"cache_limit must be >= 1 byte, got {value!r}")
    return size


def _filelock() -> Any:
    try:
        import filelock
    except ImportError:
        raise RemoteSupportMissingError(f"the shard cache needs filelock; install it with: {PIP_REMOTE}") from None
    return filelock


def _store_key(url: str, storage_options: dict[str, Any] | None) -> str:
    """The cache folder of one dataset URL on one endpoint (credentials play no part)."""
    opts = storage_options or {}
    endpoint = [str(opts.get(k)) for k in sorted(opts) if "endpoint" in k.lower() or k.lower() in ("region",)]
    text = json.dumps([url.rstrip("/"), endpoint])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


def _tag_file(final: Path) -> Path:
    """Where the object identity of a single-file dataset's cached copy ``final`` is recorded."""
    return final.with_name(f".{final.name}.tbl-cache-tag")


class CacheCounters:
    """What one loader's shard lookups found (``loader.stats()["cache"]``): thread-safe, as read-ahead threads
    and the reader add to the same counters. Counts belong to the process: a pickled copy starts at zero."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.hits = 0  # lookups that found the shard cached
        self.misses = 0  # downloads (a shard that failed its check and was downloaded again: two)
        self.bytes_downloaded = 0
        self.download_seconds = 0.0

    def add(self, *, hits: int = 0, misses: int = 0, nbytes: int = 0, seconds: float = 0.0) -> None:
        with self._lock:
            self.hits += hits
            self.misses += misses
            self.bytes_downloaded += nbytes
            self.download_seconds += seconds

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "bytes_downloaded": self.bytes_downloaded,
                    "download_seconds": self.download_seconds}

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()


class ShardCache:
    """One cache folder shared by every process of a node (see the module docstring).

    ``cache_dir``: default :func:`default_cache_dir`. ``cache_limit``: bytes, a
    string like ``"50GB"``, or None (no limit). ``counters``: the :class:`CacheCounters`
    its lookups add to (default: its own).
    """

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, cache_limit: Any = None,
                 counters: CacheCounters | None = None) -> None:
        self.counters = counters if counters is not None else CacheCounters()
        self._filelock = _filelock()
        self.root = Path(cache_dir if cache_dir is not None else default_cache_dir()) / CACHE_FOLDER
        self.limit = parse_size(cache_limit)
        self.locks = self.root / ".locks"
        self.locks.mkdir(parents=True, exist_ok=True)
        self.downloads = 0  # shards this object downloaded (tests and reports)
        self._count_lock = threading.Lock()

    # ---- locks ------------------------------------------------------------------------------------
    def _lock(self, path: Path) -> Any:
        name = hashlib.sha256(str(path).encode("utf-8")).hexdigest()[:32]
        return self._filelock.FileLock(str(self.locks / f"{name}.lock"))

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        """Hold ``path``'s lock. Waiting for another process polls every few milliseconds: filelock's default
        (50 ms) would stall a reader waiting for a shard another worker is downloading by up to that much."""
        lock = self._lock(path)
        lock.acquire(poll_interval=_LOCK_POLL_S)
        try:
            yield
        finally:
            lock.release()

    def dataset_dir(self, url: str, storage_options: dict[str, Any] | None = None) -> Path:
        """The folder of ``url``'s cached copy (created)."""
        path = self.root / _store_key(url, storage_options)
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ---- the manifest -----------------------------------------------------------------------------
    def store_manifest(self, directory: Path, data: bytes, name: str = "manifest.json") -> Path:
        """Write ``data`` as ``directory/manifest.json`` (atomically, only when it changed).

        A single-file dataset gets ``.tbl-cache-files.json`` instead, naming its one file for eviction."""
        final = directory / name
        with self._locked(final):
            try:
                if final.read_bytes() == data:
                    return final
            except FileNotFoundError:
                pass
            tmp = directory / f".{name}{_TMP_MARK}{secrets.token_hex(4)}"
            try:
                self._write_file(tmp, data)
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
        return final

    # ---- shards -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def holding(self, store: Store, directory: Path, entry: dict[str, Any], *,
                verify_data: bool = False) -> Iterator[Path]:
        """Fetch shard ``entry`` (a manifest entry: file, rows, header_crc32, size) into ``directory`` if it
        is not cached, and yield its path while holding its lock: no process evicts it meanwhile, so the
        caller can open (map) it. Later eviction does not disturb a map."""
        final = directory / entry["file"]
        with self._locked(final):
            self._present(store, final, entry, verify_data, ahead=False)
            yield final

    def fetch(self, store: Store, directory: Path, entry: dict[str, Any], *, verify_data: bool = False) -> Path:
        """:meth:`holding` without keeping the lock: the shard is cached now (it may be evicted later)."""
        with self.holding(store, directory, entry, verify_data=verify_data) as path:
            return path

    def fetch_ahead(self, store: Store, directory: Path, entry: dict[str, Any], *,
                    verify_data: bool = False, wanted: Collection[Path] = ()) -> Path | None:
        """:meth:`fetch` for a shard wanted soon, not now (a fetcher's read-ahead): None, with nothing
        downloaded, when it would not fit within the limit beside the shards in use, the downloads in
        flight and the shards in ``wanted`` (the ones the reads need before this one: evicting those to
        make room would download them twice). A read's own fetch may go over the limit for as long as
        its shards are in use; a download ahead never does."""
        final = directory / entry["file"]
        with self._locked(final):
            return final if self._present(store, final, entry, verify_data, ahead=True, wanted=wanted) else None

    def _present(self, store: Store, final: Path, entry: dict[str, Any], verify_data: bool, *, ahead: bool,
                 wanted: Collection[Path] = ()) -> bool:
        """Make ``final`` the cached shard ``entry`` (its lock is held): False if ``ahead`` and it does not fit."""
        self._remove_temporaries(final)
        if self._cached(final, entry):
            os.utime(final)  # the LRU clock
            self.counters.add(hits=1)
            return True
        return self._download(store, final, entry, verify_data, ahead=ahead, wanted=wanted)

    def refetch(self, store: Store, directory: Path, entry: dict[str, Any]) -> Path:
        """Evict shard ``entry``'s cached file (its data failed a check after it was cached) and download it
        again with every data block checked: RemoteChecksumError naming the URL if that fails twice."""
        final = directory / entry["file"]
        with self._locked(final):
            self._remove_temporaries(final)
            with contextlib.suppress(FileNotFoundError):
                final.unlink()  # a reader's map of it stays valid: the kernel keeps its pages
            self._download(store, final, entry, verify_data=True)
        return final

    def _cached(self, final: Path, entry: dict[str, Any]) -> bool:
        """Whether ``final`` is the shard ``entry`` names (see the module docstring); what is there
        otherwise is removed."""
        try:
            st = os.lstat(final)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            raise CacheEntryError(f"{final}: a folder where the cache keeps a shard; remove it")
        if not stat.S_ISREG(st.st_mode):  # a symbolic link (never followed) or a FIFO, device, socket
            final.unlink()
            return False
        if not self._is_entry(final, st, entry):
            final.unlink()  # an older publication's file of the same name, or one planted: never served
            return False
        return True

    @staticmethod
    def _is_entry(final: Path, st: os.stat_result, entry: dict[str, Any]) -> bool:
        if entry.get("size") is not None and st.st_size != entry["size"]:
            return False
        if entry.get("tag") is not None:  # a single file at a URL: the object's identity at download
            try:
                return _tag_file(final).read_text("utf-8") == entry["tag"]
            except (OSError, UnicodeDecodeError):
                return False
        if entry.get("header_crc32") is None:
            return True
        try:
            ds = tbl_format.open(final)  # header and table checksums; the file is regular (lstat above)
        except (tbl_format.FormatError, OSError):
            return False
        try:
            got = ds.shard_entries[0]
            return got["header_crc32"] == entry["header_crc32"] and got["rows"] == entry["rows"]
        finally:
            ds.close()

    @staticmethod
    def _remove_temporaries(final: Path) -> None:
        """Temporary files of this shard left by a killed process (the lock is held: none is being written)."""
        prefix = f".{final.name}{_TMP_MARK}"
        with contextlib.suppress(FileNotFoundError):
            for other in final.parent.iterdir():
                if other.name.startswith(prefix):
                    other.unlink(missing_ok=True)

    def _download(self, store: Store, final: Path, entry: dict[str, Any], verify_data: bool, *,
                  ahead: bool = False, wanted: Collection[Path] = ()) -> bool:
        """Download, check and publish ``final``; False (nothing done) if ``ahead`` and it does not fit."""
        final.parent.mkdir(parents=True, exist_ok=True)
        problem = ""
        for _attempt in range(2):  # one re-download after a failed check, then a named error
            tmp = self._reserve(final, int(entry.get("size") or 0), ahead=ahead, wanted=wanted)
            if tmp is None:
                return False
            try:
                try:
                    started = time.perf_counter()
                    with open(tmp, "r+b") as out:
                        store.download(entry["file"], out)
                        out.flush()
                        os.fsync(out.fileno())
                        nbytes = out.tell()
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                        raise CacheFullError(
                            f"{self.root}: no space left for {store.where(entry['file'])} ({entry.get('size')} bytes); "
                            f"free space or lower cache_limit"
                        ) from None
                    raise
                with self._count_lock:
                    self.downloads += 1
                self.counters.add(misses=1, nbytes=nbytes, seconds=time.perf_counter() - started)
                problem = self._check(tmp, entry, verify_data)
                if not problem:
                    if entry.get("tag") is not None:  # written first: a shard in place always has its tag
                        tag = _tag_file(final)
                        tag_tmp = tag.with_name(f"{tag.name}{_TMP_MARK}{secrets.token_hex(4)}")
                        try:
                            self._write_file(tag_tmp, entry["tag"].encode("utf-8"))
                            os.replace(tag_tmp, tag)
                        finally:
                            tag_tmp.unlink(missing_ok=True)
                    os.replace(tmp, final)
                    return True
            finally:
                tmp.unlink(missing_ok=True)
        raise RemoteChecksumError(f"{store.where(entry['file'])}: failed its checks twice (downloaded again once): "
                                  f"{problem}")

    @staticmethod
    def _check(path: Path, entry: dict[str, Any], verify_data: bool) -> str:
        """'' when ``path`` is the shard the manifest entry describes, else what is wrong."""
        try:
            ds = tbl_format.open(path, verify=verify_data)
        except tbl_format.FormatError as exc:
            return f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        try:
            got = ds.shard_entries[0]
            if entry.get("rows") is None:  # a single file at a URL: no manifest to compare with
                return ""
            if got["rows"] != entry["rows"]:
                return f"{got['rows']} rows, the manifest says {entry['rows']}"
            if got["header_crc32"] != entry["header_crc32"]:
                return "header CRC-32 differs from the manifest's"
            if entry.get("size") is not None and path.stat().st_size != entry["size"]:
                return f"{path.stat().st_size} bytes, the manifest says {entry['size']}"
            return ""
        finally:
            ds.close()

    @staticmethod
    def _write_file(path: Path, data: bytes) -> None:
        with open(path, "xb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())

    # ---- eviction ---------------------------------------------------------------------------------
    def cached_files(self) -> list[Path]:
        """Every shard file this cache holds: the files its datasets' manifests name, inside its own folder."""
        found = []
        for directory in self.root.iterdir():
            manifest = directory / "manifest.json"
            if not manifest.is_file():
                manifest = directory / ".tbl-cache-files.json"
            if directory.name.startswith(".") or not manifest.is_file():
                continue
            try:
                names = [s["file"] for s in json.loads(manifest.read_text("utf-8"))["shards"]]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            for name in dict.fromkeys(names):
                path = directory / name
                if isinstance(name, str) and ".." not in name.split("/") and path.is_file():
                    found.append(path)
        return found

    def size(self) -> int:
        """Bytes of shard files in the cache now."""
        total = 0
        for path in self.cached_files():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def _in_flight(self, keep: Path) -> dict[Path, int]:
        """The downloads other threads or processes have under way (from their temporary names): the shard
        each will publish, and its expected bytes."""
        flying: dict[Path, int] = {}
        for directory in self.root.iterdir():
            if directory.name.startswith(".") or not directory.is_dir():
                continue
            for path in directory.rglob(f"*{_TMP_MARK}*"):
                name, _, rest = path.name.partition(_TMP_MARK)
                final = path.parent / name[1:]  # ".NAME" + mark + token + "-SIZE"
                if final == keep:
                    continue
                tail = rest.rpartition("-")[2]
                flying[final] = flying.get(final, 0) + (int(tail) if tail.isdigit() else 0)
        return flying

    def _reserve(self, final: Path, size: int, *, ahead: bool = False, wanted: Collection[Path] = ()) -> Path | None:
        """The empty temporary file a ``size``-byte download of ``final`` writes to, created after making room;
        None if ``ahead`` and the room cannot be made (every other file is in use, in flight or ``wanted``).

        The expected size is in its name, so every later eviction counts this download in flight
        against the limit. Room is made and the file created under one eviction lock: two downloads
        that each found room would otherwise both start, together over the limit."""
        tmp = final.parent / f".{final.name}{_TMP_MARK}{secrets.token_hex(4)}-{size}"
        if self.limit is None:
            tmp.touch(exist_ok=False)
            return tmp
        with self._filelock.FileLock(str(self.locks / "evict.lock")):
            if not self._make_room(size, keep=final, wanted=wanted) and ahead:
                return None
            tmp.touch(exist_ok=False)
        return tmp

    def _make_room(self, incoming: int, keep: Path, wanted: Collection[Path] = ()) -> bool:
        """Unlink least-recently-used shards until ``incoming`` more bytes fit within the limit (the eviction
        lock is held), never ``keep`` nor a shard in ``wanted``; whether they fit then (not when the files
        left are in use or wanted)."""
        wanted = set(wanted)
        if incoming > self.limit:
            raise CacheFullError(f"{self.root}: cache_limit {self.limit} bytes cannot hold one {incoming}-byte shard")
        # Downloads in flight first, the published shards second: a download renamed into place between the two
        # scans is seen by both, never by neither, and counted once, as the published file (its shard's lock
        # is held while it downloads, so no other temporary file can stand beside a published shard). Counting
        # it twice made a download ahead look as if it did not fit, under a limit the shards fit exactly.
        in_flight = self._in_flight(keep)
        files = []
        for path in self.cached_files():
            with contextlib.suppress(FileNotFoundError):
                st = path.stat()
                files.append((st.st_mtime_ns, st.st_size, path))
        published = {path for _, _, path in files}
        total = sum(size for _, size, _ in files) + sum(n for final, n in in_flight.items() if final not in published)
        for _, size, path in sorted(files, key=lambda f: (f[0], str(f[2]))):
            if total + incoming <= self.limit:
                break
            if path == keep or path in wanted:
                continue
            lock = self._lock(path)
            try:
                lock.acquire(timeout=0)  # in use by another process (downloading, opening): not evicted
            except self._filelock.Timeout:
                continue
            try:
                path.unlink(missing_ok=True)
                total -= size
            finally:
                lock.release()
        return total + incoming <= self.limit
