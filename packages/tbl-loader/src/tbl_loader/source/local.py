"""LocalShards: a local dataset as the image loaders' shard source.

The image loaders read a dataset's fixed-size columns through one protocol,
with two implementations chosen once, when the loader is made:

- :class:`LocalShards` (this module): a ``tbl_format.Dataset`` whose every shard is
  mapped; a batch reads the whole columns at its own rows.
- :class:`~tbl_loader.source.remote.RemoteDataset`: a dataset at a URL, whose
  shards come and go through the local cache; a batch reads the columns of the
  shards holding its rows, mapped first.

The protocol: ``schema``, ``metadata``, ``fingerprint``, ``leaf_paths``,
``segment_rows``; ``layout()`` (what ``ImageSpec.bind`` binds: shapes and
dtypes); ``batch_columns(leaves, rows)`` (each leaf's columns and ``rows`` as
positions in their concatenation); ``begin_pass(order, leaf, batch_size)`` (what
a pass will read: the remote fetcher downloads ahead, a local block-shuffled
pass releases and reads ahead the page cache, :mod:`tbl_loader.source.advice`),
``before_batch(number)`` and ``end_pass()``; ``verify_rows(rows, leaves)``;
``close()``. Heap reads (variable-size images,
fields) go through ``dataset``, a ``tbl_format.Dataset`` (for a URL, one over
the cache: :func:`~tbl_loader.source.remote.open_streaming`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .advice import PageAdvisor, fits_in_memory

__all__ = ["LocalShards"]


class LocalShards:
    """``dataset`` (an open ``tbl_format.Dataset``) as a shard source; closing it closes the dataset when owned."""

    def __init__(self, dataset: Any, *, owned: bool = True) -> None:
        self.dataset = dataset
        self._owned = owned
        self._whole: dict[tuple[str, ...], dict[str, list[Any]]] = {}
        self._advisor: PageAdvisor | None = None
        self._batch_size = 1

    schema = property(lambda self: self.dataset.schema)
    metadata = property(lambda self: self.dataset.metadata)
    fingerprint = property(lambda self: self.dataset.fingerprint)
    leaf_paths = property(lambda self: self.dataset.leaf_paths)
    segment_rows = property(lambda self: self.dataset.segment_rows)

    def layout(self) -> Any:
        return self.dataset

    def batch_columns(self, leaves: list[str], rows: Any) -> tuple[dict[str, list[Any]], np.ndarray]:
        """Every non-empty shard's whole columns of ``leaves`` (the same lists batch after batch), ``rows`` as
        they are."""
        key = tuple(leaves)
        found = self._whole.get(key)
        if found is None:
            counts = self.dataset.segment_rows
            found = self._whole[key] = {
                leaf: [seg for seg, n in zip(self.dataset.segments(leaf), counts, strict=True) if n] for leaf in leaves}
        return found, rows

    def begin_pass(self, epoch_order: Any, leaf: str, batch_size: int) -> None:
        """A block-shuffled pass over a dataset larger than the memory available releases each shard's pages of
        ``leaf`` (the images) once the pass is done with it and reads the next ones ahead
        (:mod:`tbl_loader.source.advice`)."""
        self._end_advice()
        if epoch_order.shuffle != "block":
            return
        images = self.batch_columns([leaf], None)[0][leaf]
        if fits_in_memory(sum(seg.nbytes for seg in images)):  # then they stay for the next epoch
            return
        files = [f for f, n in zip(self.dataset.files, self.dataset.segment_rows, strict=True) if n]
        self._advisor = PageAdvisor(images, epoch_order.indices, batch_size, files, read_ahead=True)

    def before_batch(self, number: int) -> None:
        """Batch ``number`` of the pass is about to be read (the page advice follows the pass)."""
        if self._advisor is not None:
            self._advisor.batch(number)

    def schedule(self, indices: Any) -> None:
        """Nothing to fetch: every shard is on local disk (the remote source downloads ``indices``' shards ahead)."""

    def verify_rows(self, rows: list[int], leaves: list[str] | None = None) -> None:
        self.dataset.verify_rows(rows, leaves)

    def _end_advice(self) -> None:
        if self._advisor is not None:
            self._advisor.close()
            self._advisor = None

    def end_pass(self) -> None:
        self._end_advice()

    def close(self) -> None:
        self._end_advice()
        self._whole.clear()
        if self._owned:
            self.dataset.close()
