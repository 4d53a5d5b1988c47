"""PyTree datasets: write any stream of dict-like samples, read them by index or in batches at memory speed.

Samples are nested dicts, lists and tuples of int, float, bool, str, bytes,
None, numpy arrays (fixed or variable shape) and torch tensors, written with
``tbl_format.write`` / ``tbl_format.write_parallel``.
- :class:`PyTreeDataset` (:mod:`tbl_loader.pytree.dataset`): map-style,
  ``ds[i]``, ``ds.get_batch(indices)``, ``__getitems__`` for torch's DataLoader;
  maps opened lazily per process, dropped on pickling, bounded in number.
- :class:`PyTreeLoader` (:mod:`tbl_loader.pytree.loader`): iterable, shuffled,
  sharded and resumable through the same stream code as the image loader.

torch DataLoader::

    ds = PyTreeDataset(path)
    DataLoader(ds, batch_size=256, shuffle=True, num_workers=2,
               collate_fn=collate_identity)          # numpy batches, collated by ds.__getitems__
    DataLoader(ds, ..., collate_fn=collate_tensors)  # the same as tensors, zero-copy
    DataLoader(ds, batch_size=256)                   # torch's default collate: same values, row by row

(torch >= 2.2 calls ``__getitems__`` with the batch's indices; it returns a
:class:`~tbl_loader.pytree.dataset.CollatedBatch`, which the two collate
functions above turn into one collated batch and any other collate_fn sees as a
sequence of rows.) With worker
processes ``collate_identity`` is the faster choice: numpy arrays cross the
worker pipe pickled, while each tensor gets its own shared-memory segment; wrap
them with ``torch.from_numpy`` in the main process (fresh writable arrays: no
copy, no warning).

Safety: published ``.tbl`` files are immutable (the writer renames a finished
temp file into place; nothing rewrites a published file), so every shard can be
mapped. Renaming a new file over a mapped shard, or unlinking it, is safe: the
existing map keeps serving the old contents until it is closed. Truncating a
mapped file in place (which no TBL tool does) makes any later read of the lost
pages raise SIGBUS on Linux, which kills the process: do not modify published
files, replace them.
"""

from __future__ import annotations

from .batch import VAR_MODES, IndexedBatch, Masked, Padded
from .dataset import (
    BATCH_FORMATS,
    CollatedBatch,
    PyTreeDataset,
    collate_arrow,
    collate_identity,
    collate_tensors,
)
from .loader import PyTreeLoader

__all__ = [
    "BATCH_FORMATS",
    "CollatedBatch",
    "IndexedBatch",
    "Masked",
    "Padded",
    "PyTreeDataset",
    "PyTreeLoader",
    "VAR_MODES",
    "collate_arrow",
    "collate_identity",
    "collate_tensors",
]
