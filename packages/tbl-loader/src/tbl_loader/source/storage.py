"""Object storage behind one small interface: read, download, upload and list the objects of a dataset URL.

The one library behind it is obstore (the optional extra ``tbl-loader[remote]``;
the core install stays free of it). It speaks S3 (and S3-compatible servers),
Google Cloud Storage, Azure and plain HTTP(S), with each store's standard
credential chain (environment variables, instance metadata, ...).
``storage_options`` are passed to ``obstore.store.from_url`` untouched (for
S3: ``endpoint``, ``region``, ``aws_access_key_id`` ..., ``client_options``,
``retry_config``); TBL writes no credential code.

Why obstore over fsspec + s3fs: against the same loopback S3 server (moto) it
downloaded shard-sized objects about 1.7x faster (``tools/bench_object_stores.py``:
156 vs 91 MiB/s sequential, 188 vs 102 MiB/s with 4 threads, 6 x 32 MiB), it
is one wheel with no Python dependencies (s3fs brings aiobotocore, botocore and
aiohttp), and its calls are synchronous and thread-safe, which suits a fetcher
thread pool.

Errors are translated into the named exceptions below, each naming the URL.

Fork. obstore runs every call on a process-wide runtime whose threads do not
survive ``fork``: in a process forked after its parent used the library (a
DataLoader worker under Linux's default start method, after the training
script opened the dataset), every call would hang. Such a process hands its
calls to a helper process of its own, started with ``spawn`` (a fresh
interpreter, its own runtime) the first time it needs one; downloads land in
the same file, so the shard cache sees no difference. Processes started with
``spawn`` or ``forkserver``, and forked processes whose parent never touched the
library, call it directly.
"""

from __future__ import annotations

import os
import re
from typing import Any, BinaryIO

from ..errors import (
    RemoteError,
    RemoteObjectMissingError,
    RemoteSupportMissingError,
    RemoteUnavailableError,
)

__all__ = ["PIP_REMOTE", "Store", "is_url", "open_store", "redact"]

PIP_REMOTE = 'pip install "tbl-loader[remote]"'
_SCHEMES = ("s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://", "adl://", "azure://", "http://", "https://",
            "file://", "memory://")
_CHUNK = 8 << 20

# The pid of the process whose runtime serves this process's calls: set at the first store made here; a
# forked child inherits the value, and a value that is not its own pid means the runtime is gone.
_RUNTIME_PID: int | None = None
_HELPER: _Helper | None = None  # this process's helper, made on first need


def _runtime_inherited() -> bool:
    """Whether this process was forked after an ancestor started the storage library's runtime."""
    return _RUNTIME_PID is not None and _RUNTIME_PID != os.getpid()


