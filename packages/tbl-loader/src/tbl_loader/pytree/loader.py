"""PyTreeLoader: batches of sample pytrees through the loaders' common cursor and host pipeline.

Everything about *which* rows come in *which* batch (shuffle, seed, epochs,
``drop_last``, ranks, padding, ``state_dict`` / resume) is
:class:`tbl_loader.stream.cursor.StreamCursor` and :mod:`tbl_loader.stream.order`, the same
code the image loader runs; batches are made by a
:class:`tbl_loader.host.pipeline.HostPipeline` around the batch source below. On the
producer thread it gathers every fixed-size leaf with one ``gather_columns``
call, each into that leaf's ring buffer (pinned when ``pin_memory``; reused only
once the user dropped every view of it, see :mod:`tbl_loader.host.ring`), and reads
the variable-size leaves row by row into the slot's payload, which the batch
takes over when it is handed out.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import tbl_format

from ..host.batch import pytree_batch
from ..host.output import HostArray, OutputSpec, allocate_host
from ..host.pipeline import HostLoader, HostPipeline
from ..host.stats import StageStats
from ..source.fetcher import shards_in_read_order, warn_if_shuffle_thrashes
from ..source.storage import is_url, redact
from ..source.verify import verify_mode
from ..stream.cursor import StreamCursor, StreamOptions
from ..stream.order import BatchPlan
from ..stream.state import pytree_fingerprint_v0_1
from ..stream.subset import resolve_rows
from .batch import Collator, IndexedBatch, RowSource, field_paths, torch_column

__all__ = ["PyTreeLoader"]


class _PyTreeSource:
    """Fills ring slots for one PyTreeLoader; holds the row source and collator, never the loader."""

    def __init__(self, source: RowSource, collator: Collator, *, verify_lazily: bool) -> None:
        self.source = source
        self.collator = collator
        # verify="lazy": each data block is checked the first time a batch touches it
        self.verify_rows = source.dataset.verify_rows if verify_lazily else None

    def begin_pass(self, epoch_order: Any) -> None:
        """A dataset at a URL downloads the pass's shards ahead of its batches (a no-op for local data)."""
        dataset = self.source.dataset
        dataset.read_ahead(shards_in_read_order(dataset.segment_rows, epoch_order.dataset_rows))

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]:
        return {leaf.path: allocate_host((capacity, *leaf.row_shape), np.dtype(leaf.dtype), output, as_rows=True)
                for leaf in self.collator.fixed}

    def fill(self, buffers: dict[str, np.ndarray], plan: BatchPlan) -> list[Any] | None:
        """Gathers the fixed-size leaves into ``buffers``; returns the variable-size columns (the payload)."""
        ids = plan.sample_ids
        n = ids.shape[0]
        if self.verify_rows is not None:
            self.verify_rows(ids.tolist(), self.collator.paths)  # before any byte of these rows is read
        gathered = self.collator.gathered
        if n and gathered:
            self.source.gather(gathered, ids, [buffers[leaf.path][:n] for leaf in gathered])
        return self.collator.var_columns(self.source, ids) if self.collator.var else None


