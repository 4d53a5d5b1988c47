"""PyTreeLoader: batches of sample pytrees through the loaders' common stream (order, state, prefetch, ring).

Everything about *which* rows come in *which* batch (shuffle, seed, epochs,
``drop_last``, ranks, padding, ``state_dict`` / resume) is
:class:`tbl_loader.stream.BatchStream` and :mod:`tbl_loader.order`, the same
code the image loader runs. This module supplies the batch source: on the
producer thread it gathers every fixed-size leaf with one ``gather_columns``
call, each into that leaf's ring buffer (pinned when ``pin_memory``; reused only
once the user dropped every view of it, see :mod:`tbl_loader.ring`) and reads
the variable-size leaves row by row.

Variable-size leaves (Python objects) travel with their ring slot in an
object cell: one more entry of the slot, filled by the producer and emptied
when the batch is handed out; it never blocks slot reuse, because the user
receives the values themselves, never the cell.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .order import BatchPlan
from .output import HostArray, OutputSpec
from .pytree_batch import DEFAULT_MAX_OPEN, Collator, Padded, RowSource
from .state import dataset_fingerprint
from .stream import BatchStream

__all__ = ["PyTreeLoader"]

_CELL = "__objects__"


class _ColumnBuffer(HostArray):
    """A ring buffer for one fixed-size leaf, in the leaf's own dtype (any stored dtype, bool included).

    Same liveness rule as HostArray (the reference count of ``root``); the kernel
    view is the ``(capacity, row_bytes)`` uint8 reinterpretation ``gather_columns`` writes.
    """

    def __init__(self, root: np.ndarray, row_bytes: int, pinned: Any = None) -> None:
        self.root = root
        self.dtype = root.dtype.name
        self.pinned = pinned
        self.kernel = root.view(np.uint8).reshape(root.shape[0], row_bytes)
        self.baseline = -1


def _allocate_column(capacity: int, dtype: np.dtype, row_shape: tuple[int, ...], row_bytes: int,
                     spec: OutputSpec) -> _ColumnBuffer:
    shape = (capacity, *row_shape)
    if spec.pin_memory:
        import torch

        torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        pinned = torch.empty(shape, dtype=torch_dtype, pin_memory=True)
        buf = _ColumnBuffer(pinned.numpy(), row_bytes, pinned)
    else:
        buf = _ColumnBuffer(np.empty(shape, dtype=dtype), row_bytes)
    return buf.calibrate()


class _Carry:
    """The variable-size leaves of one batch on their way through Ring.publish (a no-op ``.to``)."""

    __slots__ = ("values",)

    def __init__(self, values: Any) -> None:
        self.values = values

    def to(self, *args: Any, **kwargs: Any) -> _Carry:
        return self


class _ObjectCell(HostArray):
    """One slot's variable-size values: written by the producer, taken out at publish."""

    def __init__(self) -> None:
        self.root = np.empty(1, dtype=object)
        self.dtype = "object"
        self.pinned = None
        self.kernel = self.root
        self.baseline = 0

    def in_use(self) -> bool:
        return False  # the user holds the values, never this cell

    def export(self, rows: int, spec: OutputSpec) -> _Carry:
        values, self.root[0] = self.root[0], None
        return _Carry(values)


class _PyTreeSource:
    """Fills ring slots for one PyTreeLoader; holds the row source and collator, never the loader."""

    def __init__(self, source: RowSource, collator: Collator) -> None:
        self.source = source
        self.collator = collator

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]:
        buffers: dict[str, HostArray] = {
            leaf.path: _allocate_column(capacity, leaf.dtype, leaf.row_shape, leaf.row_bytes, output)
            for leaf in self.collator.fixed
        }
        if self.collator.var:
            buffers[_CELL] = _ObjectCell()
        return buffers

    def fill(self, buffers: dict[str, np.ndarray], plan: BatchPlan) -> None:
        ids = plan.sample_ids
        n = ids.shape[0]
        source = self.source
        gathered = self.collator.gathered
        if n and gathered:
            source.gather(gathered, ids, [buffers[leaf.path][:n] for leaf in gathered])
        if self.collator.var:
            buffers[_CELL][0] = self.collator.var_columns(source, ids)


