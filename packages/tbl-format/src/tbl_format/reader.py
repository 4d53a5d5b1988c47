"""Validating mmap reader of one .tbl file (SPEC.md).

Opening checks, in this order and in time independent of the row count except
for CRC-32 over the tables: magic, major version, header length cap, header
CRC, declared file size, header JSON fields, every region's bounds (integer
arithmetic on Python ints, so no overflow) and alignment, the CRC-32 of every
offset / shape / compression-index / checksum table, and the first and last
entry of every offsets table. Monotonicity of offsets is checked per access
(one chained comparison) and in full by verify(), which also checks every
data-block CRC-32.

Rows are read by functions generated once per file from the schema (Python
source compiled with exec): ``get(i)`` does one ``unpack_from`` per scalar leaf
and one per variable-size leaf's offset pair, and ``read_range(a, b)`` decodes a
few thousand rows per column at once with ``memoryview.cast(...).tolist()``
and zips them into samples. Only ``repr()`` of strings and validated integers
reach the generated source.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from operator import index as _index
from pathlib import Path
from typing import Any

from .codec import CODECS, block_decoder
from .crc import crc32
from .errors import (
    BadMagicError,
    CorruptDataError,
    DataChecksumError,
    HeaderChecksumError,
    HeaderFormatError,
    HeaderTooLargeError,
    InvalidSchemaError,
    OffsetsError,
    RegionAlignmentError,
    RegionBoundsError,
    TableChecksumError,
    TruncatedFileError,
    UnknownCodecError,
    UnsupportedVersionError,
)
from .layout import ALIGN, FORMAT_VERSION, HEADER_CAP, MAGIC, PREAMBLE, PREAMBLE_CRC_SPAN, PREAMBLE_SIZE
from .schema import Leaf, Schema
from .shard import LeafBuffers, Progress, Shard, check_rows, fixed_leaf, map_file, release_map

try:
    import numpy as _np
except ImportError:  # column views are memoryviews then
    _np = None

_U64 = struct.Struct("<Q")
_U64X2 = struct.Struct("<QQ")
_MAX_CODEC_BLOCK = 16 << 20
# Exceptions a damaged data region can provoke while decoding a row; turned into CorruptDataError.
_DECODE_ERRORS = (struct.error, UnicodeDecodeError, ValueError, TypeError, OverflowError, MemoryError, IndexError)
_LITTLE = sys.byteorder == "little"

__all__ = ["MAGIC", "Column", "Region", "TblFile"]


def _numpy() -> Any:
    """numpy, or None when it is not installed (tests hide it by replacing this function)."""
    return _np


def _get(obj: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise HeaderFormatError(f"{where}: missing field {key!r}")
    v = obj[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise HeaderFormatError(f"{where}: field {key!r} has the wrong type ({type(v).__name__})")
    return v


def _nonneg(obj: Any, key: str, where: str) -> int:
    v = _get(obj, key, int, where)
    if isinstance(v, bool) or v < 0:
        raise HeaderFormatError(f"{where}: field {key!r} must be a non-negative int, got {v!r}")
    return v


@dataclass(frozen=True, slots=True)
class Region:
    """One validated region of the file: ``size`` bytes at ``offset``, block checksums from ``first_block``."""

    name: str
    offset: int
    size: int
    first_block: int


@dataclass(frozen=True, slots=True)
class Column:
    """One leaf's validated regions (SPEC.md, "Columns"); the ones its kind does not use are None."""

    path: str
    leaf: Leaf
    data: Region | None = None  # fixed-size leaves
    offsets: Region | None = None  # variable-size leaves
    heap: Region | None = None
    shapes: Region | None = None  # var_array
    items: Region | None = None  # var_list of str
    index: Region | None = None  # compressed heap
    present: Region | None = None  # optional leaves
    #: (codec, block, raw_size) of a compressed heap, else None
    compression: tuple[str, int, int] | None = None
    #: bytes of the logical (uncompressed) heap
    logical: int = 0
    #: var_list: items in all rows (``offsets[N]``)
    count: int = 0

    @property
    def regions(self) -> list[Region]:
        """The column's regions in header order (SPEC.md): every block of them is checksummed."""
        regs = (self.data, self.offsets, self.heap, self.index, self.shapes, self.items, self.present)
        return [r for r in regs if r is not None]


class _BlockHeap:
    """Reads logical byte ranges of a block-compressed heap (LZ4 or zstd); caches the last block."""

    def __init__(self, f: TblFile, path: str, heap: Region, index: Region, compression: tuple[str, int, int]) -> None:
        codec, self.block, self.raw_size = compression
        self.where = f"{f.path}: leaf {path!r}"
        self.decode = block_decoder(codec, self.block, self.where)
        self.mm = f._mm
        self.heap = heap
        self.index_off = index.offset
        # One tuple, replaced atomically: reader threads never see a block number paired with another block's bytes.
        self.cache: tuple[int, bytes] = (-1, b"")

    def _block(self, k: int) -> bytes:
        cache = self.cache
        if cache[0] == k:
            return cache[1]
        a, b = _U64X2.unpack_from(self.mm, self.index_off + 8 * k)
        if not a <= b <= self.heap.size:
            raise OffsetsError(f"{self.where}: compression index entries {a}, {b} of block {k} are out of order")
        raw_len = min(self.block, self.raw_size - k * self.block)
        data = self.decode(self.mm[self.heap.offset + a : self.heap.offset + b], k, raw_len)
        self.cache = (k, data)
        return data

    def read(self, s: int, e: int) -> bytes:
        if s == e:
            return b""
        block = self.block
        k, pos = divmod(s, block)
        if e <= (k + 1) * block:
            return self._block(k)[pos : pos + e - s]
        parts = []
        while s < e:
            k, pos = divmod(s, block)
            chunk = self._block(k)[pos : pos + e - s]
            parts.append(chunk)
            s += len(chunk)
        return b"".join(parts)


