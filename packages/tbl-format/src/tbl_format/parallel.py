"""write_parallel: parts of one dataset written by a pool of processes, then joined without copying.

Part ``i`` is written from the samples of ``part_fn(i)`` into its own file or
directory in a hidden temporary directory next to ``dst``, by ``write``. When
the parts' inferred schemas differ (one part saw only one shape of a leaf,
another several), every part is brought to the widened schema of all of
them (``schema.widen``): a part whose schema differs is rewritten once from
its finished rows. ``merge_manifests`` then joins the parts (shard files are
hard-linked, never rewritten) and the temporary directory is removed. Rows
keep part order: all of part 0, then part 1, ... Nothing is left behind when
any part fails. Only the standard library is used (``multiprocessing``).

Each part's files carry a distinct ``file_id`` (the part index), so parts of
equal rows still have distinct header checksums and merge. On Linux every
worker ends when the process that called ``write_parallel`` dies
(``die_with_parent``): a killed ``write_parallel`` leaves no worker running.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import secrets
import select
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .dataset import open as open_dataset
from .errors import DestinationExistsError, SchemaMismatchError
from .manifest import merge_manifests
from .schema import Schema, widen
from .writer import write

__all__ = ["die_with_parent", "write_parallel"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """Process-pool initializer: end this worker when process ``parent`` (the pool's creator) dies.

    When ``parent`` is this process's parent (spawn, fork), the kernel kills it
    (Linux ``PR_SET_PDEATHSIG``). When a fork server stands between them (it
    outlives the parent while any worker holds its pipe), a daemon thread waits
    on a pidfd of ``parent`` and exits the worker when it ends. A worker whose
    parent is already gone exits at once. Elsewhere than Linux: a no-op.
    """
    if not sys.platform.startswith("linux"):
        return
    if os.getppid() == parent:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:
                    os._exit(1)  # the parent died before the request took effect
                return
        except (OSError, AttributeError):
            pass
    try:
        pidfd = os.pidfd_open(parent)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        return  # no pidfds (Linux < 5.3): the worker ends when its pool's pipes close
    threading.Thread(target=_exit_when_readable, args=(pidfd,), name="tbl-parent-watch", daemon=True).start()


def _exit_when_readable(fd: int) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while not poller.poll():
        pass
    os._exit(1)


def _part_kwargs(kwargs: dict[str, Any], i: int) -> dict[str, Any]:
    """Keyword arguments of part i's write: its own file_id, so that parts of equal rows stay distinct."""
    given = kwargs.get("file_id")
    return {**kwargs, "file_id": f"{given}/part{i}" if given is not None else f"part{i}"}


def _write_part(part_fn: Callable[[int], Iterable[Any]], i: int, dst: str, kwargs: dict[str, Any]) -> str:
    try:
        return str(write(part_fn(i), dst, **_part_kwargs(kwargs, i)))
    except Exception as exc:
        raise RuntimeError(f"part {i} failed: {type(exc).__name__}: {exc}") from exc


def _rewrite_part(src: str, dst: str, schema_json: Any, kwargs: dict[str, Any]) -> str:
    """Part ``src`` written again to ``dst`` under the wider schema; ``src`` removed."""
    ds = open_dataset(src)
    try:
        out = write(iter(ds), dst, schema=Schema.from_json(schema_json), **kwargs)
    finally:
        ds.close()
    if Path(src).is_dir():
        shutil.rmtree(src)
    else:
        os.unlink(src)
    return str(out)


class _InProcess(Executor):
    """Runs each submitted call at once, in this process (``workers=0``: part_fn need not pickle)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


def _results(futures: list[Future[Any]]) -> list[Any]:
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        raise


def write_parallel(
    part_fn: Callable[[int], Iterable[Any]],
    n_parts: int,
    dst: str | os.PathLike[str],
    *,
    workers: int | None = None,
    mp_context: str = "spawn",
    **write_kwargs: Any,
) -> Path:
    """Write ``n_parts`` parts (``part_fn(i)`` yields part i's samples) in parallel into dataset directory ``dst``.

    ``workers``: processes (default ``min(n_parts, os.cpu_count())``; 0 writes the
    parts one after the other in this process, where ``part_fn`` need not pickle).
    With ``spawn`` (the default) ``part_fn`` must be picklable: a module-level
    function or a ``functools.partial`` of one. Keyword arguments go to
    :func:`tbl_format.write` for every part (give ``schema`` when a part may be empty).
    ``dst`` must not exist yet. Returns ``dst``.
    """
    if isinstance(n_parts, bool) or not isinstance(n_parts, int) or n_parts < 1:
        raise ValueError(f"n_parts must be an int >= 1, got {n_parts!r}")
    dst = Path(dst)
    if os.path.lexists(dst):
        raise DestinationExistsError(f"{dst} already exists")
    if not dst.parent.is_dir():
        raise FileNotFoundError(f"destination directory {dst.parent} does not exist")
    if workers is None:
        workers = min(n_parts, os.cpu_count() or 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers must be an int >= 0, got {workers!r}")
    sharded = write_kwargs.get("shard_rows") is not None or write_kwargs.get("shard_bytes") is not None
    # A hidden name with ".tbl-tmp-" in it, as the writer names its temporaries.
    tmp = dst.parent / f".{dst.name}.tbl-tmp-parts-{secrets.token_hex(4)}"
    tmp.mkdir()
    names = [str(tmp / (f"part-{i:05d}" if sharded else f"part-{i:05d}.tbl")) for i in range(n_parts)]
    try:
        if workers == 0:
            pool: Executor = _InProcess()
        else:
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(mp_context),
                                       initializer=die_with_parent, initargs=(os.getpid(),))
        with pool:
            parts = _results([pool.submit(_write_part, part_fn, i, names[i], write_kwargs) for i in range(n_parts)])
            parts = _unify(pool, parts, tmp, sharded, write_kwargs)
        merge_manifests(parts, dst)
    except BaseException:
        shutil.rmtree(dst, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dst


def _unify(pool: Executor, parts: list[str], tmp: Path, sharded: bool, kwargs: dict[str, Any]) -> list[str]:
    """The parts, each under the widened schema of all of them (rewritten where a part's schema differs)."""
    if kwargs.get("schema") is not None:
        return parts  # a given schema is every part's schema already
    schemas = []
    for p in parts:
        ds = open_dataset(p)
        schemas.append(ds.schema)
        ds.close()
    joined = schemas[0]
    for n, s in enumerate(schemas[1:], start=1):
        wider = widen(joined, s)
        if wider is None:
            raise SchemaMismatchError(f"part {n}: schema {s} cannot share one schema with the parts before it "
                                      f"({joined})")
        joined = wider
    rest = {k: v for k, v in kwargs.items() if k != "variable"}
    futures = {}
    for n, (p, s) in enumerate(zip(parts, schemas, strict=True)):
        if s != joined:
            dst = str(tmp / (f"wide-{n:05d}" if sharded else f"wide-{n:05d}.tbl"))
            futures[n] = pool.submit(_rewrite_part, p, dst, joined.to_json(), _part_kwargs(rest, n))
    out = list(parts)
    for n, path in zip(futures, _results(list(futures.values())), strict=True):
        out[n] = path
    return out
