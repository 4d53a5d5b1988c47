"""The epoch loop shared by the convert suite's subjects: one conversion per epoch into a fresh destination.

Each epoch converts into a new path in the workload's own temp folder. The
previous epoch's output is deleted in ``prepare_epoch``, which the runner
does not time: deleting is not converting, and dropping 768 MiB took
~0.25 s here, charged to whoever ran the epoch. ``close`` removes the folder.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["ConversionEpochs"]


class ConversionEpochs:
    """``run_epoch`` for a workload that defines ``convert_into(dst) -> images converted``.

    ``suffix``: the destination's (".tbl", ".beton"; "" for a folder). ``info["output_bytes"]`` is the size
    of the last output, a file or every file under a folder.
    """

    items_per_epoch: int
    info: dict[str, Any]

    def __init__(self, prefix: str, suffix: str) -> None:
        self._tmp = Path(tempfile.mkdtemp(prefix=prefix))
        self._suffix = suffix
        self._last: Path | None = None

    def convert_into(self, dst: Path) -> int:
        raise NotImplementedError

    def prepare_epoch(self, epoch: int) -> None:
        self._remove_last()

    def run_epoch(self, epoch: int) -> int:
        dst = self._tmp / f"epoch{epoch}{self._suffix}"
        self._last = dst
        n = self.convert_into(dst)
        self.info["output_bytes"] = _size(dst)
        return n

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)

    def _remove_last(self) -> None:
        if self._last is not None:
            if self._last.is_dir():
                shutil.rmtree(self._last)
            else:
                self._last.unlink(missing_ok=True)
            self._last = None


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size