@lru_cache(maxsize=256)
def _compile_accessor(src: str) -> Any:
    """Compiled accessor source. The source depends only on the schema (file offsets live in the
    namespace), so a dataset of many shards compiles it once."""
    return compile(src, "<tbl accessor>", "exec")


def _decode_strs(mm: Any, h: int, offs: list[int]) -> list[str]:
    """Decode consecutive strings whose offsets (relative to heap start h) are offs."""
    base = offs[0]
    blob = mm[h + base : h + offs[-1]]
    if blob.isascii():
        text = blob.decode("ascii")
        if base == 0:
            return [text[s:e] for s, e in pairwise(offs)]
        return [text[s - base : e - base] for s, e in pairwise(offs)]
    return [blob[s - base : e - base].decode("utf-8") for s, e in pairwise(offs)]


def _slice_bytes(mm: Any, h: int, offs: list[int]) -> list[bytes]:
    base = offs[0]
    blob = mm[h + base : h + offs[-1]]
    return [blob[s - base : e - base] for s, e in pairwise(offs)]


def _mapped_reader(mm: Any, h: int) -> Any:
    """(s, e) -> bytes s..e-1 of an uncompressed heap at h (the interface of _BlockHeap.read)."""
    return lambda s, e: mm[h + s : h + e]


def _str_items(read: Any, offs: list[int], limit: int, where: str) -> list[str]:
    """The str items whose byte offsets (into a heap read by ``read``) are offs, checked against the heap size."""
    _check_run(offs, limit, where)
    base = offs[0]
    blob = read(base, offs[-1])
    if blob.isascii():
        text = blob.decode("ascii")
        return [text[s - base : e - base] for s, e in pairwise(offs)]
    return [blob[s - base : e - base].decode("utf-8") for s, e in pairwise(offs)]


def _check_run(offs: list[int], limit: int, where: str) -> None:
    """offs must be non-decreasing and end at or below limit (C-speed check via sorted)."""
    if offs[-1] > limit or offs != sorted(offs):
        raise OffsetsError(f"{where}: offsets are not monotonic or exceed the heap")


