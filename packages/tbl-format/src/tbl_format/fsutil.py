"""Small filesystem helpers shared by the reader, the writer and the manifest."""

from __future__ import annotations

import ctypes
import functools
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

from .errors import InsufficientSpaceError, NotRegularFileError

__all__ = ["ensure_space", "file_kind", "fsync_dir", "open_regular", "read_regular", "start_writeback"]

_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a rename inside it survives a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux), or None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int, offset: int, length: int) -> bool:
    """Ask the kernel to start writing bytes [offset, offset + length) of ``fd`` to disk, without waiting.

    A writer calls it on bytes it will not change again, so that the disk
    writes them while the writer works on and its final fsync finds little
    left: the page cache writes a file back by itself only once its dirty
    pages are 30 s old or a tenth of memory, so without the hint the whole
    file waits for the fsync with the CPUs idle. A hint only: the file's bytes
    are the same with or without it, durability still comes from the fsync
    (which also reports any write error), and where there is no
    ``sync_file_range`` (not Linux) nothing is done. True if the hint was given.
    """
    sync_file_range = _sync_file_range()
    if sync_file_range is None or length <= 0:
        return False
    return sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE) == 0


def file_kind(mode: int) -> str:
    """What a stat mode describes, in words ("a FIFO", "a directory", ...)."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], what: str = "file") -> int:
    """A read-only descriptor of ``path``, which must be a regular file (links followed).

    Anything else raises NotRegularFileError before it is opened (a FIFO would
    block the open, a device may act on it). The open itself is non-blocking and
    the descriptor checked again, so a file swapped for a FIFO in between is
    refused too. OSError (missing, a link loop, no permission) passes through.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFileError(f"{path}: the {what} is {file_kind(st.st_mode)}, not a regular file")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(f"{path}: the {what} is {file_kind(st.st_mode)}, not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], what: str, cap: int) -> tuple[bytes, os.stat_result]:
    """(the bytes of regular file ``path``, its stat); ValueError if it holds more than ``cap`` bytes."""
    fd = open_regular(path, what)
    try:
        st = os.fstat(fd)
        if st.st_size > cap:
            raise ValueError(f"{path}: {st.st_size} bytes, larger than the {cap}-byte cap of a {what}")
        parts = []
        size = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            size += len(chunk)
            if size > cap:
                raise ValueError(f"{path}: larger than the {cap}-byte cap of a {what}")
            parts.append(chunk)
        return b"".join(parts), st
    finally:
        os.close(fd)


def ensure_space(directory: Path, needed: int, what: str) -> None:
    """InsufficientSpaceError unless ``directory``'s file system has ``needed`` bytes free for this user."""
    try:
        st = os.statvfs(directory)
    except (AttributeError, OSError):
        return  # no statvfs here: the write itself reports a full disk
    available = st.f_bavail * st.f_frsize
    if available < needed:
        raise InsufficientSpaceError(
            f"{directory}: {what} needs {_mib(needed)} free, only {_mib(available)} available",
            path=str(directory), needed=needed, available=available,
        )


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB ({n:,} bytes)"
