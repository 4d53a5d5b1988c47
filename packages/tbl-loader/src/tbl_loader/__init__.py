"""tbl-loader: serve .tbl datasets at memory speed with exact determinism, resume and sharding.

The top level holds what training code calls: the loaders and map-style
datasets of each sample kind, the batch they yield, conversion, and the
errors (all in :mod:`tbl_loader.errors`, under :class:`~tbl_loader.errors.LoaderError`).
What loader authors and sibling packages build on lives in sub-packages with
their own ``__all__``: :mod:`tbl_loader.stream` (order, cursor, resume state,
subsets, keys), :mod:`tbl_loader.host` (buffers, ring, producer, transforms),
:mod:`tbl_loader.source` (local and remote shards, the cache), :mod:`tbl_loader.image`,
:mod:`tbl_loader.pytree`, :mod:`tbl_loader.tokens`, :mod:`tbl_loader.conversion`.
"""

from __future__ import annotations

from . import conversion, errors, host, image, pytree, source, stream, tokens
from .conversion import convert
from .errors import LoaderError
from .host.batch import Batch, PyTreeBatch
from .image import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    EpochBatchSampler,
    ImageDataset,
    ImageLoader,
    RandomResizedCrop,
)
from .mix import Mix
from .pytree import Masked, Padded, PyTreeDataset, PyTreeLoader, collate_identity, collate_tensors
from .source.upload import upload_dataset
from .stream.schedule import Schedule
from .tokens import TokenBatch, TokenDataset, TokenLoader, write_tokens
from .version import __version__

__all__ = [
    "Batch",
    "EpochBatchSampler",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageDataset",
    "ImageLoader",
    "LoaderError",
    "Masked",
    "Mix",
    "Padded",
    "PyTreeBatch",
    "PyTreeDataset",
    "PyTreeLoader",
    "RandomResizedCrop",
    "Schedule",
    "TokenBatch",
    "TokenDataset",
    "TokenLoader",
    "__version__",
    "collate_identity",
    "collate_tensors",
    "conversion",
    "convert",
    "errors",
    "host",
    "image",
    "pytree",
    "source",
    "stream",
    "tokens",
    "upload_dataset",
    "write_tokens",
]
