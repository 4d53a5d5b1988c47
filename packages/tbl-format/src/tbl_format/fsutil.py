"""Small filesystem helpers shared by the reader, the writer and the manifest."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InsufficientSpaceError, NotRegularFileError

__all__ = ["ensure_space", "file_kind", "fsync_dir", "open_regular", "read_regular"]


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a rename inside it survives a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