class PyTreeLoader(BatchStream):
    """Batches of collated sample pytrees from a ``.tbl`` file or dataset directory.

    Each batch is the dataset's pytree with one value per leaf: fixed-size leaves
    as ``(B,)`` / ``(B, *shape)`` torch tensors (numpy arrays with
    ``backend="numpy"``) living in the loader's buffer ring, variable-size leaves
    as lists (``var="list"``: ``str``, ``bytes``, or one tensor / array per row) or
    :class:`~tbl_loader.pytree_batch.Padded` pairs (``var="pad"``). With
    ``return_indices=True`` each item is ``(batch, indices)``, indices int64.

    ``shuffle``, ``seed``, ``drop_last``, ``rank`` / ``world_size``, ``padding``,
    ``set_epoch``, ``state_dict`` / ``load_state_dict``, ``prefetch`` (batches
    prepared ahead on a producer thread; 0 = no thread), ``device`` and
    ``pin_memory`` behave exactly as in :class:`tbl_loader.ImageLoader` (same code:
    :class:`tbl_loader.stream.BatchStream`). ``leaves`` selects leaf paths;
    ``max_open`` bounds the shards mapped at once.

    Ring buffers are reused only after every view of a batch was dropped; keep
    copies rather than batches if you store them.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        var: str = "list",
        leaves: list[str] | None = None,
        prefetch: int = 2,
        rank: int | None = None,
        world_size: int | None = None,
        padding: str = "wrap",
        backend: str | None = None,
        device: Any = None,
        pin_memory: bool = False,
        return_indices: bool = False,
        max_open: int = DEFAULT_MAX_OPEN,
        verify: bool = False,
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        output = OutputSpec.create(backend, device, pin_memory)
        source = RowSource(path, max_open=max_open, verify=verify)
        try:
            collator = Collator(source.schema, leaves, var)
            super().__init__(
                num_samples=source.num_rows,
                batch_size=batch_size,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop_last,
                prefetch=prefetch,
                rank=rank,
                world_size=world_size,
                padding=padding,
                output=output,
                dataset_fingerprint=dataset_fingerprint(source),
                closers=[source.close],
            )
        except BaseException:
            source.close()
            raise
        self.path = path
        self.collator = collator
        self.schema = source.schema
        self.metadata = source.metadata
        self.return_indices = bool(return_indices)
        self._rows = source

    @property
    def leaf_paths(self) -> list[str]:
        return list(self.collator.paths)

    def _batch_source(self) -> _PyTreeSource:
        return _PyTreeSource(self._rows, self.collator)

    def _make_batch(self, outputs: dict[str, Any], plan: BatchPlan) -> Any:
        collator = self.collator
        values: list[Any] = [None] * len(collator.paths)
        for leaf in collator.fixed:
            values[leaf.slot] = outputs[leaf.path]
        if collator.var:
            torch_out = self.output.backend == "torch"
            for leaf, col in zip(collator.var, outputs[_CELL].values, strict=True):
                values[leaf.slot] = self._convert(col) if torch_out else col
        batch = collator.build(values)
        if not self.return_indices:
            return batch
        indices = plan.sample_ids.copy()
        if self.output.backend == "torch":
            import torch

            indices = torch.from_numpy(indices)
        return batch, indices

    def _convert(self, col: Any) -> Any:
        """Variable-size values as torch objects: arrays become tensors (moved to ``device``), the rest stays."""
        import torch

        device = self.output.device

        def tensor(a: np.ndarray) -> Any:
            t = torch.from_numpy(a)  # a fresh writable array: no copy, no warning
            return t if device is None else t.to(device)

        if isinstance(col, Padded):
            return Padded(tensor(col.data), tensor(col.lengths))
        if col and isinstance(col[0], np.ndarray):
            return [tensor(a) for a in col]
        return col
