"""open_file: one file of a dataset, opened by the reader its first bytes name."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import BadMagicError, TruncatedFileError
from .fsutil import open_regular
from .layout import MAGIC
from .reader import TblFile
from .shard import Shard
from .turboloader import TURBOLOADER_MAGIC, open_turboloader

__all__ = ["open_file"]


def open_file(path: str | Path, *, verify: bool = False) -> Shard:
    """Open one file, dispatching on its magic: a .tbl file (SPEC.md) or a TurboLoader file (TURBOLOADER.md)."""
    path = Path(path)
    fd = open_regular(path)  # never a FIFO or a device: NotRegularFileError
    try:
        head = os.pread(fd, 8, 0)
    finally:
        os.close(fd)
    if head[:4] == TURBOLOADER_MAGIC:
        shard = open_turboloader(path)
        if verify:
            shard.verify()
        return shard
    if head == MAGIC:
        return TblFile(path, verify=verify)
    if len(head) < 8 and MAGIC.startswith(head):
        raise TruncatedFileError(f"{path}: {len(head)} bytes, shorter than the magic")
    raise BadMagicError(f"{path}: not a TBL file (starts with {head!r})")
