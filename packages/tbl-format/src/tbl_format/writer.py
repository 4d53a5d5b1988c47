"""Streaming, crash-safe writer of .tbl files and sharded dataset directories.

Memory stays bounded: every region (a fixed column, a variable column's
offsets, heap and shapes) is spilled to its own temp file in a hidden
directory next to the destination while samples arrive, with its per-block
CRC-32s computed on the way. ``close()`` lays the regions out, writes the
header and copies each spill file into place with ``os.copy_file_range``
(kernel-side copy), fsyncs, renames atomically and fsyncs the directory.

Temp names start with ``.`` and contain ``.tbl-tmp-``; they never end in
``.tbl`` and a directory is a dataset only once it has a manifest, so a
killed writer's leftovers are never mistaken for a dataset.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import struct
import sys
import zlib
from array import array
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .codec import load_lz4_block
from .errors import InvalidSchemaError, SchemaMismatchError
from .layout import (
    BLOCK_SIZE,
    FORMAT_VERSION,
    HEADER_CAP,
    LZ4_BLOCK,
    MAGIC,
    PREAMBLE,
    PREAMBLE_CRC_SPAN,
    PREAMBLE_SIZE,
    align_up,
)
from .schema import DTYPES, Leaf, Schema, as_array, dtype_name, infer_schema

_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_U64 = struct.Struct("<Q")
_SPILL_FLUSH = 4 * BLOCK_SIZE
VAR_ARRAY_ALIGN = 16


def fsync_dir(path: Path) -> None:
    """fsync a directory so that a rename inside it survives a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mismatch(idx: int, path: str, msg: str) -> SchemaMismatchError:
    return SchemaMismatchError(f"sample {idx}: leaf {path or '<root>'!r}: {msg}")


