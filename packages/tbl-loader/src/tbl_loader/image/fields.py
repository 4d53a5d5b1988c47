"""Extra sample fields beside the image: the pytree loader's batch rules, applied to an image dataset.

``ImageLoader(..., fields=("caption", "boxes"))`` serves leaves of the sample
other than the image in ``batch.fields`` (a dict by leaf path). They are
batched by the code that batches pytree leaves (:mod:`tbl_loader.pytree.batch`,
one implementation): fixed-size leaves (int, float, bool, fixed-shape arrays)
are gathered by one ``gather_columns`` kernel call per batch into ring buffers
``(B,)`` / ``(B, *shape)``; variable-size leaves (str, bytes, variable-shape
arrays, lists) are lists of ``B`` values with ``var="list"`` or
:class:`~tbl_loader.Padded` ``(data, lengths)`` with ``var="pad"``; optional
leaves are :class:`~tbl_loader.Masked`. A label leaf that is not an int64
scalar (float targets, fixed-shape multi-label arrays, optional labels) is
served the same way, as ``batch.labels``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..host.output import HostArray, OutputSpec, allocate_host
from ..pytree.batch import Collator, RowSource, torch_column

__all__ = ["FieldReader"]

_PREFIX = "field:"  # ring buffer names of gathered fields (beside "images", "labels")


class FieldReader:
    """Reads ``paths`` (leaf paths) of an open dataset's rows as batch values; never references a loader."""

    def __init__(self, dataset: Any, paths: list[str], var: str = "list") -> None:
        if isinstance(paths, str):
            raise TypeError("fields must be a sequence of leaf paths, not a single string")
        paths = list(dict.fromkeys(paths))  # each once, first mention first
        self.paths = paths
        self.source = RowSource(None, dataset=dataset)
        self.collator = Collator(dataset.schema, paths, var)

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]:
        """Ring buffers of the fixed-size fields."""
        return {_PREFIX + leaf.path: allocate_host((capacity, *leaf.row_shape), np.dtype(leaf.dtype), output,
                                                   as_rows=True)
                for leaf in self.collator.fixed}

    def fill(self, buffers: dict[str, np.ndarray], ids: np.ndarray) -> list[Any]:
        """Gathers the fixed-size fields of rows ``ids`` into ``buffers``; returns the variable-size columns."""
        n = ids.shape[0]
        gathered = self.collator.gathered
        if n and gathered:
            self.source.gather(gathered, ids, [buffers[_PREFIX + leaf.path][:n] for leaf in gathered])
        return self.collator.var_columns(self.source, ids)

    def values(self, outputs: dict[str, Any], var_columns: list[Any], torch_device: Any = False) -> dict[str, Any]:
        """``{path: batch value}`` from the exported buffers and the variable-size columns.

        ``torch_device``: False for numpy outputs; else the torch device (None: host) that
        variable-size arrays are converted to.
        """
        collator = self.collator
        out: dict[str, Any] = {}
        for leaf in collator.fixed:
            out[leaf.path] = outputs[_PREFIX + leaf.path]
        for leaf, col in zip(collator.var, var_columns, strict=True):
            out[leaf.path] = col if torch_device is False else torch_column(col, torch_device)
        return {p: out[p] for p in self.paths}
