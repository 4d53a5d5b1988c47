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
    """A data block fails its CRC-32 (found by ``verify()`` or ``Dataset.verify_rows``).

    ``path`` is the file, ``block`` the block's index in the file's checksum
    table and ``rows`` the rows asked for that the block holds (empty when the
    whole file was checked); the message names all three.
    """

    def __init__(self, message: str, *, path: str | None = None, block: int | None = None,
                 rows: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.path = path
        self.block = block
        self.rows = rows

    def __reduce__(self) -> tuple[object, ...]:  # keeps the attributes across processes
        return (type(self), self.args, self.__dict__)


class CorruptDataError(FormatError):
    """Stored data cannot be decoded (invalid UTF-8, bad LZ4 block or zstd frame, shape larger than its bytes)."""


class CompressionUnavailableError(FormatError, ImportError):
    """The file uses a codec whose Python package is not installed (``pip install lz4``,
    ``pip install 'tbl-format[zstd]'``)."""


class ColumnarLayoutError(FormatError, TypeError):
    """The file's layout stores no per-leaf columns (a TurboLoader v2 file), so they cannot be exported as such."""


class UnknownCodecError(FormatError):
    """The file names a compression codec this reader does not know."""


class ManifestError(FormatError):
    """A dataset directory's manifest is missing, not JSON, or has a missing or mistyped field."""


class NotADatasetError(ManifestError):
    """A directory read as a dataset has no manifest: it is not a TBL dataset (nothing in it was read)."""


class ManifestMismatchError(FormatError):
    """A shard file disagrees with the manifest (rows, schema or header checksum)."""


class MissingShardError(ManifestMismatchError):
    """A shard file the manifest lists cannot be opened: missing, a dangling link, a link loop or unreadable."""


class DuplicateShardError(ManifestError):
    """A manifest (or a merge) lists a shard holding rows twice, by file name or by header checksum."""


class NotRegularFileError(FormatError):
    """A path read as a file (a .tbl file, a shard, a manifest) is a FIFO, a device, a socket or a directory.

    It is never opened: opening a FIFO for reading blocks, opening a device may act on it.
    """


class DatasetChangedError(FormatError):
    """The dataset changed under an open ``Dataset``, or since it was pickled.

    Raised when a shard opened (again) after the manifest was replaced or
    removed is missing or no longer the file the manifest listed, and when a
    dataset reopened after unpickling no longer has the schema it was pickled
    with. Open the dataset again to read the new version.
    """


class DocumentIndexError(FormatError):
    """A token dataset's document index (its ``starts`` leaf, SPEC.md section 9) breaks a rule: a start outside
    its row's tokens, starts not increasing, or a stream that does not begin with a document."""


class V2LayoutError(FormatError, ValueError):
    """A TurboLoader (TBL v2) RAW_U8 image column cannot be a zero-copy view: payloads are compressed or not back to back."""


class MetadataError(ValueError):
    """Writer metadata is not a JSON object this format can store exactly.

    Keys must be str (JSON would turn ``1`` into ``"1"``, and ``{1: "a", "1": "b"}``
    would lose a key), nesting at most ``METADATA_DEPTH`` levels, values JSON
    (no NaN / inf), and the header it makes at most 16 MiB.
    """


class DestinationError(OSError):
    """A writer's destination is refused: not a regular file or directory (a link, FIFO, device, socket),
    or a directory that is neither empty nor a dataset. Nothing is written or removed."""


class DestinationExistsError(DestinationError, FileExistsError):
    """The destination already holds a file or a dataset and ``overwrite=True`` was not given."""


class InsufficientSpaceError(OSError):
    """Not enough free disk space to write the output; the message says how much is needed and where.

    ``path`` is the directory, ``needed`` and ``available`` are bytes.
    """

    def __init__(self, message: str, *, path: str = "", needed: int = 0, available: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.needed = needed
        self.available = available

    def __str__(self) -> str:
        return str(self.args[0])

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), self.args, self.__dict__)


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
    "DestinationError",
    "DestinationExistsError",
    "DuplicateShardError",
    "FormatError",
    "HeaderChecksumError",
    "HeaderFormatError",
    "HeaderTooLargeError",
    "InsufficientSpaceError",
    "InvalidSchemaError",
    "ManifestError",
    "ManifestMismatchError",
    "MetadataError",
    "MissingShardError",
    "NotADatasetError",
    "NotRegularFileError",
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