class _Spill:
    """One region being written: a temp file, a write buffer, per-block CRC-32s, optionally a whole CRC."""

    def __init__(self, path: Path, whole_crc: bool = False) -> None:
        self.path = path
        self.f = open(path, "w+b")  # closed by close()
        self.buf = bytearray()
        self.flushed = 0
        self.blocks = array("I")
        self.whole_crc = whole_crc
        self.crc = 0

    @property
    def size(self) -> int:
        return self.flushed + len(self.buf)

    def write(self, data: Any) -> None:
        self.buf += data
        if len(self.buf) >= _SPILL_FLUSH:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        buf = self.buf
        n = len(buf) if final else len(buf) // BLOCK_SIZE * BLOCK_SIZE
        with memoryview(buf) as mv:
            part = mv[:n]
            for k in range(0, n, BLOCK_SIZE):
                self.blocks.append(zlib.crc32(part[k : k + BLOCK_SIZE]))
            if self.whole_crc:
                self.crc = zlib.crc32(part, self.crc)
            self.f.write(part)
            part.release()
        del buf[:n]
        self.flushed += n

    def finish(self) -> None:
        self._flush(final=True)
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class _Bytes:
    """A small in-memory region (compression index, checksum table) with the _Spill interface."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)
        self.blocks = array("I", (zlib.crc32(data[k : k + BLOCK_SIZE]) for k in range(0, len(data), BLOCK_SIZE)))
        self.crc = zlib.crc32(data)


def _array_bytes(leaf: Leaf, value: Any, idx: int, path: str, var: bool) -> tuple[bytes, tuple[int, ...]]:
    """Little-endian C-order bytes and shape of an array value, checked against the leaf."""
    arr = as_array(value)
    if arr is not None:
        name = dtype_name(arr)
        if name != leaf.dtype:
            raise _mismatch(idx, path, f"expected dtype {leaf.dtype}, got {arr.dtype}")
        shape = tuple(int(d) for d in arr.shape)
        if not var and shape != leaf.shape:
            raise _mismatch(idx, path, f"expected shape {leaf.shape}, got {shape}")
        if var and len(shape) != leaf.ndim:
            raise _mismatch(idx, path, f"expected ndim {leaf.ndim}, got shape {shape}")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return arr.tobytes(order="C"), shape
    # Without numpy: any C-contiguous buffer whose format is the leaf's element format.
    try:
        mv = memoryview(value)
    except TypeError:
        raise _mismatch(idx, path, f"expected a {leaf.dtype} array, got {type(value).__name__}") from None
    fmt = mv.format.lstrip("@=<")
    if fmt != DTYPES[leaf.dtype][0] or not mv.c_contiguous or mv.format.startswith(("!", ">")):
        raise _mismatch(idx, path, f"expected a C-contiguous {leaf.dtype} buffer, got format {mv.format!r}")
    shape = tuple(mv.shape or ())
    if (not var and shape != leaf.shape) or (var and len(shape) != leaf.ndim):
        raise _mismatch(idx, path, f"shape {shape} does not fit leaf {leaf}")
    return mv.tobytes(), shape


class _FixedColumn:
    def __init__(self, path: str, leaf: Leaf, spill_dir: Path, n: int) -> None:
        self.path = path
        self.leaf = leaf
        self.data = _Spill(spill_dir / f"{n}.data")
        kind = leaf.kind
        self.encode = {"int": self._int, "float": self._float, "bool": self._bool}.get(kind, self._array)

    def _int(self, v: Any, idx: int) -> bytes:
        if isinstance(v, bool) or not isinstance(v, int):
            arr = as_array(v)
            if arr is None or arr.ndim != 0 or arr.dtype.kind not in "iu":
                raise _mismatch(idx, self.path, f"expected an int, got {type(v).__name__}")
            v = int(arr)
        if not -(1 << 63) <= v < (1 << 63):
            raise _mismatch(idx, self.path, f"int {v} does not fit in int64")
        return _I64.pack(v)

    def _float(self, v: Any, idx: int) -> bytes:
        if isinstance(v, (float, int)) and not isinstance(v, bool):
            return _F64.pack(v)
        arr = as_array(v)
        if arr is None or arr.ndim != 0 or arr.dtype.kind not in "iuf":
            raise _mismatch(idx, self.path, f"expected a float, got {type(v).__name__}")
        return _F64.pack(float(arr))

    def _bool(self, v: Any, idx: int) -> bytes:
        if v is True or v is False:
            return b"\x01" if v else b"\x00"
        arr = as_array(v)
        if arr is None or arr.ndim != 0 or arr.dtype.kind != "b":
            raise _mismatch(idx, self.path, f"expected a bool, got {type(v).__name__}")
        return b"\x01" if bool(arr) else b"\x00"

    def _array(self, v: Any, idx: int) -> bytes:
        return _array_bytes(self.leaf, v, idx, self.path, var=False)[0]

    def append(self, encoded: bytes) -> None:
        self.data.write(encoded)

    @property
    def nbytes(self) -> int:
        return self.data.size

    def finish(self) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        self.data.finish()
        return {}, [("data", self.data)]

    def close(self) -> None:
        self.data.close()


class _VarColumn:
    def __init__(self, path: str, leaf: Leaf, spill_dir: Path, n: int, compression: str | None) -> None:
        self.path = path
        self.leaf = leaf
        self.offsets = _Spill(spill_dir / f"{n}.offsets", whole_crc=True)
        self.heap = _Spill(spill_dir / f"{n}.heap")
        self.shapes = _Spill(spill_dir / f"{n}.shapes", whole_crc=True) if leaf.kind == "var_array" else None
        self.shape_struct = struct.Struct(f"<{leaf.ndim}Q") if leaf.ndim else None
        self.logical = 0  # bytes of the uncompressed heap so far
        self.lz4 = load_lz4_block() if compression == "lz4" else None
        self.raw = bytearray()  # uncompressed bytes not yet compressed into a block
        self.index = array("Q", [0])

    def encode(self, v: Any, idx: int) -> tuple[bytes, tuple[int, ...] | None]:
        kind = self.leaf.kind
        if kind == "str":
            if not isinstance(v, str):
                raise _mismatch(idx, self.path, f"expected a str, got {type(v).__name__}")
            try:
                return v.encode("utf-8"), None
            except UnicodeEncodeError as exc:
                raise _mismatch(idx, self.path, f"str is not encodable as UTF-8: {exc}") from None
        if kind in ("bytes", "encoded_image"):
            if isinstance(v, (bytes, bytearray)):
                return bytes(v), None
            if isinstance(v, memoryview):
                return v.tobytes(), None
            arr = as_array(v)
            if arr is not None and arr.dtype.kind in "uib" and arr.dtype.itemsize == 1 and arr.ndim == 1:
                return arr.tobytes(), None
            raise _mismatch(idx, self.path, f"expected bytes, got {type(v).__name__}")
        return _array_bytes(self.leaf, v, idx, self.path, var=True)

    def append(self, encoded: tuple[bytes, tuple[int, ...] | None]) -> None:
        payload, shape = encoded
        if shape is not None:
            pad = -self.logical % VAR_ARRAY_ALIGN
            if pad:
                self._heap_write(b"\x00" * pad)
            self.shapes.write(self.shape_struct.pack(*shape))
        self.offsets.write(_U64.pack(self.logical))
        self._heap_write(payload)

    def _heap_write(self, data: bytes) -> None:
        self.logical += len(data)
        if self.lz4 is None:
            self.heap.write(data)
            return
        self.raw += data
        if len(self.raw) >= LZ4_BLOCK:
            self._compress(final=False)

    def _compress(self, final: bool) -> None:
        raw = self.raw
        n = len(raw) if final else len(raw) // LZ4_BLOCK * LZ4_BLOCK
        for k in range(0, n, LZ4_BLOCK):
            block = self.lz4.compress(bytes(raw[k : k + LZ4_BLOCK]), store_size=False)
            self.heap.write(block)
            self.index.append(self.heap.size)
        del raw[:n]

    @property
    def nbytes(self) -> int:
        return self.offsets.size + self.heap.size + (self.shapes.size if self.shapes else 0) + len(self.raw)

    def finish(self) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        self.offsets.write(_U64.pack(self.logical))
        regions: list[tuple[str, Any]] = [("offsets", self.offsets), ("heap", self.heap)]
        extra: dict[str, Any] = {"compression": None}
        if self.lz4 is not None:
            self._compress(final=True)
            regions.append(("index", _Bytes(self.index.tobytes())))
            extra["compression"] = {"codec": "lz4", "block": LZ4_BLOCK, "raw_size": self.logical}
        if self.shapes is not None:
            regions.append(("shapes", self.shapes))
        for _, spill in regions:
            if isinstance(spill, _Spill):
                spill.finish()
        return extra, regions

    def close(self) -> None:
        for s in (self.offsets, self.heap, self.shapes):
            if s is not None:
                s.close()


def _copy_into(src: Any, dst_fd: int, dst_off: int) -> None:
    """Copy a region into the output at dst_off: kernel-side when possible, read/write otherwise."""
    if isinstance(src, _Bytes):
        os.pwrite(dst_fd, src.data, dst_off)
        return
    src_fd = src.f.fileno()
    done = 0
    size = src.size
    try:
        while done < size:
            n = os.copy_file_range(src_fd, dst_fd, size - done, done, dst_off + done)
            if n == 0:
                break
            done += n
    except (AttributeError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP,
                                                          errno.EPERM, errno.EBADF):
            raise
    while done < size:
        chunk = os.pread(src_fd, min(size - done, 8 * BLOCK_SIZE), done)
        if not chunk:
            raise OSError(f"spill file {src.path} shorter than expected")
        os.pwrite(dst_fd, chunk, dst_off + done)
        done += len(chunk)


class FileWriter:
    """Writes one .tbl file into a temp file next to ``final``; ``finish()`` returns the temp path."""

    def __init__(self, final: Path, schema: Schema, metadata: dict[str, Any], compression: str | None) -> None:
        self.final = final
        self.schema = schema
        self.metadata = metadata
        self.tmp = final.parent / f".{final.name}.tbl-tmp-{secrets.token_hex(4)}"
        self.spill_dir = Path(f"{self.tmp}.d")
        self.spill_dir.mkdir()
        self.rows = 0
        self.columns: list[Any] = []
        try:
            for n, (path, leaf) in enumerate(schema.leaves.items()):
                if leaf.fixed_size:
                    self.columns.append(_FixedColumn(path, leaf, self.spill_dir, n))
                else:
                    self.columns.append(_VarColumn(path, leaf, self.spill_dir, n, compression))
        except BaseException:
            self.abort()
            raise

        self.append_fast = self._compile_fast()

    def _compile_fast(self) -> Any:
        """Generate append_fast(sample, idx) -> bool for this schema.

        It walks the exact container types (dict / list / tuple, not subclasses),
        encodes the common Python scalar types inline and appends; it returns
        False without appending anything when any check or encoding fails, and
        the caller then takes the general path, which names the leaf at fault.
        """
        np = sys.modules.get("numpy")  # only if the caller already uses numpy: never imported here
        ns: dict[str, Any] = {"PQ": _I64.pack, "PD": _F64.pack, "dict": dict, "list": list, "tuple": tuple,
                              "NDARRAY": np.ndarray if np is not None else None}
        lines: list[str] = []
        leaves: list[str] = []
        counter = [0]

        def walk(node: Any, var: str) -> None:
            if isinstance(node, Leaf):
                leaves.append(var)
                return
            typ = "dict" if isinstance(node, dict) else "list" if isinstance(node, list) else "tuple"
            lines.append(f"if {var}.__class__ is not {typ} or len({var}) != {len(node)}: return False")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, sub in items:
                counter[0] += 1
                child = f"x{counter[0]}"
                lines.append(f"{child} = {var}[{key!r}]")
                walk(sub, child)

        walk(self.schema.tree, "sample")
        appends = []
        for k, (var, col) in enumerate(zip(leaves, self.columns, strict=True)):
            ns[f"E{k}"] = col.encode
            kind = col.leaf.kind
            if kind == "int":
                lines.append(f"e{k} = PQ({var}) if {var}.__class__ is int else E{k}({var}, idx)")
            elif kind == "float":
                lines.append(f"e{k} = PD({var}) if {var}.__class__ is float else E{k}({var}, idx)")
            elif kind == "bool":
                lines.append(f"e{k} = (b'\\x01' if {var} else b'\\x00') if {var}.__class__ is bool else E{k}({var}, idx)")
            elif kind == "str":
                lines.append(f"e{k} = ({var}.encode(), None) if {var}.__class__ is str else E{k}({var}, idx)")
            elif kind in ("array", "image") and np is not None:
                ns[f"DT{k}"], ns[f"SH{k}"] = np.dtype(col.leaf.dtype), col.leaf.shape
                lines.append(
                    f"e{k} = {var}.tobytes() if {var}.__class__ is NDARRAY and {var}.dtype == DT{k} "
                    f"and {var}.shape == SH{k} else E{k}({var}, idx)"
                )
            else:
                lines.append(f"e{k} = E{k}({var}, idx)")
            ns[f"A{k}"] = col.data.write if isinstance(col, _FixedColumn) else col.append
            appends.append(f"A{k}(e{k})")
        body = "\n        ".join(lines) or "pass"
        tail = "\n    ".join(appends) or "pass"
        src = f"""