class PyTreeLoader(HostLoader):
    """Batches of collated sample pytrees from a ``.tbl`` file or dataset directory.

    Each batch is the dataset's pytree with one value per leaf: fixed-size leaves
    as ``(B,)`` / ``(B, *shape)`` torch tensors (numpy arrays with
    ``backend="numpy"``) living in the loader's buffer ring, variable-size leaves
    as lists (``var="list"``: ``str``, ``bytes``, or one tensor / array per row) or
    :class:`~tbl_loader.pytree.batch.Padded` pairs (``var="pad"``). The batch is a
    :class:`~tbl_loader.PyTreeBatch`: the collated pytree's own root (a dict, list or tuple) carrying
    ``batch.indices``, the dataset row of every sample (int64), as an image batch does.
    ``return_indices=True`` yields :class:`~tbl_loader.pytree.IndexedBatch` pairs ``(pytree, indices)``
    instead: the one way to get the rows of a dataset whose samples are bare values.

    ``shuffle``, ``seed``, ``drop_last``, ``rank`` / ``world_size``, ``padding``,
    ``set_epoch``, ``state_dict`` / ``load_state_dict``, ``prefetch`` (batches
    prepared ahead on a producer thread; 0 = no thread), ``device`` and
    ``pin_memory`` behave exactly as in :class:`tbl_loader.ImageLoader` (same code:
    :class:`tbl_loader.stream.cursor.StreamCursor` and :class:`tbl_loader.host.pipeline.HostPipeline`).
    ``fields`` selects leaf paths (``leaves=`` is its older name); ``max_open`` bounds the shards mapped at once;
    ``verify`` (``"never"``, ``"open"``, ``"lazy"``) is as in ImageLoader (:mod:`tbl_loader.source.verify`).
    ``shuffle="block"`` is as in ImageLoader. A URL ``path`` streams through the shard cache
    (``cache_dir``, ``cache_limit``, ``storage_options``; needs ``tbl-loader[remote]``): each
    batch downloads just the shards it reads.
    ``rows`` / ``subsample`` serve a subset (:mod:`tbl_loader.stream.subset`).

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
        fields: list[str] | None = None,
        prefetch: int = 2,
        rank: int | None = None,
        world_size: int | None = None,
        padding: str = "wrap",
        backend: str | None = None,
        device: Any = None,
        pin_memory: bool = False,
        return_indices: bool = False,
        max_open: int = tbl_format.DEFAULT_MAX_OPEN,
        verify: str | bool = "never",
        cache_dir: Any = None,
        cache_limit: Any = None,
        storage_options: dict[str, Any] | None = None,
        rows: Any = None,
        subsample: float | None = None,
        leaves: list[str] | None = None,
    ) -> None:
        fields = field_paths(fields, leaves)
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
        options = StreamOptions(batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
                                world_size=world_size, padding=padding)
        output = OutputSpec.create(backend, device, pin_memory)
        verify = verify_mode(verify)
        counters = None  # the shard cache's lookups (a URL's)
        if is_url(path):  # streamed through the local shard cache: each batch maps the shards it reads
            from ..source.cache import CacheCounters
            from ..source.remote import open_streaming

            counters = CacheCounters()
            dataset = open_streaming(path, cache_dir=cache_dir, cache_limit=cache_limit,
                                     storage_options=storage_options, verify_data=verify == "open", counters=counters)
            warn_if_shuffle_thrashes(shuffle, dataset.shard_entries, cache_limit, redact(path))
            source = RowSource(None, dataset=dataset, own_dataset=True, max_open=min(max_open, dataset.max_open))
        else:
            source = RowSource(path, max_open=max_open, verify=verify == "open")
        try:
            collator = Collator(source.schema, fields, var)
            subset = resolve_rows(source.num_rows, rows, subsample)
            cursor = StreamCursor(source.num_rows if subset is None else subset.shape[0], options,
                                  dataset_fingerprint=source.dataset.fingerprint,
                                  accepted_dataset_fingerprints=(pytree_fingerprint_v0_1(source.dataset),),
                                  rows=subset, shard_rows=source.dataset.segment_rows)
            pipeline = HostPipeline(_PyTreeSource(source, collator, verify_lazily=verify == "lazy"), output,
                                    capacity=options.batch_size,
                                    prefetch=prefetch, closers=[source.close],
                                    stats=StageStats(prefetch=prefetch, cache=counters))
        except BaseException:
            source.close()
            raise
        self._compose(cursor, pipeline)
        self.path = path
        # What the map-style twin (PyTreeDataset.from_loader: a Mix source, DataLoader workers) opens the same way
        self.remote_options = {"cache_dir": cache_dir, "cache_limit": cache_limit, "storage_options": storage_options}
        self.verify = verify
        self.max_open = max_open
        self.collator = collator
        self.schema = source.schema
        self.metadata = source.metadata
        self.return_indices = bool(return_indices)

    @property
    def leaf_paths(self) -> list[str]:
        return list(self.collator.paths)

    def _make_batch(self, outputs: dict[str, Any], var_columns: list[Any] | None, plan: BatchPlan) -> Any:
        collator = self.collator
        values: list[Any] = [None] * len(collator.paths)
        for leaf in collator.fixed:
            values[leaf.slot] = outputs[leaf.path]
        if collator.var:
            torch_out = self.output.backend == "torch"
            for leaf, col in zip(collator.var, var_columns, strict=True):
                values[leaf.slot] = self._convert(col) if torch_out else col
        batch = collator.build(values)
        if self.return_indices:
            return IndexedBatch(batch, self._indices(plan))
        return pytree_batch(batch, self._indices(plan))

    def _convert(self, col: Any) -> Any:
        """Variable-size values as torch objects: arrays become tensors (moved to ``device``), the rest stays."""
        return torch_column(col, self.output.device)
