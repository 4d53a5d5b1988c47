"""Every error and warning tbl-loader raises: one module, one hierarchy.

Each error derives from :class:`LoaderError` (catch that for "anything tbl-loader
refused") and from the built-in exception a caller would otherwise catch
(``ValueError`` for bad input, ``OSError`` for storage, ``ImportError`` for a
missing optional piece, ``RuntimeError`` for a state the program got into), so
``except ValueError`` keeps working where it did.

Errors about files and destinations are tbl-format's own (a conversion writes
through it): ``DestinationError``, ``DestinationExistsError`` and
``NotRegularFileError`` are re-exported from :mod:`tbl_format`, never defined
twice.
"""

from __future__ import annotations

import tbl_format
from tbl_format import DestinationError, DestinationExistsError, NotRegularFileError

__all__ = [
    "CacheEntryError",
    "CacheFullError",
    "CacheThrashWarning",
    "DecoderMismatchError",
    "DestinationError",
    "DestinationExistsError",
    "EmptyClassError",
    "GeometryFieldError",
    "GpuDecodeUnavailableError",
    "ImageDecodeError",
    "ImageGeometryError",
    "ImageTooLargeError",
    "JpegDecodeError",
    "JpegDecoderUnavailableError",
    "JsonLineError",
    "KernelsFeatureError",
    "LoaderClosedError",
    "LoaderError",
    "LoaderInWorkersError",
    "MixError",
    "NotRegularFileError",
    "OrderError",
    "PillowConfigError",
    "ProducerClosedError",
    "RayUnavailableError",
    "RemoteChecksumError",
    "RemoteError",
    "RemoteObjectMissingError",
    "RemoteSupportMissingError",
    "RemoteUnavailableError",
    "RingGrowthWarning",
    "ScheduleChangedError",
    "ShardNotMappedError",
    "SidecarError",
    "SourceError",
    "StateMismatchError",
    "SubsetError",
    "TextFieldMissingError",
    "TextFieldTypeError",
    "TextRecordError",
    "TokenError",
    "TokenizerFileError",
    "TokenizerUnavailableError",
    "UnsupportedCombinationError",
    "UnsupportedImageModeError",
    "WorkerCrashError",
]


class LoaderError(Exception):
    """Base of every error tbl-loader raises itself."""


# ---- optional pieces -----------------------------------------------------------------------------


class KernelsFeatureError(LoaderError, ImportError):
    """The installed tbl-kernels is one the pin admits, but too old for the feature asked for."""


class GpuDecodeUnavailableError(LoaderError, RuntimeError):
    """``decode_device`` was asked for where it cannot run (no torch, no CUDA device, or no torchvision)."""


class JpegDecoderUnavailableError(LoaderError, ImportError):
    """Serving JPEG storage needs the serve-time decoder, which is not installed; the message names the pip command."""


class RemoteSupportMissingError(LoaderError, ImportError):
    """A URL was given but the storage library (the ``remote`` extra) is not installed."""


class RayUnavailableError(LoaderError, ImportError):
    """Ray Data is not installed; the message names the pip command."""


class TokenizerUnavailableError(LoaderError, ImportError):
    """`tbl tokenize` needs a library that is not installed (``tokenizers``, or ``zstandard`` for a ``.zst``
    source); the message names the pip command."""


# ---- the stream: order, state, subsets, mixing ---------------------------------------------------


class StateMismatchError(LoaderError, ValueError):
    """A saved state does not belong to this loader (other dataset, settings, seed or format)."""


class ScheduleChangedError(StateMismatchError):
    """A Mix state saved under another mixture schedule (its hash differs): refused unless the new schedule is
    accepted from the saved position on (``load_state_dict(state, accept_schedule_change=True)``)."""


class SubsetError(LoaderError, ValueError):
    """``rows=`` or ``subsample=`` is not a valid subset of the dataset."""


class MixError(LoaderError, ValueError):
    """Invalid sources, weights or epoch size for a Mix, or batches that cannot be joined."""


class UnsupportedCombinationError(LoaderError, ValueError):
    """Two capabilities that are each supported but not together (the README's table of refused
    combinations lists each, with its reason); the message names both."""


class TokenError(LoaderError, ValueError):
    """Token ids that do not fit the dtype, a dataset that is not a token stream, or bad window settings."""


# ---- serving ---------------------------------------------------------------------------------------


class LoaderClosedError(LoaderError, RuntimeError):
    """The loader was closed; it cannot be iterated any more."""


class LoaderInWorkersError(LoaderError, RuntimeError):
    """A loader iterated inside torch DataLoader workers: each worker would serve the whole epoch."""


class ProducerClosedError(LoaderError, RuntimeError):
    """next() on a producer that was closed."""


class CacheThrashWarning(ResourceWarning):
    """A global shuffle over a shard cache smaller than the dataset: shards are downloaded many times an epoch."""