def append_fast(sample, idx):
    try:
        {body}
    except Exception:
        return False
    {tail}
    fw.rows += 1
    return True
"""
        ns["fw"] = self
        exec(compile(src, "<tbl row encoder>", "exec"), ns)
        return ns["append_fast"]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns)

    def append(self, encoded: list[Any]) -> None:
        for col, e in zip(self.columns, encoded, strict=True):
            col.append(e)
        self.rows += 1

    def finish(self) -> tuple[Path, int, int]:
        """Assemble, fsync and close the temp file; returns (temp path, header CRC-32, file size)."""
        parts = []
        for col in self.columns:
            extra, regions = col.finish()
            parts.append((col.path, extra, regions))
        all_regions = [r for _, _, regions in parts for _, r in regions]
        nblocks = sum(len(r.blocks) for r in all_regions)
        crc_table = array("I")
        for r in all_regions:
            crc_table.extend(r.blocks)
        table = _Bytes(crc_table.tobytes() if nblocks else b"")
        # Region offsets depend on the header length, which depends on the offsets: iterate to the fixed point.
        data_start = align_up(PREAMBLE_SIZE)
        while True:
            header, places, file_size = self._header(parts, table, data_start)
            need = align_up(PREAMBLE_SIZE + len(header))
            if need <= data_start:
                break
            data_start = need
        if len(header) > HEADER_CAP:
            raise InvalidSchemaError(f"header of {len(header)} bytes exceeds the {HEADER_CAP}-byte cap")
        head = PREAMBLE.pack(MAGIC, *FORMAT_VERSION, len(header), file_size, 0, 0)[:PREAMBLE_CRC_SPAN]
        crc = zlib.crc32(header, zlib.crc32(head))
        preamble = PREAMBLE.pack(MAGIC, *FORMAT_VERSION, len(header), file_size, crc, 0)
        fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.pwrite(fd, preamble + header, 0)
            for src, off in places:
                _copy_into(src, fd, off)
            os.ftruncate(fd, file_size)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._drop_spills()
        return self.tmp, crc, file_size

    def _header(self, parts: list[Any], table: _Bytes, data_start: int) -> tuple[bytes, list[Any], int]:
        pos = data_start
        block = 0
        places = []
        columns = []
        end = PREAMBLE_SIZE
        for path, extra, regions in parts:
            desc: dict[str, Any] = {"path": path, "regions": {}}
            desc.update(extra)
            for name, r in regions:
                region = {"offset": pos, "size": r.size, "first_block": block}
                if name != "data" and name != "heap":
                    region["crc32"] = r.crc
                desc["regions"][name] = region
                places.append((r, pos))
                end = pos + r.size
                block += len(r.blocks)
                pos = align_up(end)
            columns.append(desc)
        places.append((table, pos))
        checksums = {"offset": pos, "size": table.size, "crc32": table.crc}
        end = max(end, pos + table.size)
        header = {
            "rows": self.rows,
            "block_size": BLOCK_SIZE,
            "schema": self.schema.to_json(),
            "metadata": self.metadata,
            "columns": columns,
            "checksums": checksums,
        }
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        return text, places, max(end, data_start)

    def _drop_spills(self) -> None:
        for col in self.columns:
            col.close()
        shutil.rmtree(self.spill_dir, ignore_errors=True)

    def abort(self) -> None:
        self._drop_spills()
        try:
            self.tmp.unlink()
        except FileNotFoundError:
            pass


def _check_metadata(metadata: Any) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    try:
        return json.loads(json.dumps(metadata, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serializable (no NaN/inf): {exc}") from None


class Writer:
    """Streaming writer of one .tbl file, or of a sharded dataset directory when shard_rows/shard_bytes is set.

    ``write(sample)`` checks the sample against the schema (given, or inferred
    from the first sample) and raises SchemaMismatchError naming the sample
    index and leaf path; the writer stays usable after such an error.
    ``close()`` publishes atomically and returns the destination; ``abort()``
    removes everything this writer created. As a context manager it closes on
    success and aborts on exception.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        schema: Schema | Any | None = None,
        *,
        metadata: dict[str, Any] | None = None,
        compression: str | None = None,
        shard_rows: int | None = None,
        shard_bytes: int | None = None,
    ) -> None:
        if compression not in (None, "lz4"):
            raise ValueError(f"compression must be None or 'lz4', got {compression!r}")
        if compression == "lz4":
            load_lz4_block()
        for name, v in (("shard_rows", shard_rows), ("shard_bytes", shard_bytes)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.dst = Path(dst)
        self.schema = schema if isinstance(schema, Schema) or schema is None else Schema(schema)
        self.metadata = _check_metadata(metadata)
        self.compression = compression
        self.sharded = shard_rows is not None or shard_bytes is not None
        self.shard_rows = shard_rows
        self.shard_bytes = shard_bytes
        self.rows = 0
        self._file: FileWriter | None = None
        self._shards: list[dict[str, Any]] = []
        self._pending: list[Path] = []  # finished shard temp files, renamed at close()
        self._token = secrets.token_hex(4)
        self._created_dir = False
        self._done = False
        if self.sharded:
            if self.dst.exists() and not self.dst.is_dir():
                raise FileExistsError(f"{self.dst} exists and is not a directory")
            if not self.dst.exists():
                self.dst.mkdir(parents=True)
                self._created_dir = True
        elif self.dst.is_dir():
            raise IsADirectoryError(f"{self.dst} is a directory; pass shard_rows/shard_bytes to write a sharded dataset")
        elif not self.dst.parent.is_dir():
            raise FileNotFoundError(f"destination directory {self.dst.parent} does not exist")

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _flatten(self, node: Any, value: Any, path: str, out: list[Any], idx: int) -> None:
        if isinstance(node, Leaf):
            out.append(value)
        elif isinstance(node, dict):
            if not isinstance(value, Mapping):
                raise _mismatch(idx, path, f"expected a dict, got {type(value).__name__}")
            if len(value) != len(node) or any(k not in value for k in node):
                missing = [k for k in node if k not in value]
                extra = [k for k in value if k not in node]
                raise _mismatch(idx, path, f"dict keys differ: missing {missing}, unexpected {extra}")
            for k, sub in node.items():
                self._flatten(sub, value[k], f"{path}/{k}" if path else k, out, idx)
        else:
            want = list if isinstance(node, list) else tuple
            if not isinstance(value, want):
                raise _mismatch(idx, path, f"expected a {want.__name__}, got {type(value).__name__}")
            if len(value) != len(node):
                raise _mismatch(idx, path, f"expected {len(node)} elements, got {len(value)}")
            for i, (sub, v) in enumerate(zip(node, value, strict=True)):
                self._flatten(sub, v, f"{path}/{i}" if path else str(i), out, idx)

    def _open_file(self) -> FileWriter:
        if self.sharded:
            final = self.dst / f"shard-{self._token}-{len(self._shards):05d}.tbl"
        else:
            final = self.dst
        return FileWriter(final, self.schema, self.metadata, self.compression)

    def write(self, sample: Any) -> None:
        if self._done:
            raise RuntimeError("write() on a closed or aborted Writer")
        if self.schema is None:
            self.schema = infer_schema(sample)
        if self._file is None:
            self._file = self._open_file()
        fw = self._file
        if not fw.append_fast(sample, self.rows):
            # The general path: checks everything again and raises SchemaMismatchError naming index and leaf.
            flat: list[Any] = []
            self._flatten(self.schema.tree, sample, "", flat, self.rows)
            encoded = [col.encode(v, self.rows) for col, v in zip(fw.columns, flat, strict=True)]
            fw.append(encoded)
        self.rows += 1
        if self.sharded and (
            (self.shard_rows is not None and fw.rows >= self.shard_rows)
            or (self.shard_bytes is not None and fw.nbytes >= self.shard_bytes)
        ):
            self._publish_shard()

    def _publish_shard(self) -> None:
        fw = self._file
        assert fw is not None
        self._file = None
        try:
            tmp, crc, size = fw.finish()
        except BaseException:
            fw.abort()
            raise
        # The shard keeps its temp name until close(): a killed writer leaves only clearly named temp files.
        self._pending.append(tmp)
        self._shards.append({"file": fw.final.name, "rows": fw.rows, "header_crc32": crc, "size": size})

    def close(self) -> Path:
        """Publish atomically and return the destination path."""
        if self._done:
            raise RuntimeError("close() on a closed or aborted Writer")
        try:
            if self.schema is None:
                raise ValueError("no samples were written and no schema was given: nothing defines the schema")
            if self.sharded:
                self._close_sharded()
            else:
                fw = self._file or self._open_file()
                self._file = None
                try:
                    tmp, _, _ = fw.finish()
                    os.replace(tmp, self.dst)
                except BaseException:
                    fw.abort()
                    raise
                fsync_dir(self.dst.parent)
        except BaseException:
            self.abort()
            raise
        self._done = True
        return self.dst

    def _close_sharded(self) -> None:
        from .manifest import publish_manifest

        if self._file is not None and self._file.rows:
            self._publish_shard()
        elif self._file is not None:
            self._file.abort()
            self._file = None
        for tmp, s in zip(self._pending, self._shards, strict=True):
            os.replace(tmp, self.dst / s["file"])
        self._pending = []
        fsync_dir(self.dst)
        publish_manifest(self.dst, self.schema, self.metadata, self._shards)

    def abort(self) -> None:
        """Remove everything this writer created; a previously published destination stays as it was."""
        if self._done:
            return
        self._done = True
        if self._file is not None:
            self._file.abort()
            self._file = None
        for tmp in self._pending:
            tmp.unlink(missing_ok=True)
        if self._pending is not None and not self._pending:
            # close() failed after renaming the shards: they are not referenced by any manifest.
            for s in self._shards:
                (self.dst / s["file"]).unlink(missing_ok=True)
        if self._created_dir:
            try:
                self.dst.rmdir()
            except OSError:
                pass


def write(samples: Iterable[Any], dst: str | os.PathLike[str], **writer_kwargs: Any) -> Path:
    """Write every sample of an iterable; returns the published path. Keyword arguments go to Writer."""
    with Writer(dst, **writer_kwargs) as w:
        for s in samples:
            w.write(s)
    return w.dst


__all__ = ["FileWriter", "Writer", "fsync_dir", "write"]
