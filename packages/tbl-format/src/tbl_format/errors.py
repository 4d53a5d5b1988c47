"""Errors raised by tbl-format.

Every rule a reader checks has its own ``FormatError`` subclass (SPEC.md lists
them under "Validation rules"); a damaged file raises only ``FormatError``
subclasses, never a bare ``IndexError``, ``struct.error`` or
``UnicodeDecodeError`` from the parser. Errors about the caller's input rather
than a file (a sample that does not fit the schema) are ``SchemaMismatchError``,
a ``ValueError``.
"""

from __future__ import annotations


class FormatError(Exception):
    """A file or dataset directory breaks a rule of SPEC.md."""


class BadMagicError(FormatError):
    """The file does not start with a known TBL magic."""


class UnsupportedVersionError(FormatError):
    """The file's major format version is not one this reader knows, or a newer minor uses a leaf kind or field it does not know."""


class HeaderTooLargeError(FormatError):
    """The declared header length exceeds the header length cap."""


class TruncatedFileError(FormatError):
    """The file is shorter than its preamble, header or declared size."""


class HeaderChecksumError(FormatError):
    """The CRC-32 over the preamble and header does not match."""


class HeaderFormatError(FormatError):
    """The header is not UTF-8 JSON or a required field is missing or mistyped."""


class InvalidSchemaError(FormatError, ValueError):
    """A schema description is invalid (unknown kind, bad dtype or shape, a key with '/')."""


class RegionBoundsError(FormatError):
    """A region's offset or size overflows or lies outside the file or the rules of its kind."""


class RegionAlignmentError(FormatError):
    """A region does not start at a 4096-byte boundary."""


class TableChecksumError(FormatError):
    """An offset, shape, compression index or checksum table fails its CRC-32 at open."""


class OffsetsError(FormatError):
    """A variable-size column's offsets are not monotonic or do not span its heap."""


class DataChecksumError(FormatError):
    """A data block fails its CRC-32 (found by verify())."""


class CorruptDataError(FormatError):
    """Stored data cannot be decoded (invalid UTF-8, bad LZ4 block, shape larger than its bytes)."""


class CompressionUnavailableError(FormatError, ImportError):
    """The file uses a codec whose Python package is not installed (``pip install lz4``)."""


class UnknownCodecError(FormatError):
    """The file names a compression codec this reader does not know."""


class ManifestError(FormatError):
    """A dataset directory's manifest is missing, not JSON, or has a missing or mistyped field."""


class ManifestMismatchError(FormatError):
    """A shard file disagrees with the manifest (rows, schema or header checksum)."""


class DatasetChangedError(FormatError):
    """A dataset reopened after unpickling no longer has the schema it was pickled with."""


class V2LayoutError(FormatError, ValueError):
    """A TurboLoader (TBL v2) RAW_U8 image column cannot be a zero-copy view: payloads are compressed or not back to back."""


class SchemaMismatchError(ValueError):
    """A sample (or a dataset part being merged) does not match the schema.

    The message names the sample index and the leaf path.
    """


__all__ = [
    "BadMagicError",
    "CompressionUnavailableError",
    "CorruptDataError",
    "DataChecksumError",
    "DatasetChangedError",
    "FormatError",
    "HeaderChecksumError",
    "HeaderFormatError",
    "HeaderTooLargeError",
    "InvalidSchemaError",
    "ManifestError",
    "ManifestMismatchError",
    "OffsetsError",
    "RegionAlignmentError",
    "RegionBoundsError",
    "SchemaMismatchError",
    "TableChecksumError",
    "TruncatedFileError",
    "UnknownCodecError",
    "UnsupportedVersionError",
    "V2LayoutError",
]
