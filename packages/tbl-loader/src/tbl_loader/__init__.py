"""tbl-loader: serve .tbl datasets at memory speed with exact determinism, resume and sharding."""

from __future__ import annotations

# Public modules: `decode` is the rule of a converted image (`reference_preprocess` checks one);
# `chunk_writer` writes a conversion's rows in place (the bench splits a conversion's cost with both).
from . import chunk_writer, decode, order
from ._kernels import KernelsFeatureError
from .cache import CacheFullError
from .conversion import (
    ConvertReport,
    DestinationError,
    EmptyClassError,
    ImageDecodeError,
    SourceError,
    WorkerCrashError,
    convert,
    merge_parts,
)
from .cursor import Resumable, StreamCursor, StreamOptions
from .decode import PillowConfigError, UnsupportedImageModeError
from .extra_columns import SidecarError
from .image_loader import Batch, ImageLoader
from .image_spec import IMAGENET_MEAN, IMAGENET_STD, LAYOUTS, ImageColumns, ImageSpec, RandomResizedCrop
from .jpeg_decode import JpegDecodeError, JpegDecoderUnavailableError
from .keys import keys_uniform, numpy_generator, sample_keys, torch_generator
from .mix import Mix, MixError
from .order import BatchPlan, EpochOrder
from .output import OUTPUT_DTYPES, HostArray, OutputSpec, allocate_host
from .pipeline import BatchSource, HostLoader, HostPipeline, LoaderClosedError
from .pytree import (
    VAR_MODES,
    CollatedBatch,
    Masked,
    Padded,
    PyTreeDataset,
    PyTreeLoader,
    collate_identity,
    collate_tensors,
)
from .remote_dataset import ShardNotMappedError
from .ring import RingGrowthWarning
from .state import StateMismatchError
from .storage import (
    RemoteChecksumError,
    RemoteError,
    RemoteObjectMissingError,
    RemoteSupportMissingError,
    RemoteUnavailableError,
)
from .subset import SubsetError, resolve_rows
from .tokens import TokenError, TokenLoader, window_offset, write_tokens
from .torch_dataset import EpochBatch, EpochBatchSampler, ImageDataset, PassPlan
from .upload import upload_dataset
from .variable_source import ImageGeometryError
from .verify import VERIFY_MODES
from .version import __version__

__all__ = [
    "Batch",
    "BatchPlan",
    "BatchSource",
    "CacheFullError",
    "CollatedBatch",
    "ConvertReport",
    "DestinationError",
    "EmptyClassError",
    "EpochBatch",
    "EpochBatchSampler",
    "EpochOrder",
    "HostArray",
    "HostLoader",
    "HostPipeline",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageColumns",
    "ImageDataset",
    "ImageDecodeError",
    "ImageGeometryError",
    "ImageLoader",
    "ImageSpec",
    "JpegDecodeError",
    "JpegDecoderUnavailableError",
    "KernelsFeatureError",
    "LAYOUTS",
    "LoaderClosedError",
    "Masked",
    "Mix",
    "MixError",
    "OUTPUT_DTYPES",
    "OutputSpec",
    "Padded",
    "PassPlan",
    "PillowConfigError",
    "PyTreeDataset",
    "PyTreeLoader",
    "RandomResizedCrop",
    "RemoteChecksumError",
    "RemoteError",
    "RemoteObjectMissingError",
    "RemoteSupportMissingError",
    "RemoteUnavailableError",
    "Resumable",
    "RingGrowthWarning",
    "ShardNotMappedError",
    "SidecarError",
    "SourceError",
    "StateMismatchError",
    "StreamCursor",
    "StreamOptions",
    "SubsetError",
    "TokenError",
    "TokenLoader",
    "UnsupportedImageModeError",
    "VAR_MODES",
    "VERIFY_MODES",
    "WorkerCrashError",
    "__version__",
    "allocate_host",
    "chunk_writer",
    "collate_identity",
    "collate_tensors",
    "convert",
    "decode",
    "keys_uniform",
    "merge_parts",
    "numpy_generator",
    "order",
    "resolve_rows",
    "sample_keys",
    "torch_generator",
    "upload_dataset",
    "window_offset",
    "write_tokens",
]