class RingGrowthWarning(ResourceWarning):
    """Batches are being kept alive and the buffer ring keeps allocating."""


class ImageGeometryError(LoaderError, ValueError):
    """A stored image's shape disagrees with its row's height / width columns (the dataset is damaged)."""


class GeometryFieldError(LoaderError, ValueError):
    """A declared geometry field (``geometry=``) is not a served field of (k, 4) numbers, or names no known kind."""


class JpegDecodeError(LoaderError, ValueError):
    """A stored JPEG failed to decode at serve time. ``row`` is the dataset row, ``path`` the dataset."""

    def __init__(self, path: str, row: int, message: str) -> None:
        super().__init__(f"{path}: row {row}: the stored JPEG does not decode ({message}); no image is made up for it")
        self.path = path
        self.row = row
        self.message = message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.row, self.message))


# ---- remote storage and the shard cache ------------------------------------------------------------


class RemoteError(LoaderError, OSError):
    """An object-store operation failed; the message names the URL."""


class RemoteUnavailableError(RemoteError):
    """The store cannot be reached (no server at the endpoint, DNS, TLS, refused or timed-out connection)."""


class RemoteObjectMissingError(RemoteError, FileNotFoundError):
    """The object does not exist at the URL (for a dataset directory: no manifest.json there)."""


class RemoteChecksumError(RemoteError, tbl_format.FormatError):
    """A downloaded file failed its checksums twice (downloaded again once, then refused).

    Also a ``tbl_format.FormatError``: what the store holds is not an intact dataset."""


class CacheEntryError(LoaderError, OSError):
    """Something the shard cache did not put there, and cannot remove (a folder), sits under a shard's name."""


class CacheFullError(LoaderError, OSError):
    """The cache's disk is full (or the limit cannot hold one shard); the message names the cache folder."""


class ShardNotMappedError(LoaderError, RuntimeError):
    """A row of a remote dataset's shard was asked for while that shard is not mapped (``prepare_rows`` first).

    The message names the shard's URL. Never raised by the loaders' own reads (they map first); it is
    what stops a read from ever seeing anything but the shard's own bytes."""


# ---- conversion ------------------------------------------------------------------------------------


class SourceError(LoaderError, ValueError):
    """The conversion source is unusable: missing, not a regular file or folder, unknown layout, bad label file,
    no images."""


class EmptyClassError(SourceError):
    """A class folder of the source holds no image (refused unless ``allow_empty_classes``)."""


class ImageTooLargeError(LoaderError, ValueError):
    """An image's encoded size exceeds the cap (``max_image_bytes``); none of it is read."""


class ImageDecodeError(LoaderError, ValueError):
    """An image of the source could not be decoded (``on_error="fail"``). ``name`` is the file."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"cannot convert image {name!r}: {message}")
        self.name = name
        self.message = message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.name, self.message))


class UnsupportedImageModeError(LoaderError, ValueError):
    """The image decodes to a Pillow mode with no defined RGB conversion (e.g. F, LAB)."""


class PillowConfigError(LoaderError, RuntimeError):
    """Pillow is configured in a way that would store damaged images (LOAD_TRUNCATED_IMAGES)."""


class SidecarError(LoaderError, ValueError):
    """A sidecar file that cannot be read, or that lacks an entry or a field for a converted image."""


class WorkerCrashError(LoaderError, RuntimeError):
    """A worker process died (killed, out of memory, crashed in a decoder); nothing is published."""


class DecoderMismatchError(LoaderError, RuntimeError):
    """A Ray worker decodes with another Pillow, libjpeg or tbl-loader than the driver records in the metadata."""


class OrderError(LoaderError, RuntimeError):
    """The write results cannot be put in one order (the same write task twice, or rows out of order);
    nothing is published."""


# ---- tokenizing text corpora (tbl_loader.conversion.tokenize) ----------------------------------------


class TokenizerFileError(LoaderError, ValueError):
    """The tokenizer file does not load, pads or truncates what it encodes, or names no end-of-document token
    (and none was given); nothing is written."""


class TextRecordError(SourceError):
    """A record of a text corpus cannot be tokenized. ``where`` names it (``FILE:LINE`` of a JSONL file,
    ``FILE:row N`` of a Parquet file, ``row N`` of a `datasets` folder); ``reason`` says why."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where = where
        self.reason = reason

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.where, self.reason))


class JsonLineError(TextRecordError):
    """A JSONL line that is not one JSON value (bad syntax, not UTF-8, empty)."""


class TextFieldMissingError(TextRecordError):
    """A record without the text field (a JSON value that is not an object, an object without the key, a
    table without the column)."""


class TextFieldTypeError(TextRecordError):
    """A record whose text field is not a string (a number, a list, null; a column of another type)."""
