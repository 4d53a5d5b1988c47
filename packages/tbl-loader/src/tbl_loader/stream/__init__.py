"""The stream: which rows come in which batch, and where a run stands. No pixels, no threads.

For loader authors (a new sample kind composes a :class:`StreamCursor` with a
host pipeline) and for the device loaders of tbl-resident: the epoch order and
every per-sample random draw are pure functions of ``(seed, epoch, sample_id)``
(:mod:`~tbl_loader.stream.order`); the cursor owns epochs, position, the rank
split and the resumable ``state_dict``; subsets resolve ``rows=`` /
``subsample=``; keys hand users per-sample randomness; schedules say which source of a mixture
serves each position (:mod:`~tbl_loader.stream.schedule`).
"""

from __future__ import annotations

from . import order
from .cursor import Resumable, StreamCursor, StreamOptions
from .distributed import resolve_rank_world
from .keys import keys_uniform, numpy_generator, sample_keys, torch_generator
from .order import BatchPlan, EpochOrder
from .schedule import Schedule, Timeline, mix_counts
from .state import StreamState
from .subset import resolve_rows

__all__ = [
    "BatchPlan",
    "EpochOrder",
    "Resumable",
    "Schedule",
    "StreamCursor",
    "StreamOptions",
    "StreamState",
    "Timeline",
    "keys_uniform",
    "mix_counts",
    "numpy_generator",
    "order",
    "resolve_rank_world",
    "resolve_rows",
    "sample_keys",
    "torch_generator",
]
