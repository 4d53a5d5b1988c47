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
import zlib
from functools import lru_cache
from itertools import pairwise
from operator import index as _index
from pathlib import Path
from typing import Any

from .codec import load_lz4_block
from .errors import (
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
from .shard import Progress, Shard, check_rows, fixed_leaf, map_file, release_map

_U64 = struct.Struct("<Q")
_U64X2 = struct.Struct("<QQ")
_MAX_CODEC_BLOCK = 16 << 20
# Exceptions a damaged data region can provoke while decoding a row; turned into CorruptDataError.
_DECODE_ERRORS = (struct.error, UnicodeDecodeError, ValueError, TypeError, OverflowError, MemoryError, IndexError)
_LITTLE = sys.byteorder == "little"

__all__ = ["MAGIC", "TblFile"]


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


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


class _Region:
    __slots__ = ("first_block", "name", "offset", "size")

    def __init__(self, name: str, offset: int, size: int, first_block: int) -> None:
        self.name = name
        self.offset = offset
        self.size = size
        self.first_block = first_block


class _Lz4Heap:
    """Reads logical byte ranges of an LZ4 block-compressed heap; caches the last block."""

    def __init__(self, f: TblFile, path: str, heap: _Region, index: _Region, block: int, raw_size: int) -> None:
        self.lz4 = load_lz4_block()
        self.mm = f._mm
        self.where = f"{f.path}: leaf {path!r}"
        self.heap = heap
        self.index_off = index.offset
        self.block = block
        self.raw_size = raw_size
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
        try:
            data = self.lz4.decompress(self.mm[self.heap.offset + a : self.heap.offset + b], uncompressed_size=raw_len)
        except Exception as exc:  # lz4.block.LZ4BlockError and friends
            raise CorruptDataError(f"{self.where}: LZ4 block {k} does not decompress: {exc}") from None
        if len(data) != raw_len:
            raise CorruptDataError(f"{self.where}: LZ4 block {k} has {len(data)} bytes, expected {raw_len}")
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


def _check_run(offs: list[int], limit: int, where: str) -> None:
    """offs must be non-decreasing and end at or below limit (C-speed check via sorted)."""
    if offs[-1] > limit or offs != sorted(offs):
        raise OffsetsError(f"{where}: offsets are not monotonic or exceed the heap")


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
            from .errors import BadMagicError

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
        if zlib.crc32(header_bytes, zlib.crc32(mm[:PREAMBLE_CRC_SPAN])) != crc:
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
        try:
            self.schema = Schema.from_json(_get(header, "schema", dict, where))
        except InvalidSchemaError as exc:
            raise InvalidSchemaError(f"{where}: {exc}") from None
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
        self._cols: dict[str, dict[str, Any]] = {}
        spans = [(self._crc_table.offset, self._crc_table.size)]
        for col, (path, leaf) in zip(cols, leaves, strict=True):
            cw = f"{where}: leaf {path!r}"
            if _get(col, "path", str, cw) != path:
                raise HeaderFormatError(f"{cw}: column path {col['path']!r} does not follow schema order")
            info = self._column(col, leaf, data_start, size, cw)
            self._cols[path] = info
            spans.extend((r.offset, r.size) for r in info["regions"].values())
        spans.sort()
        for (a, n), (b, _) in pairwise(spans):
            if a + n > b:
                raise RegionBoundsError(f"{where}: regions at {a} and {b} overlap")
        self._build_accessors()

    def _region(
        self, name: str, obj: Any, data_start: int, size: int, where: str, *, table: bool, blocks: bool = True
    ) -> _Region:
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
        region = _Region(name, off, length, first)
        if table:
            want = _nonneg(obj, "crc32", w)
            if zlib.crc32(memoryview(self._mm)[off : off + length]) != want:
                raise TableChecksumError(f"{w}: CRC-32 mismatch")
        return region

    def _column(self, col: dict[str, Any], leaf: Leaf, data_start: int, size: int, where: str) -> dict[str, Any]:
        regions = _get(col, "regions", dict, where)
        rows = self.rows

        def region(name: str, table: bool) -> _Region:
            return self._region(name, _get(regions, name, dict, where), data_start, size, where, table=table)

        if leaf.fixed_size:
            data = region("data", False)
            if data.size != rows * leaf.row_bytes:
                raise RegionBoundsError(f"{where}: data has {data.size} bytes, expected {rows} x {leaf.row_bytes}")
            return {"leaf": leaf, "regions": {"data": data}, "compression": None}
        offsets = region("offsets", True)
        heap = region("heap", False)
        out: dict[str, Any] = {"leaf": leaf, "regions": {"offsets": offsets, "heap": heap}}
        if offsets.size != (rows + 1) * 8:
            raise RegionBoundsError(f"{where}: offsets have {offsets.size} bytes, expected {(rows + 1) * 8}")
        comp = col.get("compression")
        logical = heap.size
        if comp is not None:
            codec = _get(comp, "codec", str, where)
            if codec != "lz4":
                raise UnknownCodecError(f"{where}: unknown compression codec {codec!r}")
            block = _nonneg(comp, "block", where)
            raw_size = _nonneg(comp, "raw_size", where)
            if not 0 < block <= _MAX_CODEC_BLOCK:
                raise HeaderFormatError(f"{where}: compression block {block} outside (0, {_MAX_CODEC_BLOCK}]")
            index = region("index", True)
            nblocks = -(-raw_size // block)
            if index.size != (nblocks + 1) * 8:
                raise RegionBoundsError(f"{where}: compression index has {index.size} bytes, expected {(nblocks + 1) * 8}")
            first, last = _U64.unpack_from(self._mm, index.offset)[0], _U64.unpack_from(self._mm, index.offset + index.size - 8)[0]
            if first != 0 or last != heap.size:
                raise OffsetsError(f"{where}: compression index spans [{first}, {last}], heap has {heap.size} bytes")
            out["regions"]["index"] = index
            logical = raw_size
            out["compression"] = (codec, block, raw_size)
        else:
            out["compression"] = None
        first = _U64.unpack_from(self._mm, offsets.offset)[0]
        last = _U64.unpack_from(self._mm, offsets.offset + offsets.size - 8)[0]
        if first != 0 or last != logical:
            raise OffsetsError(f"{where}: offsets span [{first}, {last}], heap has {logical} bytes")
        out["logical"] = logical
        if leaf.kind == "var_array":
            shapes = region("shapes", True)
            if shapes.size != rows * leaf.ndim * 8:
                raise RegionBoundsError(f"{where}: shapes have {shapes.size} bytes, expected {rows * leaf.ndim * 8}")
            out["regions"]["shapes"] = shapes
        return out

    # ---- accessors ------------------------------------------------------------------------------
    def _fixed_view(self, path: str) -> Any:
        info = self._cols[path]
        leaf: Leaf = info["leaf"]
        data: _Region = info["regions"]["data"]
        np = _numpy()
        shape = (self.rows, *leaf.row_shape)
        if np is not None:
            dtype = np.dtype({"int": "int64", "float": "float64", "bool": "bool"}.get(leaf.kind, leaf.dtype))
            count = data.size // dtype.itemsize
            return np.frombuffer(self._mm, dtype=dtype.newbyteorder("<"), count=count, offset=data.offset).reshape(shape)
        fmt = leaf.row_format
        fmt = "H" if fmt == "e" else fmt  # memoryview has no float16: the bits as uint16
        view = self._mv[data.offset : data.offset + data.size]
        return view.cast(fmt) if 0 in shape else view.cast(fmt, shape)

    def column(self, leaf_path: str) -> Any:
        """Zero-copy (rows, *shape) view of a fixed-size leaf: read-only numpy array, or memoryview without numpy."""
        fixed_leaf(self.schema, leaf_path)
        cache = self.__dict__.setdefault("_views", {})
        if leaf_path not in cache:
            cache[leaf_path] = self._fixed_view(leaf_path)
        return cache[leaf_path]

    def values(self, leaf_path: str, rows: list[int]) -> list[Any]:
        """Leaf ``leaf_path`` of each of ``rows`` (ints in ``[0, rows)``), each as ``get`` returns it.

        Reads that one leaf only: a batch of strings does not decode the rest of
        every row. Index errors are raised before anything is read.
        """
        if self._mm is None:
            raise ValueError(f"{self.path}: read from a closed file")
        readers = self.__dict__.setdefault("_value_readers", {})
        read = readers.get(leaf_path)
        if read is None:
            if leaf_path not in self._cols:
                raise KeyError(f"no leaf {leaf_path!r}; leaves are {list(self._cols)}")
            read = readers[leaf_path] = self._value_reader(leaf_path)
        check_rows(rows, self.rows)
        try:
            return read(rows)
        except _DECODE_ERRORS as exc:
            raise CorruptDataError(f"{self.path}: leaf {leaf_path!r}: {exc!r}") from None

    def _value_reader(self, path: str) -> Any:
        """Function (rows) -> list of one leaf's values; rows already checked. Holds the map, never self."""
        info = self._cols[path]
        leaf: Leaf = info["leaf"]
        regs = info["regions"]
        mm = self._mm
        if leaf.fixed_size:
            b = regs["data"].offset
            if leaf.kind in ("int", "float"):
                unpack = struct.Struct("<q" if leaf.kind == "int" else "<d").unpack_from
                return lambda rows: [unpack(mm, b + i * 8)[0] for i in rows]
            if leaf.kind == "bool":
                return lambda rows: [mm[b + i] != 0 for i in rows]
            if _numpy() is not None:
                col = self.column(path)
                return lambda rows: [col[i] for i in rows]
            # memoryview rows cast to the element format and shape, as get() returns them.
            mv, size = self._mv, leaf.row_bytes
            fmt = "H" if leaf.row_format == "e" else leaf.row_format
            if 0 in leaf.row_shape:
                return lambda rows: [mv[b + i * size : b + (i + 1) * size].cast(fmt) for i in rows]
            shape = list(leaf.row_shape)
            return lambda rows: [mv[b + i * size : b + (i + 1) * size].cast(fmt, shape) for i in rows]
        o, h, limit = regs["offsets"].offset, regs["heap"].offset, info["logical"]
        where = f"{self.path}: leaf {path!r}"
        heap_read = None
        if info["compression"] is not None:
            _, block, raw_size = info["compression"]
            heap_read = _Lz4Heap(self, path, regs["heap"], regs["index"], block, raw_size).read

        def spans(rows: list[int]) -> list[tuple[int, int, int]]:
            out = []
            for i in rows:
                s, e = _U64X2.unpack_from(mm, o + i * 8)
                if not s <= e <= limit:
                    raise OffsetsError(f"{where}: row {i}: offsets out of order")
                out.append((i, s, e))
            return out

        if leaf.kind == "var_array":
            array_at = self._var_array_reader(path, info, heap_read)
            return lambda rows: [array_at(i, s, e) for i, s, e in spans(rows)]
        if heap_read is not None:
            if leaf.kind == "str":
                return lambda rows: [heap_read(s, e).decode() for _, s, e in spans(rows)]
            return lambda rows: [heap_read(s, e) for _, s, e in spans(rows)]
        # Uncompressed str / bytes, the common case: one loop, no intermediate spans.
        unpack = _U64X2.unpack_from
        decode = leaf.kind == "str"

        def read_heap(rows: list[int]) -> list[Any]:
            out = []
            append = out.append
            for i in rows:
                s, e = unpack(mm, o + i * 8)
                if not s <= e <= limit:
                    raise OffsetsError(f"{where}: row {i}: offsets out of order")
                append(mm[h + s : h + e].decode() if decode else mm[h + s : h + e])
            return out

        return read_heap

    def _var_array_reader(self, path: str, info: dict[str, Any], heap_read: Any) -> Any:
        """Function (i, s, e) -> array of row i of a var_array leaf."""
        leaf: Leaf = info["leaf"]
        shapes_off = info["regions"]["shapes"].offset
        ndim = leaf.ndim
        shape_of = struct.Struct(f"<{ndim}Q").unpack_from
        itemsize = leaf.itemsize
        np = _numpy()
        mm, mv = self._mm, self._mv  # not self: the accessors must not form a cycle with this file
        h = info["regions"]["heap"].offset
        fmt = "H" if leaf.row_format == "e" else leaf.row_format
        dtype = np.dtype(leaf.dtype).newbyteorder("<") if np is not None else None
        where = f"{self.path}: leaf {path!r}"

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
        """Generate get(i) and read_range(a, b) for this file's schema."""
        np = _numpy()
        ns: dict[str, Any] = {
            "mm": self._mm, "mv": self._mv, "N": self.rows, "QQ": _U64X2.unpack_from, "_index": _index,
            "IndexError": IndexError, "OffsetsError": OffsetsError, "CorruptDataError": CorruptDataError,
            "DECODE_ERRORS": _DECODE_ERRORS, "WHERE": str(self.path), "_decode_strs": _decode_strs,
            "_slice_bytes": _slice_bytes, "_check_run": _check_run, "range": range, "zip": zip, "list": list,
        }
        get_pre: list[str] = []
        names: dict[str, str] = {}
        range_pre: list[str] = []
        for k, (path, info) in enumerate(self._cols.items()):
            leaf: Leaf = info["leaf"]
            regs = info["regions"]
            v = f"v{k}"
            names[path] = v
            ns[f"P{k}"] = path
            if leaf.fixed_size:
                b = regs["data"].offset
                ns[f"b{k}"] = b
                if leaf.kind in ("int", "float"):
                    ns[f"U{k}"] = struct.Struct("<q" if leaf.kind == "int" else "<d").unpack_from
                    get_pre.append(f"{v} = U{k}(mm, b{k} + i * 8)[0]")
                    range_pre.append(f"L{k} = mv[b{k} + a * 8:b{k} + b * 8].cast({leaf.row_format!r}).tolist()")
                elif leaf.kind == "bool":
                    get_pre.append(f"{v} = mm[b{k} + i] != 0")
                    range_pre.append(f"L{k} = [x != 0 for x in mm[b{k} + a:b{k} + b]]")
                else:
                    col = self.column(path)
                    ns[f"C{k}"] = col
                    if np is not None:
                        get_pre.append(f"{v} = C{k}[i]")
                        range_pre.append(f"L{k} = list(C{k}[a:b])")
                    else:
                        ns[f"R{k}"] = leaf.row_bytes
                        fmt = "H" if leaf.row_format == "e" else leaf.row_format
                        shape = leaf.row_shape
                        cast = f".cast({fmt!r})" if 0 in shape else f".cast({fmt!r}, {list(shape)!r})"
                        # Evaluated in a copy of ns so the lambda and ns do not reference each other.
                        ns[f"ROW{k}"] = eval(f"lambda i: mv[b{k} + i * R{k}:b{k} + (i + 1) * R{k}]{cast}", dict(ns))
                        get_pre.append(f"{v} = ROW{k}(i)")
                        range_pre.append(f"L{k} = [ROW{k}(j) for j in range(a, b)]")
                continue
            o, h = regs["offsets"].offset, regs["heap"].offset
            ns[f"o{k}"], ns[f"h{k}"], ns[f"H{k}"] = o, h, info["logical"]
            get_pre.append(f"s{k}, e{k} = QQ(mm, o{k} + i * 8)")
            get_pre.append(f"if not s{k} <= e{k} <= H{k}: raise OffsetsError(f'{{WHERE}}: leaf {{P{k}!r}}: row {{i}}: offsets out of order')")
            heap_read = None
            if info["compression"] is not None:
                _, block, raw_size = info["compression"]
                heap_read = _Lz4Heap(self, path, regs["heap"], regs["index"], block, raw_size).read
                ns[f"Z{k}"] = heap_read
            range_pre.append(f"O{k} = mv[o{k} + a * 8:o{k} + b * 8 + 8].cast('Q').tolist()")
            range_pre.append(f"_check_run(O{k}, H{k}, WHERE)")
            if leaf.kind == "var_array":
                ns[f"VA{k}"] = self._var_array_reader(path, info, heap_read)
                get_pre.append(f"{v} = VA{k}(i, s{k}, e{k})")
                range_pre.append(f"L{k} = [VA{k}(a + j, s, e) for j, (s, e) in enumerate(zip(O{k}, O{k}[1:]))]")
                continue
            raw = f"Z{k}(s{k}, e{k})" if heap_read else f"mm[h{k} + s{k}:h{k} + e{k}]"
            # bytes.decode() is about twice as fast as str(b, 'utf-8') on CPython 3.11.
            get_pre.append(f"{v} = {raw}.decode()" if leaf.kind == "str" else f"{v} = {raw}")
            if heap_read:
                conv = "Z{k}(s, e).decode()" if leaf.kind == "str" else "Z{k}(s, e)"
                range_pre.append(f"L{k} = [{conv.format(k=k)} for s, e in zip(O{k}, O{k}[1:])]")
            elif leaf.kind == "str":
                range_pre.append(f"L{k} = _decode_strs(mm, h{k}, O{k})")
            else:
                range_pre.append(f"L{k} = _slice_bytes(mm, h{k}, O{k})")

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
"""
        exec(_compile_accessor(src), ns)
        # Popped, not read: a function left in its own globals is a reference cycle, and
        # a cycle would keep the map (and its file descriptor) alive until the cyclic GC runs.
        self.get = ns.pop("get")
        self.read_range = ns.pop("read_range")
        self._source = src

    # ---- verification ---------------------------------------------------------------------------
    def verify(self, progress: Progress | None = None) -> None:
        """Check every data-block CRC-32, then every offsets table and var_array shape in full."""
        mv = self._mv
        crc_of = struct.Struct(f"<{self.n_blocks}I").unpack_from(self._mm, self._crc_table.offset)
        regions = [(path, r) for path, info in self._cols.items() for r in info["regions"].values()]
        total = sum(r.size for _, r in regions)
        done = 0
        bs = self.block_size
        for path, r in regions:
            for j, k in enumerate(range(0, r.size, bs)):
                n = min(bs, r.size - k)
                if zlib.crc32(mv[r.offset + k : r.offset + k + n]) != crc_of[r.first_block + j]:
                    raise DataChecksumError(
                        f"{self.path}: leaf {path!r}: {r.name} block {j} (bytes {r.offset + k}..{r.offset + k + n}) "
                        "fails its CRC-32"
                    )
                done += n
                if progress is not None:
                    progress(done, total)
        for path, info in self._cols.items():
            if info["leaf"].fixed_size:
                continue
            where = f"{self.path}: leaf {path!r}"
            offs = info["regions"]["offsets"]
            self._check_monotonic(offs.offset, self.rows + 1, where)
            if "index" in info["regions"]:
                idx = info["regions"]["index"]
                self._check_monotonic(idx.offset, idx.size // 8, where + " compression index")
            if info["leaf"].kind == "var_array" or info["compression"] is not None:
                step = 4096
                for a in range(0, self.rows, step):
                    self.read_range(a, min(self.rows, a + step))

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
        for path, info in self._cols.items():
            stored = sum(r.size for r in info["regions"].values())
            d: dict[str, Any] = {"kind": info["leaf"].kind, "stored_bytes": stored, "raw_bytes": stored}
            if info["compression"] is not None:
                codec, _, raw_size = info["compression"]
                d["compression"] = codec
                d["raw_bytes"] = raw_size + info["regions"]["offsets"].size + (
                    info["regions"]["shapes"].size if "shapes" in info["regions"] else 0
                )
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
        self.__dict__.pop("_value_readers", None)
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