class _Helper:
    """A helper process (``python -m tbl_loader.source.storage``, a fresh interpreter) running Store calls for
    a process whose inherited runtime is gone. Started with subprocess, not multiprocessing: a DataLoader
    worker is a daemonic process, which multiprocessing allows no children. Calls are pickled frames over
    its stdin / stdout, one at a time (a lock: the fetcher's threads share it)."""

    def __init__(self) -> None:
        import subprocess
        import sys
        import threading

        self.pid = os.getpid()
        self.proc = subprocess.Popen([sys.executable, "-m", "tbl_loader.source.storage"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE)
        self.lock = threading.Lock()

    def call(self, url: str, options: dict[str, Any], method: str, args: tuple[Any, ...]) -> Any:
        with self.lock:
            _send(self.proc.stdin, (url, options, method, args))
            reply = _receive(self.proc.stdout)
        if reply is None:
            raise RemoteUnavailableError(f"{redact(url)}: the storage helper process exited (status {self.proc.poll()})")
        ok, value = reply
        if not ok:
            raise value
        return value


def _helper() -> _Helper:
    global _HELPER
    if _HELPER is None or _HELPER.pid != os.getpid():  # an inherited helper belongs to the parent
        _HELPER = _Helper()
    return _HELPER


def _send(stream: Any, value: Any) -> None:
    import pickle

    data = pickle.dumps(value)
    stream.write(len(data).to_bytes(8, "little") + data)
    stream.flush()


def _receive(stream: Any) -> Any:
    """The next frame, or None at the end of the stream."""
    import pickle

    head = stream.read(8)
    if len(head) < 8:
        return None
    return pickle.loads(stream.read(int.from_bytes(head, "little")))


def _serve() -> None:
    """The helper's loop: one Store per URL, calls until its stdin closes (its caller exited)."""
    import sys

    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the channel
    stores: dict[str, Store] = {}
    while (request := _receive(stdin)) is not None:
        url, options, method, args = request
        try:
            store = stores.get(url)
            if store is None:
                store = stores[url] = Store(url, options)
            if method == "download":  # the file by path: the caller's file object stays in the caller
                name, path = args
                with open(path, "r+b") as out:
                    reply = (True, store.download(name, out))
            else:
                reply = (True, getattr(store, method)(*args))
        except Exception as exc:  # the named error travels back and is raised by the caller
            reply = (False, exc)
        try:
            _send(stdout, reply)
        except Exception as exc:  # an exception that does not pickle: its text, under the storage error
            _send(stdout, (False, RemoteError(redact(f"{type(reply[1]).__name__}: {reply[1]} ({exc})"))))


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# Credentials a URL may carry: ``user:password@`` and the query parameters of presigned URLs and SAS tokens.
_USERINFO = re.compile(r"(//)[^/@\s]+@")
# The parameter's value ends at the next parameter, plain or percent-encoded (an error message may quote the
# URL encoded: ``%3F`` ``?``, ``%26`` ``&``, ``%3D`` ``=``).
_SECRET_PARAM = re.compile(r"((?:[?&]|%3F|%26)(?:X-Amz-[A-Za-z-]*|X-Goog-[A-Za-z-]*|sig|signature|token|sv|se|sp|sr|st"
                           r"|skoid|sktid|skt|ske|sks|skv|key|access_?key|secret|password|credential)[A-Za-z_-]*"
                           r"(?:=|%3D))(?:(?!%26)[^&\s'\"])*", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the credentials of any URL in it replaced by ``***`` (user:password, signatures, tokens)."""
    return _SECRET_PARAM.sub(r"\1***", _USERINFO.sub(r"\1***@", text))


def is_url(path: Any) -> bool:
    """Whether ``path`` names a dataset in an object store (a ``scheme://`` string TBL reads through storage).

    A ``scheme://`` string of a scheme TBL does not read (``s4://bucket/x``, a typo) is refused with ValueError
    naming the schemes it reads, never taken as a local folder named ``s4:``."""
    if not isinstance(path, str):
        return False
    if path.lower().startswith(_SCHEMES):
        return True
    found = _SCHEME.match(path)
    if found:
        known = ", ".join(s for s in _SCHEMES if s != "memory://")
        raise ValueError(f"{redact(path)}: unknown URL scheme {found[1]!r}; datasets are read from {known} "
                         "or a local path")
    return False


def _obstore() -> Any:
    try:
        import obstore
        import obstore.store
    except ImportError:
        raise RemoteSupportMissingError(
            f"reading or writing a dataset URL needs the storage library; install it with: {PIP_REMOTE}"
        ) from None
    return obstore


def _translate(exc: BaseException, url: str) -> BaseException:
    """The named TBL error for an obstore exception (or the exception itself)."""
    import obstore.exceptions as oe

    text = redact(" ".join(str(exc).split()))
    url = redact(url)
    if isinstance(exc, (oe.NotFoundError, FileNotFoundError)):
        return RemoteObjectMissingError(f"{url}: no such object ({text[:300]})")
    if isinstance(exc, (oe.PermissionDeniedError, oe.UnauthenticatedError)):
        return RemoteError(f"{url}: access denied ({text[:300]})")
    if isinstance(exc, oe.UnknownConfigurationKeyError):
        return ValueError(f"{url}: storage_options: {text[:300]}")
    if isinstance(exc, (oe.GenericError, oe.BaseError, OSError, TimeoutError)):
        return RemoteUnavailableError(f"{url}: the store cannot be reached or failed ({text[:300]})")
    return exc


class Store:
    """The objects under one dataset URL (a "directory" prefix, or a single object's parent).

    Names are relative to the URL (``"manifest.json"``, ``"shard-00000.tbl"``).
    Thread-safe: the fetcher's threads share one store.
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        global _RUNTIME_PID
        obstore = _obstore()
        self.url = url if url.endswith("/") else url + "/"
        self._options = dict(storage_options or {})
        self._ob = obstore
        self._store = None
        if _runtime_inherited():  # calls go to the helper process (see the module docstring)
            return
        try:
            self._store = obstore.store.from_url(self.url, **self._options)
        except Exception as exc:
            if isinstance(exc, TypeError):  # a value of the wrong type: name the options
                raise ValueError(f"{redact(self.url)}: storage_options {sorted(self._options)}: {exc}") from None
            raise _translate(exc, self.url) from None
        except BaseException as exc:  # a panic inside the storage library (pyo3's PanicException)
            if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            raise ValueError(f"{redact(self.url)}: storage_options {sorted(self._options)} made the storage library "
                             f"fail ({type(exc).__name__}: {redact(str(exc))[:300]})") from None
        if _RUNTIME_PID is None:
            _RUNTIME_PID = os.getpid()

    def _forked(self, method: str, *args: Any) -> Any:
        """``method`` run by this process's helper: the store's runtime did not survive the fork."""
        return _helper().call(self.url, self._options, method, args)

    def where(self, name: str) -> str:
        """Object ``name``'s URL as messages show it: without credentials."""
        return redact(self.url + name)

    def read_bytes(self, name: str) -> bytes:
        if _runtime_inherited():
            return self._forked("read_bytes", name)
        try:
            return bytes(self._ob.get(self._store, name).bytes())
        except Exception as exc:
            raise _translate(exc, self.where(name)) from None

    def size(self, name: str) -> int:
        if _runtime_inherited():
            return self._forked("size", name)
        try:
            return int(self._ob.head(self._store, name)["size"])
        except Exception as exc:
            raise _translate(exc, self.where(name)) from None

    def head(self, name: str) -> dict[str, Any]:
        """Object ``name``'s ``size`` and ``tag``: its identity as the store reports it (the ETag, else the
        version, else the modification time), which changes when the object is written again."""
        if _runtime_inherited():
            return self._forked("head", name)
        try:
            meta = self._ob.head(self._store, name)
        except Exception as exc:
            raise _translate(exc, self.where(name)) from None
        tag = meta.get("e_tag") or meta.get("version") or str(meta.get("last_modified"))
        return {"size": int(meta["size"]), "tag": str(tag)}

    def download(self, name: str, out: BinaryIO) -> int:
        """Stream object ``name`` into the open binary file ``out``; returns the bytes written.

        OSError from writing (a full disk) passes through unchanged: it is the cache's, not the store's.
        """
        if _runtime_inherited():  # the helper writes the same file, by its path
            out.flush()
            written = self._forked("download", name, out.name)
            out.seek(written)
            return written
        try:
            result = self._ob.get(self._store, name)
            chunks = result.stream(min_chunk_size=_CHUNK)
        except Exception as exc:
            raise _translate(exc, self.where(name)) from None
        written = 0
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                break
            except Exception as exc:
                raise _translate(exc, self.where(name)) from None
            out.write(chunk)
            written += len(chunk)
        return written

    def upload(self, name: str, path: str | os.PathLike[str]) -> None:
        """Upload local file ``path`` as object ``name`` (a multipart upload for large files)."""
        if _runtime_inherited():
            return self._forked("upload", name, os.fspath(path))
        try:
            with open(path, "rb") as f:
                self._ob.put(self._store, name, f)
        except OSError:
            raise
        except Exception as exc:
            raise _translate(exc, self.where(name)) from None

    def put_bytes(self, name: str, data: bytes) -> None:
        if _runtime_inherited():
            return self._forked("put_bytes", name, data)
        try:
            self._ob.put(self._store, name, data)
        except Exception as exc:
            raise _translate(exc, self.where(name)) from None


def open_store(url: str, storage_options: dict[str, Any] | None = None) -> Store:
    """A :class:`Store` for ``url`` (RemoteSupportMissingError naming the pip command without the extra)."""
    return Store(url, storage_options)


if __name__ == "__main__":
    _serve()
