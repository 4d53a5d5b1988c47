"""tbl-loader: serve .tbl datasets at memory speed with exact determinism, resume and sharding."""

from __future__ import annotations

from . import order
from .convert import ConvertReport, ImageDecodeError, convert
from .image_loader import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Batch,
    ImageLoader,
    RandomResizedCrop,
    image_columns,
    image_stream_settings,
    output_geometry,
    size_pair,
)
from .order import EpochOrder
from .pytree import VAR_MODES, Padded, PyTreeDataset, PyTreeLoader, collate_identity, write, write_parallel
from .ring import RingGrowthWarning
from .state import StateMismatchError
from .stream import BatchStream, LoaderClosedError

__version__ = "0.1.0"

__all__ = [
    "Batch",
    "BatchStream",
    "ConvertReport",
    "EpochOrder",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageDecodeError",
    "ImageLoader",
    "LoaderClosedError",
    "Padded",
    "PyTreeDataset",
    "PyTreeLoader",
    "RandomResizedCrop",
    "RingGrowthWarning",
    "StateMismatchError",
    "VAR_MODES",
    "__version__",
    "collate_identity",
    "convert",
    "image_columns",
    "image_stream_settings",
    "order",
    "output_geometry",
    "size_pair",
    "write",
    "write_parallel",
]
