"""tbl-resident: GPU-resident .tbl image loaders. The uint8 dataset lives on the device (CUDA, Apple MPS,
or CPU for tests) and every batch is produced there, bit-identical to tbl_loader.ImageLoader's."""

from __future__ import annotations

from .device import DeviceMemoryError, free_bytes
from .loader import ResidentImageLoader, workspace_bytes
from .upload import UploadStats

__version__ = "0.1.0"

__all__ = [
    "DeviceMemoryError",
    "ResidentImageLoader",
    "UploadStats",
    "__version__",
    "free_bytes",
    "workspace_bytes",
]