def _all_set(flags: bytearray, r: Region, bs: int) -> bool:
    """Whether every block of region ``r`` is flagged as checked."""
    n = -(-r.size // bs)
    return flags.find(0, r.first_block, r.first_block + n) < 0


class TblFile(Shard):
    """One .tbl file, memory-mapped read-only. See Shard for the interface."""

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = False) -> None:
        if not _LITTLE:
            raise RuntimeError("this reader maps columns in native byte order and needs a little-endian host")
        self.path = Path(path)
        self._mm: Any = None
        self._mv: Any = None
        self._mm, size = map_file(self.path, PREAMBLE_SIZE, "preamble")
        try:
            self._parse(size)
        except BaseException:
            self.close()
            raise
        if verify:
            self.verify()

    # ---- open-time validation -------------------------------------------------------------------
    def _parse(self, size: int) -> None:
        mm = self._mm
        where = str(self.path)
        magic, major, minor, hlen, fsize, crc, _reserved = PREAMBLE.unpack_from(mm, 0)
        if magic != MAGIC:
            raise BadMagicError(f"{where}: not a .tbl file (magic {magic!r})")
        if major != FORMAT_VERSION[0]:
            raise UnsupportedVersionError(
                f"{where}: format version {major}.{minor}; this reader knows major {FORMAT_VERSION[0]}"
            )
        self.version = (major, minor)
        if hlen > HEADER_CAP:
            raise HeaderTooLargeError(f"{where}: header length {hlen} exceeds the cap of {HEADER_CAP} bytes")
        data_start = PREAMBLE_SIZE + hlen
        if data_start > size:
            raise TruncatedFileError(f"{where}: {size} bytes, header needs {data_start}")
        header_bytes = mm[PREAMBLE_SIZE:data_start]
        if crc32(header_bytes, crc32(mm[:PREAMBLE_CRC_SPAN])) != crc:
            raise HeaderChecksumError(f"{where}: header CRC-32 mismatch")
        self.header_crc32 = crc
        if size < fsize:
            raise TruncatedFileError(f"{where}: {size} bytes, header declares {fsize}")
        if size > fsize:
            raise RegionBoundsError(f"{where}: {size} bytes, header declares {fsize}")
        try:
            header = json.loads(header_bytes.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise HeaderFormatError(f"{where}: header is not UTF-8 JSON: {exc}") from None
        if not isinstance(header, dict):
            raise HeaderFormatError(f"{where}: header is not a JSON object")
        self.header = header
        self.rows = _nonneg(header, "rows", where)
        bs = _nonneg(header, "block_size", where)
        if bs < ALIGN or bs > 1 << 30 or bs & (bs - 1):
            raise HeaderFormatError(f"{where}: block_size {bs} is not a power of two in [4096, 2**30]")
        self.block_size = bs
        self.schema = self._schema(_get(header, "schema", dict, where), minor, where)
        self.metadata = _get(header, "metadata", dict, where)
        self._mv = memoryview(mm)

        checks = _get(header, "checksums", dict, where)
        n_crc, rem = divmod(_nonneg(checks, "size", where + ": checksums"), 4)
        if rem:
            raise RegionBoundsError(f"{where}: checksum table size is not a multiple of 4")
        self._crc_table = self._region("checksums", checks, data_start, size, where, table=True, blocks=False)
        self.n_blocks = n_crc

        cols = _get(header, "columns", list, where)
        leaves = list(self.schema.leaves.items())
        if len(cols) != len(leaves):
            raise HeaderFormatError(f"{where}: {len(cols)} columns for {len(leaves)} schema leaves")
        self._cols: dict[str, Column] = {}
        spans = [(self._crc_table.offset, self._crc_table.size)]
        for col, (path, leaf) in zip(cols, leaves, strict=True):
            cw = f"{where}: leaf {path!r}"
            if _get(col, "path", str, cw) != path:
                raise HeaderFormatError(f"{cw}: column path {col['path']!r} does not follow schema order")
            column = self._column(col, path, leaf, data_start, size, cw)
            self._cols[path] = column
            spans.extend((r.offset, r.size) for r in column.regions)
        spans.sort()
        for (a, n), (b, _) in pairwise(spans):
            if a + n > b:
                raise RegionBoundsError(f"{where}: regions at {a} and {b} overlap")
        self._build_accessors()

    @staticmethod
    def _schema(obj: Any, minor: int, where: str) -> Schema:
        """The header's schema, checked against the file's minor version (SPEC.md, "Version and stability")."""
        try:
            schema = Schema.from_json(obj)
        except InvalidSchemaError as exc:
            if minor > FORMAT_VERSION[1]:
                # A newer minor may add leaf kinds and fields; this reader must not guess what they mean.
                raise UnsupportedVersionError(
                    f"{where}: format version 1.{minor} uses what this reader (1.{FORMAT_VERSION[1]}) does not know: "
                    f"{exc}"
                ) from None
            raise InvalidSchemaError(f"{where}: {exc}") from None
        if schema.minor > minor:
            raise InvalidSchemaError(
                f"{where}: the schema needs format 1.{schema.minor} (leaf kinds or fields added then), "
                f"the file declares 1.{minor}"
            )
        return schema

    def _region(
        self, name: str, obj: Any, data_start: int, size: int, where: str, *, table: bool, blocks: bool = True
    ) -> Region:
        """Validate one region object against the file; CRC-check it now if it is a table."""
        w = f"{where}: region {name!r}"
        off = _nonneg(obj, "offset", w)
        length = _nonneg(obj, "size", w)
        if off % ALIGN:
            raise RegionAlignmentError(f"{w}: offset {off} is not a multiple of {ALIGN}")
        if off < data_start or off + length > size:
            raise RegionBoundsError(f"{w}: bytes [{off}, {off + length}) outside the data area [{data_start}, {size})")
        first = 0
        if blocks:
            first = _nonneg(obj, "first_block", w)
            if first + -(-length // self.block_size) > self.n_blocks:
                raise RegionBoundsError(f"{w}: block checksums {first}.. lie outside the checksum table")
        region = Region(name, off, length, first)
        if table:
            want = _nonneg(obj, "crc32", w)
            if crc32(memoryview(self._mm)[off : off + length]) != want:
                raise TableChecksumError(f"{w}: CRC-32 mismatch")
        return region

    def _u64(self, offset: int) -> int:
        return _U64.unpack_from(self._mm, offset)[0]

    def _span(self, table: Region, first: int, last: int, what: str, where: str) -> None:
        """A u64 table must start at ``first`` and end at ``last`` (its other entries are checked on access)."""
        a, b = self._u64(table.offset), self._u64(table.offset + table.size - 8)
        if a != first or b != last:
            raise OffsetsError(f"{where}: {what} span [{a}, {b}], expected [{first}, {last}]")

    def _column(self, col: dict[str, Any], path: str, leaf: Leaf, data_start: int, size: int, where: str) -> Column:
        regions = _get(col, "regions", dict, where)
        rows = self.rows

        def region(name: str, table: bool) -> Region:
            return self._region(name, _get(regions, name, dict, where), data_start, size, where, table=table)

        present = None
        if leaf.optional:
            present = region("present", False)
            if present.size != rows:
                raise RegionBoundsError(f"{where}: present has {present.size} bytes, expected {rows}")
        if leaf.fixed_size:
            data = region("data", False)
            if data.size != rows * leaf.row_bytes:
                raise RegionBoundsError(f"{where}: data has {data.size} bytes, expected {rows} x {leaf.row_bytes}")
            return Column(path, leaf, data=data, present=present)
        offsets = region("offsets", True)
        heap = region("heap", False)
        if offsets.size != (rows + 1) * 8:
            raise RegionBoundsError(f"{where}: offsets have {offsets.size} bytes, expected {(rows + 1) * 8}")
        comp = col.get("compression")
        logical = heap.size
        index = compression = None
        if comp is not None:
            codec = _get(comp, "codec", str, where)
            if codec not in CODECS:
                raise UnknownCodecError(f"{where}: unknown compression codec {codec!r}")
            block = _nonneg(comp, "block", where)
            raw_size = _nonneg(comp, "raw_size", where)
            if not 0 < block <= _MAX_CODEC_BLOCK:
                raise HeaderFormatError(f"{where}: compression block {block} outside (0, {_MAX_CODEC_BLOCK}]")
            index = region("index", True)
            nblocks = -(-raw_size // block)
            if index.size != (nblocks + 1) * 8:
                raise RegionBoundsError(f"{where}: compression index has {index.size} bytes, expected {(nblocks + 1) * 8}")
            self._span(index, 0, heap.size, "compression index", where)
            logical = raw_size
            compression = (codec, block, raw_size)
        shapes = items = None
        count = 0
        if leaf.kind == "var_list":
            # offsets count items; scalar items are packed in the heap, str items end at items[k + 1].
            count = self._u64(offsets.offset + offsets.size - 8)
            if leaf.item == "str":
                items = region("items", True)
                if items.size != (count + 1) * 8:
                    raise RegionBoundsError(f"{where}: items have {items.size} bytes, expected {count} + 1 offsets")
                self._span(items, 0, logical, "item offsets", where)
            elif count * leaf.itemsize != logical:
                raise OffsetsError(f"{where}: {count} items of {leaf.itemsize} bytes, heap has {logical} bytes")
            self._span(offsets, 0, count, "offsets", where)
        else:
            self._span(offsets, 0, logical, "offsets", where)
        if leaf.kind == "var_array":
            shapes = region("shapes", True)
            if shapes.size != rows * leaf.ndim * 8:
                raise RegionBoundsError(f"{where}: shapes have {shapes.size} bytes, expected {rows * leaf.ndim * 8}")
        return Column(path, leaf, offsets=offsets, heap=heap, shapes=shapes, items=items, index=index,
                      present=present, compression=compression, logical=logical, count=count)

    # ---- accessors ------------------------------------------------------------------------------
    def _fixed_view(self, col: Column) -> Any:
        leaf = col.leaf
        data = col.data
        np = _numpy()
        shape = (self.rows, *leaf.row_shape)
        if np is not None:
            dtype = np.dtype(leaf.spec.numpy or leaf.dtype)
            count = data.size // dtype.itemsize
            return np.frombuffer(self._mm, dtype=dtype.newbyteorder("<"), count=count, offset=data.offset).reshape(shape)
        fmt = leaf.row_format
        fmt = "H" if fmt == "e" else fmt  # memoryview has no float16: the bits as uint16
        view = self._mv[data.offset : data.offset + data.size]
        return view.cast(fmt) if 0 in shape else view.cast(fmt, shape)

    def column(self, leaf_path: str) -> Any:
        """Zero-copy (rows, *shape) view of a fixed-size leaf: read-only numpy array, or memoryview without numpy.

        Rows of an optional leaf that hold None read as zeros here; ``present(leaf)`` tells them apart.
        """
        fixed_leaf(self.schema, leaf_path)
        cache = self.__dict__.setdefault("_views", {})
        if leaf_path not in cache:
            cache[leaf_path] = self._fixed_view(self._cols[leaf_path])
        return cache[leaf_path]

    def present(self, leaf_path: str) -> Any:
        """Zero-copy (rows,) bool view (uint8 memoryview without numpy) of an optional leaf: nonzero where a value is stored."""
        col = self._cols.get(leaf_path)
        if col is None:
            raise KeyError(f"no leaf {leaf_path!r}; leaves are {list(self._cols)}")
        if col.present is None:
            raise ValueError(f"leaf {leaf_path!r} is not optional: every row holds a value")
        r = col.present
        np = _numpy()
        if np is not None:
            return np.frombuffer(self._mm, dtype=np.bool_, count=r.size, offset=r.offset)
        return self._mv[r.offset : r.offset + r.size]

    def buffers(self, leaf_path: str) -> LeafBuffers:
        """The stored regions of one leaf as views of the map (a compressed heap decoded once, then cached)."""
        if self._mm is None:
            raise ValueError(f"{self.path}: read from a closed file")
        col = self._cols.get(leaf_path)
        if col is None:
            raise KeyError(f"no leaf {leaf_path!r}; leaves are {list(self._cols)}")
        mv = self._mv

        def view(r: Region | None) -> Any:
            return None if r is None else mv[r.offset : r.offset + r.size]

        heap = view(col.heap)
        if col.compression is not None:
            cache = self.__dict__.setdefault("_heaps", {})
            if leaf_path not in cache:
                raw_size = col.compression[2]
                cache[leaf_path] = _BlockHeap(self, col.path, col.heap, col.index, col.compression).read(0, raw_size)
            heap = memoryview(cache[leaf_path])
        return LeafBuffers(col.leaf, self.rows, data=view(col.data), offsets=view(col.offsets), heap=heap,
                           shapes=view(col.shapes), items=view(col.items), present=view(col.present),
                           compressed=col.compression is not None)

    def values(self, leaf_path: str, rows: list[int]) -> list[Any]:
        """Leaf ``leaf_path`` of each of ``rows`` (ints in ``[0, rows)``), each as ``get`` returns it.

        Reads that one leaf only: a batch of strings does not decode the rest of
        every row. Index errors are raised before anything is read.
        """
        if self._mm is None:
            raise ValueError(f"{self.path}: read from a closed file")
        read = self._value_readers.get(leaf_path)
        if read is None:
            raise KeyError(f"no leaf {leaf_path!r}; leaves are {list(self._cols)}")
        check_rows(rows, self.rows)
        return read(rows)

    def _var_array_reader(self, col: Column, heap_read: Any) -> Any:
        """Function (i, s, e) -> array of row i of a var_array leaf."""
        leaf = col.leaf
        shapes_off = col.shapes.offset
        ndim = leaf.ndim
        shape_of = struct.Struct(f"<{ndim}Q").unpack_from
        itemsize = leaf.itemsize
        np = _numpy()
        mm, mv = self._mm, self._mv  # not self: the accessors must not form a cycle with this file
        h = col.heap.offset
        fmt = "H" if leaf.row_format == "e" else leaf.row_format
        dtype = np.dtype(leaf.dtype).newbyteorder("<") if np is not None else None
        where = f"{self.path}: leaf {col.path!r}"

        def read(i: int, s: int, e: int) -> Any:
            shape = shape_of(mm, shapes_off + i * 8 * ndim)
            n = 1
            for d in shape:
                n *= d
            if n * itemsize > e - s:
                raise CorruptDataError(f"{where}: row {i}: shape {shape} needs more than its {e - s} bytes")
            if heap_read is None:
                if np is not None:
                    return np.frombuffer(mm, dtype=dtype, count=n, offset=h + s).reshape(shape)
                view = mv[h + s : h + s + n * itemsize]
                return view.cast(fmt) if 0 in shape else view.cast(fmt, shape)
            raw = heap_read(s, s + n * itemsize)
            if np is not None:
                return np.frombuffer(raw, dtype=dtype, count=n).reshape(shape)
            view = memoryview(raw)
            return view.cast(fmt) if 0 in shape else view.cast(fmt, shape)

        return read

    def _build_accessors(self) -> None:
        """Generate get(i), read_range(a, b) and one values(rows) reader per leaf for this file's schema.

        Each leaf contributes the statements that compute its value ``v<k>`` of row ``i`` (used by
        ``get`` and by the leaf's own ``values`` reader) and those that compute the list ``L<k>`` of
        its values of rows ``a..b-1`` (used by ``read_range``).
        """
        np = _numpy()
        ns: dict[str, Any] = {
            "mm": self._mm, "mv": self._mv, "N": self.rows, "QQ": _U64X2.unpack_from, "_index": _index,
            "IndexError": IndexError, "OffsetsError": OffsetsError, "CorruptDataError": CorruptDataError,
            "DECODE_ERRORS": _DECODE_ERRORS, "WHERE": str(self.path), "_decode_strs": _decode_strs,
            "_slice_bytes": _slice_bytes, "_check_run": _check_run, "_str_items": _str_items,
            "range": range, "zip": zip, "list": list, "memoryview": memoryview, "pairwise": pairwise,
        }
        get_pre: list[str] = []
        names: dict[str, str] = {}
        range_pre: list[str] = []
        leaf_sources: list[str] = []
        for k, (path, col) in enumerate(self._cols.items()):
            ns[f"P{k}"] = path
            names[path] = f"v{k}"
            get_lines, range_lines = self._leaf_code(k, col, ns, np)
            if col.present is not None:
                ns[f"p{k}"] = col.present.offset
                get_lines.append(f"if not mm[p{k} + i]: v{k} = None")
                range_lines.append(f"L{k} = [x if f else None for x, f in zip(L{k}, mm[p{k} + a:p{k} + b])]")
            get_pre.extend(get_lines)
            range_pre.extend(range_lines)
            body = "\n            ".join(get_lines)
            leaf_sources.append(f"""
def values{k}(rows):
    out = []
    append = out.append
    try:
        for i in rows:
            {body}
            append(v{k})
    except DECODE_ERRORS as exc:
        raise CorruptDataError(f"{{WHERE}}: leaf {{P{k}!r}}: {{exc!r}}") from None
    return out
""")

        def expr(node: Any, prefix: str) -> str:
            if isinstance(node, Leaf):
                return names[prefix]
            if isinstance(node, dict):
                items = ", ".join(f"{k!r}: {expr(v, f'{prefix}/{k}' if prefix else k)}" for k, v in node.items())
                return "{" + items + "}"
            inner = [expr(v, f"{prefix}/{i}" if prefix else str(i)) for i, v in enumerate(node)]
            if isinstance(node, list):
                return "[" + ", ".join(inner) + "]"
            return "(" + "".join(x + ", " for x in inner) + ")"

        tree = expr(self.schema.tree, "")
        body = "\n        ".join(get_pre) or "pass"
        leaves = [names[p] for p in self._cols]
        if leaves:
            loop = f"for {', '.join(leaves)}, in zip({', '.join('L' + v[1:] for v in leaves)})"
        else:
            loop = "for _ in range(b - a)"
        range_body = "\n        ".join(range_pre) or "pass"
        src = f"""
def get(i):
    if i.__class__ is not int:
        i = _index(i)
    if i < 0:
        i += N
    if not 0 <= i < N:
        raise IndexError(f"row {{i}} out of range for {{N}} rows")
    try:
        {body}
        return {tree}
    except DECODE_ERRORS as exc:
        raise CorruptDataError(f"{{WHERE}}: row {{i}}: {{exc!r}}") from None

def read_range(a, b):
    if not 0 <= a <= b <= N:
        raise IndexError(f"rows [{{a}}, {{b}}) out of range for {{N}} rows")
    try:
        {range_body}
        return [{tree} {loop}]
    except DECODE_ERRORS as exc:
        raise CorruptDataError(f"{{WHERE}}: rows [{{a}}, {{b}}): {{exc!r}}") from None
""" + "".join(leaf_sources)
        exec(_compile_accessor(src), ns)
        # Popped, not read: a function left in its own globals is a reference cycle, and
        # a cycle would keep the map (and its file descriptor) alive until the cyclic GC runs.
        self.get = ns.pop("get")
        self.read_range = ns.pop("read_range")
        self._value_readers = {path: ns.pop(f"values{k}") for k, path in enumerate(self._cols)}
        self._source = src

    def _leaf_code(self, k: int, col: Column, ns: dict[str, Any], np: Any) -> tuple[list[str], list[str]]:
        """(statements computing v<k> of row i, statements computing L<k> of rows a..b-1) for one leaf."""
        leaf = col.leaf
        spec = leaf.spec
        v = f"v{k}"
        if leaf.kind == "none":
            return [f"{v} = None"], [f"L{k} = [None] * (b - a)"]
        if leaf.fixed_size:
            ns[f"b{k}"] = col.data.offset
            if spec.scalar in ("q", "d"):
                ns[f"U{k}"] = struct.Struct("<" + spec.scalar).unpack_from
                return ([f"{v} = U{k}(mm, b{k} + i * 8)[0]"],
                        [f"L{k} = mv[b{k} + a * 8:b{k} + b * 8].cast({spec.scalar!r}).tolist()"])
            if spec.scalar == "?":
                return [f"{v} = mm[b{k} + i] != 0"], [f"L{k} = [x != 0 for x in mm[b{k} + a:b{k} + b]]"]
            ns[f"C{k}"] = self._fixed_view(col)
            if np is not None:
                return [f"{v} = C{k}[i]"], [f"L{k} = list(C{k}[a:b])"]
            ns[f"R{k}"] = leaf.row_bytes
            fmt = "H" if leaf.row_format == "e" else leaf.row_format
            shape = leaf.row_shape
            cast = f".cast({fmt!r})" if 0 in shape else f".cast({fmt!r}, {list(shape)!r})"
            # Evaluated in a copy of ns so the lambda and ns do not reference each other.
            ns[f"ROW{k}"] = eval(f"lambda i: mv[b{k} + i * R{k}:b{k} + (i + 1) * R{k}]{cast}", dict(ns))
            return [f"{v} = ROW{k}(i)"], [f"L{k} = [ROW{k}(j) for j in range(a, b)]"]
        ns[f"o{k}"], ns[f"h{k}"] = col.offsets.offset, col.heap.offset
        ns[f"H{k}"] = col.count if leaf.kind == "var_list" else col.logical
        get_lines = [
            f"s{k}, e{k} = QQ(mm, o{k} + i * 8)",
            f"if not s{k} <= e{k} <= H{k}: raise OffsetsError(f'{{WHERE}}: leaf {{P{k}!r}}: row {{i}}: offsets out of order')",
        ]
        range_lines = [f"O{k} = mv[o{k} + a * 8:o{k} + b * 8 + 8].cast('Q').tolist()", f"_check_run(O{k}, H{k}, WHERE)"]
        heap_read = None
        if col.compression is not None:
            heap_read = _BlockHeap(self, col.path, col.heap, col.index, col.compression).read
            ns[f"Z{k}"] = heap_read
        if leaf.kind == "var_array":
            ns[f"VA{k}"] = self._var_array_reader(col, heap_read)
            get_lines.append(f"{v} = VA{k}(i, s{k}, e{k})")
            range_lines.append(f"L{k} = [VA{k}(a + j, s, e) for j, (s, e) in enumerate(zip(O{k}, O{k}[1:]))]")
            return get_lines, range_lines
        if leaf.kind == "var_list":
            return self._list_code(k, col, ns, heap_read, get_lines, range_lines)
        raw = f"Z{k}(s{k}, e{k})" if heap_read else f"mm[h{k} + s{k}:h{k} + e{k}]"
        # bytes.decode() is about twice as fast as str(b, 'utf-8') on CPython 3.11.
        get_lines.append(f"{v} = {raw}.decode()" if leaf.kind == "str" else f"{v} = {raw}")
        if heap_read:
            conv = f"Z{k}(s, e).decode()" if leaf.kind == "str" else f"Z{k}(s, e)"
            range_lines.append(f"L{k} = [{conv} for s, e in zip(O{k}, O{k}[1:])]")
        elif leaf.kind == "str":
            range_lines.append(f"L{k} = _decode_strs(mm, h{k}, O{k})")
        else:
            range_lines.append(f"L{k} = _slice_bytes(mm, h{k}, O{k})")
        return get_lines, range_lines

    def _list_code(self, k: int, col: Column, ns: dict[str, Any], heap_read: Any, get_lines: list[str],
                   range_lines: list[str]) -> tuple[list[str], list[str]]:
        """var_list: row i holds items offsets[i]..offsets[i+1]-1 (SPEC.md, "Columns")."""
        leaf = col.leaf
        v = f"v{k}"
        if leaf.item == "str":
            ns[f"I{k}"] = col.items.offset
            ns[f"G{k}"] = heap_read if heap_read is not None else _mapped_reader(self._mm, col.heap.offset)
            ns[f"HL{k}"] = col.logical
            get_lines.append(f"{v} = _str_items(G{k}, mv[I{k} + s{k} * 8:I{k} + e{k} * 8 + 8].cast('Q').tolist(), HL{k}, WHERE)")
            range_lines.append(f"T{k} = _str_items(G{k}, mv[I{k} + O{k}[0] * 8:I{k} + O{k}[-1] * 8 + 8].cast('Q').tolist(), HL{k}, WHERE)")
            range_lines.append(f"L{k} = [T{k}[s - O{k}[0]:e - O{k}[0]] for s, e in pairwise(O{k})]")
            return get_lines, range_lines
        size = leaf.itemsize
        fmt = "B" if leaf.item == "bool" else leaf.row_format
        conv = "[x != 0 for x in {}]" if leaf.item == "bool" else "{}"
        if heap_read is not None:
            raw = f"memoryview(Z{k}(s{k} * {size}, e{k} * {size})).cast({fmt!r}).tolist()"
            whole = f"memoryview(Z{k}(O{k}[0] * {size}, O{k}[-1] * {size})).cast({fmt!r}).tolist()"
        else:
            raw = f"mv[h{k} + s{k} * {size}:h{k} + e{k} * {size}].cast({fmt!r}).tolist()"
            whole = f"mv[h{k} + O{k}[0] * {size}:h{k} + O{k}[-1] * {size}].cast({fmt!r}).tolist()"
        get_lines.append(f"{v} = {conv.format(raw)}")
        range_lines.append(f"T{k} = {conv.format(whole)}")
        range_lines.append(f"L{k} = [T{k}[s - O{k}[0]:e - O{k}[0]] for s, e in pairwise(O{k})]")
        return get_lines, range_lines

    # ---- verification ---------------------------------------------------------------------------
    def verify(self, progress: Progress | None = None) -> None:
        """Check every data-block CRC-32, then every offsets table, item table and var_array shape in full."""
        mv = self._mv
        crc_of = struct.Struct(f"<{self.n_blocks}I").unpack_from(self._mm, self._crc_table.offset)
        regions = [(path, r) for path, col in self._cols.items() for r in col.regions]
        total = sum(r.size for _, r in regions)
        done = 0
        bs = self.block_size
        for path, r in regions:
            for j, k in enumerate(range(0, r.size, bs)):
                n = min(bs, r.size - k)
                if crc32(mv[r.offset + k : r.offset + k + n]) != crc_of[r.first_block + j]:
                    raise DataChecksumError(
                        f"{self.path}: leaf {path!r}: {r.name} block {j} (bytes {r.offset + k}..{r.offset + k + n}) "
                        "fails its CRC-32",
                        path=str(self.path), block=r.first_block + j,
                    )
                done += n
                if progress is not None:
                    progress(done, total)
        for path, col in self._cols.items():
            if col.offsets is None:
                continue
            where = f"{self.path}: leaf {path!r}"
            self._check_monotonic(col.offsets.offset, self.rows + 1, where)
            for table in (col.index, col.items):
                if table is not None:
                    self._check_monotonic(table.offset, table.size // 8, f"{where} {table.name}")
            if col.leaf.kind in ("var_array", "var_list") or col.compression is not None:
                step = 4096
                for a in range(0, self.rows, step):
                    self.read_range(a, min(self.rows, a + step))

    def block_flags(self) -> bytearray:
        """One zeroed flag per entry of the checksum table (see ``verify_rows``)."""
        return bytearray(self.n_blocks)

    def verify_rows(self, rows: list[int], leaves: list[str], flags: bytearray) -> list[str]:
        """Check the CRC-32 of each data block (``data``, ``heap``, ``present``) holding ``leaves`` of ``rows``
        whose flag is 0, setting the flag of each that passes; returns the leaves whose data blocks are now all
        checked. Tables need no check here: every open checks them. DataChecksumError names the file, the
        leaf, the block and the rows (of this file) asked for that it holds."""
        finished = []
        bs = self.block_size
        for path in leaves:
            col = self._cols[path]
            regions = [r for r in (col.data, col.heap, col.present) if r is not None and r.size]
            if all(_all_set(flags, r, bs) for r in regions):
                finished.append(path)
                continue
            for r, ranges in self._row_ranges(col, rows):
                need: dict[int, list[int]] = {}
                first = r.first_block
                for i, a, b in ranges:
                    if b <= a:
                        continue
                    for j in range(a // bs, (b - 1) // bs + 1):
                        if not flags[first + j]:
                            need.setdefault(j, []).append(i)
                for j, touching in need.items():
                    self._check_block(r, j, path, touching, flags)
            if all(_all_set(flags, r, bs) for r in regions):
                finished.append(path)
        return finished

    def _row_ranges(self, col: Column, rows: list[int]) -> list[tuple[Region, list[tuple[int, int, int]]]]:
        """Per data region of ``col``: (row, first byte, end byte) of each of ``rows``, relative to the region."""
        out = []
        u64 = self._u64
        if col.present is not None:
            out.append((col.present, [(i, i, i + 1) for i in rows]))
        if col.data is not None and col.data.size:
            rb = col.leaf.row_bytes
            out.append((col.data, [(i, i * rb, (i + 1) * rb) for i in rows]))
        if col.heap is not None and col.heap.size:
            o = col.offsets.offset
            spans = [(i, u64(o + 8 * i), u64(o + 8 * i + 8)) for i in rows]
            leaf = col.leaf
            if leaf.kind == "var_list":
                if leaf.item == "str":
                    it = col.items.offset
                    spans = [(i, u64(it + 8 * s), u64(it + 8 * e)) for i, s, e in spans]
                else:
                    size = leaf.itemsize
                    spans = [(i, s * size, e * size) for i, s, e in spans]
            if col.compression is not None:
                # A logical range lies in whole compressed blocks: their stored bytes, from the index.
                block = col.compression[1]
                ix = col.index.offset
                spans = [(i, u64(ix + 8 * (s // block)), u64(ix + 8 * ((e - 1) // block + 1))) if e > s else (i, 0, 0)
                         for i, s, e in spans]
            limit = col.heap.size
            out.append((col.heap, [(i, min(s, limit), min(e, limit)) for i, s, e in spans]))
        return out

    def _check_block(self, r: Region, j: int, path: str, rows: list[int], flags: bytearray) -> None:
        bs = self.block_size
        a = r.offset + j * bs
        b = r.offset + min(r.size, (j + 1) * bs)
        g = r.first_block + j
        want = struct.unpack_from("<I", self._mm, self._crc_table.offset + 4 * g)[0]
        if crc32(self._mv[a:b]) != want:
            raise DataChecksumError(
                f"{self.path}: leaf {path!r}: {r.name} block {j} (checksum entry {g}, bytes {a}..{b}) fails its "
                f"CRC-32; it holds rows {rows}",
                path=str(self.path), block=g, rows=tuple(rows),
            )
        flags[g] = 1

    def _check_monotonic(self, off: int, count: int, where: str) -> None:
        np = _numpy()
        if np is not None:
            arr = np.frombuffer(self._mm, dtype="<u8", count=count, offset=off)
            if count > 1 and bool((arr[1:] < arr[:-1]).any()):
                raise OffsetsError(f"{where}: offsets are not monotonic")
            return
        step = 1 << 16
        for a in range(0, count, step):
            chunk = self._mv[off + a * 8 : off + min(count, a + step + 1) * 8].cast("Q").tolist()
            if chunk != sorted(chunk):
                raise OffsetsError(f"{where}: offsets are not monotonic")

    # ---- misc -----------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        cols = {}
        for path, col in self._cols.items():
            stored = sum(r.size for r in col.regions)
            d: dict[str, Any] = {"kind": col.leaf.kind, "stored_bytes": stored, "raw_bytes": stored}
            if col.compression is not None:
                codec, _, raw_size = col.compression
                d["compression"] = codec
                d["raw_bytes"] = stored - col.heap.size - col.index.size + raw_size
            cols[path] = d
        return {
            "format": f"tbl {self.version[0]}.{self.version[1]}",
            "block_size": self.block_size,
            "block_checksums": self.n_blocks,
            "columns": cols,
        }

    def close(self) -> None:
        """Drop this file's map. Views handed out earlier keep the map alive until they are gone."""
        self.__dict__.pop("_views", None)
        self.__dict__.pop("_heaps", None)
        self._value_readers = {}
        path = self.path

        def closed(*args: Any) -> Any:
            raise ValueError(f"{path}: read from a closed file")

        self.get = self.read_range = closed
        if self._mv is not None:
            try:
                self._mv.release()
            except BufferError:  # slices of it are still alive in callers' hands
                pass
            self._mv = None
        release_map(self._mm)
        self._mm = None

    def __repr__(self) -> str:
        return f"TblFile({str(self.path)!r}, rows={self.rows})"
