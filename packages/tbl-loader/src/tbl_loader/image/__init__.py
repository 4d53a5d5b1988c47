"""Images: the image contract (:class:`ImageSpec`), the loader, the map-style dataset, serve-time JPEG decode."""

from __future__ import annotations

from . import gpu_decode, variable_source
from .loader import ImageLoader
from .spec import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    LAYOUTS,
    VARIABLE_IMAGE_KINDS,
    ImageColumns,
    ImageSpec,
    RandomResizedCrop,
    resized_center_crop_windows,
)
from .torch_dataset import EpochBatch, EpochBatchSampler, ImageDataset, PassPlan

__all__ = [
    "EpochBatch",
    "EpochBatchSampler",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageColumns",
    "ImageDataset",
    "ImageLoader",
    "ImageSpec",
    "LAYOUTS",
    "PassPlan",
    "RandomResizedCrop",
    "VARIABLE_IMAGE_KINDS",
    "gpu_decode",
    "resized_center_crop_windows",
    "variable_source",
]
