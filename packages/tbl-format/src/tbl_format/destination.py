"""Where a writer may write, and which old files it may remove: never what is not a dataset's own.

``check_destination`` is called by ``Writer`` (at construction and again just
before publishing) and by tools that write through it (``tbl convert``) to
refuse a bad destination before any work:

- a destination that exists and is neither a regular file nor a directory
  (a symlink, a FIFO, a device node, a socket) is refused (``DestinationError``):
  it is never replaced by a rename;
- an existing file, or a directory holding a dataset (``manifest.json``), is
  replaced only with ``overwrite=True`` (``DestinationExistsError`` otherwise);
- a file is never replaced by a dataset directory, nor a directory by a file;
- a directory without a manifest is written into; nothing in it is removed.

When a dataset directory is replaced, ``remove_owned_shards`` deletes the old
manifest's shard files only where they are provably the dataset's own: the
directory itself holds them (every path component is a real directory inside
it, the file is a regular file, no symlink is followed) and they start with a
TBL magic. Anything else the old manifest listed stays where it is and is
reported (``Writer.kept``); files the manifest did not list are never touched.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import DestinationError, DestinationExistsError
from .fsutil import file_kind
from .layout import MAGIC, MANIFEST_NAME
from .turboloader import TURBOLOADER_MAGIC

__all__ = ["check_destination", "foreign_shard", "is_temp_name", "remove_owned_shards"]


def is_temp_name(name: str) -> bool:
    """A writer's temporary file or directory name (SPEC.md: starts with '.', contains '.tbl-tmp-')."""
    return name.startswith(".") and ".tbl-tmp-" in name


def check_destination(dst: str | os.PathLike[str], *, directory: bool = False, overwrite: bool = False) -> Path:
    """Check that a dataset may be written to ``dst``; returns ``dst`` as a Path.

    ``directory``: a sharded dataset directory is to be written (else one
    ``.tbl`` file). Raises ``DestinationError`` for a destination that is not a
    regular file or a directory (links are not followed: a link is refused),
    ``DestinationExistsError`` (a ``FileExistsError``) for an existing file or
    dataset without ``overwrite=True``, ``IsADirectoryError`` for a directory
    given as a file destination, ``FileNotFoundError`` when the parent of a
    file destination does not exist.
    """
    dst = Path(dst)
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        if not directory and not dst.parent.is_dir():
            raise FileNotFoundError(f"destination directory {dst.parent} does not exist") from None
        return dst
    if stat.S_ISREG(st.st_mode):
        if directory:
            raise DestinationExistsError(f"{dst} exists and is a file, not a dataset directory")
        if not overwrite:
            raise DestinationExistsError(f"{dst} exists; pass overwrite=True to replace it")
        return dst
    if stat.S_ISDIR(st.st_mode):
        if not directory:
            raise IsADirectoryError(f"{dst} is a directory; pass shard_rows/shard_bytes to write a sharded dataset")
        manifest = dst / MANIFEST_NAME
        try:
            mst = os.lstat(manifest)
        except FileNotFoundError:
            return dst  # not a dataset: written into, nothing removed
        if not stat.S_ISREG(mst.st_mode):
            raise DestinationError(f"{manifest} is {file_kind(mst.st_mode)}; refusing to replace it")
        if not overwrite:
            raise DestinationExistsError(f"{dst} holds a dataset; pass overwrite=True to replace it")
        return dst
    raise DestinationError(f"{dst} is {file_kind(st.st_mode)}; a destination must be a regular file or a directory "
                           "(or not exist yet)")


def remove_owned_shards(directory: Path, names: list[str]) -> list[str]:
    """Unlink each of ``names`` (relative POSIX paths) that ``directory`` itself holds as a TBL file; returns the
    names left in place (a link on the way or at the end, not a regular file, no TBL magic, already gone: not
    returned)."""
    kept = []
    root = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            try:
                removed = _visit_owned(root, name.split("/"), unlink=True) is None
            except FileNotFoundError:
                continue
            except OSError:
                removed = False  # a link on the way (ELOOP, ENOTDIR), no permission: not provably ours
            if not removed:
                kept.append(name)
    finally:
        os.close(root)
    return kept


def foreign_shard(directory: Path, name: str) -> str | None:
    """Why ``directory`` does not itself hold ``name`` as a TBL file (the rule ``remove_owned_shards`` deletes
    by), or None when it does or ``name`` is gone. Removes nothing."""
    root = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _visit_owned(root, name.split("/"), unlink=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{directory / name}: a symlink or a non-folder on the way ({e.strerror or e})"
    finally:
        os.close(root)


def _visit_owned(root: int, parts: list[str], *, unlink: bool) -> str | None:
    """Walk to ``parts`` below the directory ``root`` without following links; None when the end is a regular
    TBL file (then unlinked if ``unlink``), else why not. OSError for a link or non-folder on the way."""
    fds = []
    try:
        parent = root
        for part in parts[:-1]:
            # O_NOFOLLOW: a component that is a symlink fails (ELOOP) instead of leading out of the directory.
            parent = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            fds.append(parent)
        name = parts[-1]
        where = "/".join(parts)
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            return f"{where} is {file_kind(st.st_mode)}"
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        try:
            fst = os.fstat(fd)
            head = os.pread(fd, 8, 0)
        finally:
            os.close(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(fst.st_mode):
            return f"{where} changed while it was checked"
        if head != MAGIC and head[:4] != TURBOLOADER_MAGIC:
            return f"{where} does not start with TBL's magic"
        if unlink:
            os.unlink(name, dir_fd=parent)
        return None
    finally:
        for fd in fds:
            os.close(fd)
