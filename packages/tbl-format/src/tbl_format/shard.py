"""The per-file interface a Dataset uses for each shard file.

``Dataset`` (dataset.py) never parses a file itself: it opens each shard through
``opener.open_file(path)``, which dispatches on the first bytes (``\\x89TBL`` ->
``TblFile`` in reader.py, ``TBL\\x02`` -> ``TurboLoaderFile`` in turboloader.py), and
talks to the result only through the ``Shard`` methods below. A reader for another
layout subclasses ``Shard`` and implements the abstract members; the defaults
of ``read_range`` and ``describe`` work for any subclass.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ColumnarLayoutError, TruncatedFileError
from .fsutil import open_regular
from .schema import Leaf, Schema

#: Progress callback of verify(): called with (bytes checked so far, bytes to check).
Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class LeafBuffers:
    """One leaf's stored regions in one file (SPEC.md, "Columns"), as read-only memoryviews.

    ``data``: fixed-size leaves, ``rows * row_bytes`` bytes. ``offsets``: variable-size
    leaves, ``rows + 1`` u64 (byte offsets into the heap; item counts for var_list).
    ``heap``: the logical heap, a view of the map, or for an LZ4-compressed heap its
    decoded bytes (``compressed`` True: a copy, compression cannot be zero-copy).
    ``shapes``: var_array, ``rows * ndim`` u64. ``items``: var_list of str,
    ``count + 1`` u64 heap offsets. ``present``: optional leaves, one byte a row.
    Regions a kind does not use are None. The views keep the map alive.
    """

    leaf: Leaf
    rows: int
    data: Any = None
    offsets: Any = None
    heap: Any = None
    shapes: Any = None
    items: Any = None
    present: Any = None
    compressed: bool = False


class Shard:
    """One open file of a dataset.

    Attributes: ``path`` (Path), ``rows`` (int), ``schema`` (Schema),
    ``metadata`` (dict), ``header_crc32`` (int: the checksum a manifest records
    for this file; any stable checksum of the file's header).

    ``get(i)`` returns row ``i`` (``0 <= i < rows``; negative indices count
    from the end; anything else raises IndexError) as a sample pytree.
    ``column(path)`` returns the zero-copy (rows, *shape) view of a fixed-size
    leaf. ``values(path, rows)`` returns one leaf of several rows, each value as
    ``get`` would return it (the default reads whole rows; readers override it). ``verify(progress)`` checks every data checksum and raises a
    FormatError subclass on the first failure. ``close()`` releases the map;
    views handed out earlier keep it alive until they die.
    """

    path: Path
    rows: int
    schema: Schema
    metadata: dict[str, Any]
    header_crc32: int

    def get(self, i: int) -> Any:
        raise NotImplementedError

    def read_range(self, start: int, stop: int) -> list[Any]:
        """Rows start..stop-1 as a list of samples (readers override this with a batched decoder)."""
        get = self.get
        return [get(i) for i in range(start, stop)]

    def column(self, leaf_path: str) -> Any:
        raise NotImplementedError

    def values(self, leaf_path: str, rows: list[int]) -> list[Any]:
        """Leaf ``leaf_path`` of each of ``rows`` (ints in ``[0, self.rows)``, else IndexError), in order."""
        pick = leaf_picker(self.schema, leaf_path)
        check_rows(rows, self.rows)
        get = self.get
        return [pick(get(i)) for i in rows]

    def present(self, leaf_path: str) -> Any:
        """Zero-copy (rows,) view of an optional leaf's presence flags (nonzero: the row holds a value)."""
        raise ValueError(f"{self.path}: this file has no optional leaves")

    def buffers(self, leaf_path: str) -> LeafBuffers:
        """The stored regions of one leaf, as zero-copy views of the map (see LeafBuffers).

        Only columnar files have them; ColumnarLayoutError for any other layout.
        """
        raise ColumnarLayoutError(f"{self.path}: this file layout stores no per-leaf columns")

    def verify(self, progress: Progress | None = None) -> None:
        raise NotImplementedError

    def block_flags(self) -> bytearray:
        """One zeroed flag per checksummed block, for ``verify_rows`` (the default checks the file as one block)."""
        return bytearray(1)

    def verify_rows(self, rows: list[int], leaves: list[str], flags: bytearray) -> list[str]:
        """Check the blocks holding ``leaves`` of ``rows`` whose flag is 0, then set their flags; returns the
        leaves whose blocks are now all checked. DataChecksumError names the file, block and rows (of this file).

        The default verifies the whole file the first time (formats without per-block checksums).
        """
        if not flags[0]:
            self.verify()
            flags[0] = 1
        return list(leaves)

    def describe(self) -> dict[str, Any]:
        """Facts for `tbl inspect`: {"format": ..., "columns": {path: {"stored_bytes", "raw_bytes", ...}}}."""
        return {"format": type(self).__name__, "columns": {}}

    def close(self) -> None:
        raise NotImplementedError


def map_file(path: Path, min_size: int, what: str) -> tuple[Any, int]:
    """(read-only mmap of the whole file, its size); TruncatedFileError if shorter than ``min_size``.

    Only a regular file is opened (NotRegularFileError otherwise: a FIFO would block).
    """
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size < min_size:
            raise TruncatedFileError(f"{path}: {size} bytes, shorter than the {min_size}-byte {what}")
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ), size
    finally:
        os.close(fd)


def release_map(mm: Any) -> None:
    """Close a file's mmap unless views of it are still exported; those keep it alive until they die."""
    if mm is not None:
        try:
            mm.close()
        except BufferError:
            pass


def check_rows(rows: list[int], n: int) -> None:
    """IndexError unless every entry of ``rows`` is in [0, n) (negative rows are not wrapped)."""
    if rows and (min(rows) < 0 or max(rows) >= n):
        bad = next(i for i in rows if not 0 <= i < n)
        raise IndexError(f"row {bad} out of range for {n} rows")


def leaf_picker(schema: Schema, leaf_path: str) -> Callable[[Any], Any]:
    """Function taking a sample pytree of ``schema`` to its value at ``leaf_path`` (KeyError if none)."""
    if leaf_path not in schema.leaves:
        raise KeyError(f"no leaf {leaf_path!r}; leaves are {list(schema.leaves)}")
    steps: list[Any] = []

    def find(node: Any, path: str) -> bool:
        if isinstance(node, Leaf):
            return path == leaf_path
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, sub in items:
            steps.append(key)
            if find(sub, f"{path}/{key}" if path else str(key)):
                return True
            steps.pop()
        return False

    find(schema.tree, "")

    def pick(sample: Any) -> Any:
        for key in steps:
            sample = sample[key]
        return sample

    return pick


def fixed_leaf(schema: Schema, leaf_path: str) -> Leaf:
    """The Leaf at leaf_path, which must be fixed-size (KeyError / ValueError otherwise)."""
    try:
        leaf = schema.leaves[leaf_path]
    except KeyError:
        raise KeyError(f"no leaf {leaf_path!r}; leaves are {list(schema.leaves)}") from None
    if not leaf.fixed_size or leaf.kind == "none":
        raise ValueError(f"leaf {leaf_path!r} is {leaf.kind}, not fixed-size: it has no column view")
    return leaf
