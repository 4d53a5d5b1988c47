"""The host side of every loader: output buffers, the buffer ring, the background producer, user transforms.

For loader authors: a :class:`BatchSource` fills one ring slot per batch that a
:class:`~tbl_loader.stream.StreamCursor` plans; :class:`HostPipeline` runs it
ahead on a producer thread through a :class:`~tbl_loader.host.ring.Ring` of
:class:`HostArray` buffers; :class:`HostLoader` is the iterable users hold; :class:`StageStats` counts
each stage's time for ``loader.stats()``.
"""

from __future__ import annotations

from .batch import Batch, PyTreeBatch, pytree_batch
from .output import OUTPUT_DTYPES, HostArray, OutputSpec, allocate_host
from .pipeline import BatchSource, HostLoader, HostPipeline, refuse_dataloader_workers
from .producer import Producer
from .shared_loop import shared_loop
from .stats import StageStats
from .transforms import TransformStage

__all__ = [
    "Batch",
    "BatchSource",
    "HostArray",
    "HostLoader",
    "HostPipeline",
    "OUTPUT_DTYPES",
    "OutputSpec",
    "Producer",
    "PyTreeBatch",
    "StageStats",
    "TransformStage",
    "allocate_host",
    "pytree_batch",
    "refuse_dataloader_workers",
    "shared_loop",
]
