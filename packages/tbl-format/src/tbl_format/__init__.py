"""tbl-format: the .tbl file format (SPEC.md), its streaming crash-safe writer, validating mmap reader and `tbl` CLI."""

from __future__ import annotations

from .arrow import arrow_schema, to_arrow_batch, to_arrow_dataset
from .dataset import DEFAULT_MAX_OPEN, Dataset, open
from .destination import check_destination, foreign_shard
from .errors import (
    BadMagicError,
    ColumnarLayoutError,
    CompressionUnavailableError,
    CorruptDataError,
    DataChecksumError,
    DatasetChangedError,
    DestinationError,
    DestinationExistsError,
    DocumentIndexError,
    DuplicateShardError,
    FormatError,
    HeaderChecksumError,
    HeaderFormatError,
    HeaderTooLargeError,
    InsufficientSpaceError,
    InvalidSchemaError,
    ManifestError,
    ManifestMismatchError,
    MetadataError,
    MissingShardError,
    NotADatasetError,
    NotRegularFileError,
    OffsetsError,
    RegionAlignmentError,
    RegionBoundsError,
    SchemaMismatchError,
    TableChecksumError,
    TruncatedFileError,
    UnknownCodecError,
    UnsupportedVersionError,
    V2LayoutError,
)
from .fsutil import file_kind, open_regular
from .kinds import KINDS, Kind
from .layout import FORMAT_VERSION
from .manifest import merge_manifests
from .parallel import write_parallel
from .placed import PlacedWriter, row_crcs
from .schema import LEAF_KINDS, Leaf, Schema, infer_schema
from .writer import METADATA_DEPTH, Writer, write

__version__ = "0.1.0"

__all__ = [
    "BadMagicError",
    "ColumnarLayoutError",
    "CompressionUnavailableError",
    "CorruptDataError",
    "DEFAULT_MAX_OPEN",
    "DataChecksumError",
    "Dataset",
    "DatasetChangedError",
    "DestinationError",
    "DestinationExistsError",
    "DocumentIndexError",
    "DuplicateShardError",
    "FORMAT_VERSION",
    "FormatError",
    "HeaderChecksumError",
    "HeaderFormatError",
    "HeaderTooLargeError",
    "InsufficientSpaceError",
    "InvalidSchemaError",
    "KINDS",
    "Kind",
    "LEAF_KINDS",
    "Leaf",
    "METADATA_DEPTH",
    "ManifestError",
    "ManifestMismatchError",
    "MetadataError",
    "MissingShardError",
    "NotADatasetError",
    "NotRegularFileError",
    "OffsetsError",
    "PlacedWriter",
    "RegionAlignmentError",
    "RegionBoundsError",
    "Schema",
    "SchemaMismatchError",
    "TableChecksumError",
    "TruncatedFileError",
    "UnknownCodecError",
    "UnsupportedVersionError",
    "V2LayoutError",
    "Writer",
    "__version__",
    "arrow_schema",
    "check_destination",
    "file_kind",
    "foreign_shard",
    "infer_schema",
    "merge_manifests",
    "open",
    "open_regular",
    "row_crcs",
    "to_arrow_batch",
    "to_arrow_dataset",
    "write",
    "write_parallel",
]
