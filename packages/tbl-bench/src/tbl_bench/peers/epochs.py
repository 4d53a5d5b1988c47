"""The epoch loop shared by the peers whose loaders yield ``(images, labels)`` batches."""

from __future__ import annotations

from typing import Any

from tbl_bench.levels import consume_batch

__all__ = ["ImageLabelEpochs"]


class ImageLabelEpochs:
    """``run_epoch`` for a workload with ``self.loader`` (batches of ``(images, labels)``) and ``self.level``:
    every batch's images consumed at that level (`tbl_bench.levels`), the images counted."""

    loader: Any
    level: str

    def run_epoch(self, epoch: int) -> int:
        n = 0
        for images, _labels in self.loader:
            consume_batch(images, self.level)
            n += images.shape[0]
        return n
