"""The columns a FileWriter spills while samples arrive: one object per schema leaf.

Every region of a column (a fixed column's data, a heap, its offsets,
shapes, item offsets, presence flags) is a ``Spill``: a temp file plus a
write buffer, with its per-block CRC-32s computed on the way. A column
encodes a value with its kind's encoder (``tbl_format.kinds``), appends it,
and at the end hands its regions to the FileWriter, which lays them out.

``promoted(leaf, rows)`` turns a column into the column of a wider leaf
without reading its rows again where the bytes already fit (see the
method); the writer uses it when a later sample shows that a leaf varies.
"""

from __future__ import annotations

import errno
import itertools
import os
import struct
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .codec import Compression, block_compressor
from .crc import crc32
from .errors import SchemaMismatchError
from .kinds import EncodeError
from .layout import BLOCK_SIZE, HEAP_BLOCK
from .schema import Leaf

__all__ = ["TABLES", "Bytes", "Column", "FixedColumn", "ListColumn", "Spill", "VarColumn", "copy_into", "make_column",
           "mismatch", "promotable"]

_U64 = struct.Struct("<Q")
_SPILL_FLUSH = 4 * BLOCK_SIZE
VAR_ARRAY_ALIGN = 16

#: Regions whose whole CRC-32 the header records and a reader checks at open (SPEC.md, "Integrity").
TABLES = frozenset({"offsets", "shapes", "index", "items"})

#: (whole_crc) -> a fresh Spill in the writer's spill directory.
SpillFactory = Callable[[bool], "Spill"]


def mismatch(idx: int, path: str, msg: str) -> SchemaMismatchError:
    return SchemaMismatchError(f"sample {idx}: leaf {path or '<root>'!r}: {msg}")


class Spill:
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

    def write_code(self, ns: dict[str, Any], name: str, expr: str) -> str:
        """Source of ``self.write(expr)`` inlined into a generated row encoder (names ``B<name>``, ``F<name>`` in ns).

        Appends to the same buffer and flushes at the same size as ``write``: the bytes written are the same.
        """
        ns[f"B{name}"], ns[f"F{name}"], ns["SPILL_FLUSH"] = self.buf, self.flush_full, _SPILL_FLUSH
        return f"B{name}.extend({expr})\n    if len(B{name}) >= SPILL_FLUSH: F{name}()"

    def flush_full(self) -> None:
        """Write out the whole blocks buffered so far (what ``write`` does once the buffer is large)."""
        self._flush(final=False)

    def write_repeated(self, data: bytes, count: int) -> None:
        """``count`` copies of ``data``, in bounded pieces."""
        per = max(1, _SPILL_FLUSH // max(1, len(data)))
        while count > 0:
            n = min(per, count)
            self.write(data * n)
            count -= n

    def _flush(self, final: bool) -> None:
        buf = self.buf
        n = len(buf) if final else len(buf) // BLOCK_SIZE * BLOCK_SIZE
        with memoryview(buf) as mv:
            part = mv[:n]
            for k in range(0, n, BLOCK_SIZE):
                self.blocks.append(crc32(part[k : k + BLOCK_SIZE]))
            if self.whole_crc:
                self.crc = crc32(part, self.crc)
            self.f.write(part)
            part.release()
        del buf[:n]
        self.flushed += n

    def read_back(self) -> Iterator[bytes]:
        """Everything written so far, in pieces (the file part, then the buffer); writing may go on afterwards."""
        self.f.flush()
        fd = self.f.fileno()
        done = 0
        while done < self.flushed:
            chunk = os.pread(fd, min(self.flushed - done, 8 * BLOCK_SIZE), done)
            if not chunk:
                raise OSError(f"spill file {self.path} shorter than expected")
            done += len(chunk)
            yield chunk
        if self.buf:
            yield bytes(self.buf)

    def finish(self) -> None:
        self._flush(final=True)
        self.f.flush()

    def close(self) -> None:
        self.f.close()


class Bytes:
    """A small in-memory region (compression index, checksum table) with the Spill interface."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)
        self.blocks = array("I", (crc32(data[k : k + BLOCK_SIZE]) for k in range(0, len(data), BLOCK_SIZE)))
        self.crc = crc32(data)


class _Heap:
    """A heap region: raw, or block-compressed (LZ4 or zstd) with its index (SPEC.md, "Columns")."""

    def __init__(self, spill: Spill, compression: Compression | None) -> None:
        self.spill = spill
        self.logical = 0  # bytes of the uncompressed heap so far
        self.codec = compression[0] if compression is not None else None
        self.compress = block_compressor(*compression) if compression is not None else None
        self.raw = bytearray()  # uncompressed bytes not yet compressed into a block
        self.index = array("Q", [0])

    def write(self, data: Any) -> None:
        self.logical += len(data)
        if self.compress is None:
            self.spill.write(data)
            return
        self.raw += data
        if len(self.raw) >= HEAP_BLOCK:
            self._compress(final=False)

    def write_code(self, ns: dict[str, Any], name: str, expr: str) -> str:
        """Source of ``self.write(expr)`` inlined into a generated row encoder, less the ``logical`` count (the
        caller adds it): the bytes go where ``write`` puts them, compressed at the same block boundaries."""
        if self.compress is None:
            return self.spill.write_code(ns, name, expr)
        ns[f"R{name}"], ns[f"C{name}"], ns["HEAP_BLOCK"] = self.raw, self.compress_full, HEAP_BLOCK
        return f"R{name}.extend({expr})\n    if len(R{name}) >= HEAP_BLOCK: C{name}()"

    def compress_full(self) -> None:
        """Compress the whole blocks buffered so far (what ``write`` does once a block is full)."""
        self._compress(final=False)

    def _compress(self, final: bool) -> None:
        raw = self.raw
        n = len(raw) if final else len(raw) // HEAP_BLOCK * HEAP_BLOCK
        compress = self.compress
        for k in range(0, n, HEAP_BLOCK):
            self.spill.write(compress(bytes(raw[k : k + HEAP_BLOCK])))
            self.index.append(self.spill.size)
        del raw[:n]

    @property
    def nbytes(self) -> int:
        return self.spill.size + len(self.raw)

    def finish(self) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        if self.compress is None:
            return {"compression": None}, [("heap", self.spill)]
        self._compress(final=True)
        extra = {"compression": {"codec": self.codec, "block": HEAP_BLOCK, "raw_size": self.logical}}
        return extra, [("heap", self.spill), ("index", Bytes(self.index.tobytes()))]


class Column:
    """The spills of one leaf. ``encode(value, idx)`` -> encoded (None: the row holds None); ``append(encoded)``."""

    def __init__(self, path: str, leaf: Leaf, new_spill: SpillFactory, compression: Compression | None) -> None:
        self.path = path
        self.leaf = leaf
        self.new_spill = new_spill
        self.compression = compression
        self.present = new_spill(False) if leaf.optional else None
        self._encode = leaf.spec.encode

    def encode(self, v: Any, idx: int) -> Any:
        if v is None and self.present is not None:
            return None
        try:
            return self._encode(self.leaf, v)
        except EncodeError as exc:
            raise mismatch(idx, self.path, str(exc)) from None

    def append(self, encoded: Any) -> None:
        if self.present is not None:
            self.present.write(b"\x00" if encoded is None else b"\x01")
        self._append(encoded)

    def _append(self, encoded: Any) -> None:
        raise NotImplementedError

    def append_absent(self, rows: int) -> None:
        """``rows`` rows holding None (the column is optional)."""
        raise NotImplementedError

    def append_code(self, ns: dict[str, Any], k: int, var: str) -> str:
        """Source appending the encoded value named ``var`` to this column, for a generated row encoder.

        The default calls ``append``; columns override it with the same writes inlined (the per-row
        calls cost more than the copying when rows are small).
        """
        ns[f"A{k}"] = self.append
        return f"A{k}({var})"

    def spills(self) -> list[Spill]:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        return sum(s.size for s in self.spills())

    def _regions(self) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        raise NotImplementedError

    def finish(self) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        """(extra column fields, [(region name, Spill or Bytes)]) in header order; spills flushed."""
        extra, regions = self._regions()
        if self.present is not None:
            regions.append(("present", self.present))
        for _, region in regions:
            if isinstance(region, Spill):
                region.finish()
        return extra, regions

    def close(self) -> None:
        for s in self.spills():
            s.close()

    def promoted(self, leaf: Leaf, rows: int) -> Column:
        """This column as a column of the wider ``leaf`` (``promotable(self.leaf, leaf)``), holding the same rows.

        Cheap, because the stored bytes stay where they are: a leaf that becomes
        optional gets presence flags (all set) for the rows so far; a fixed-shape
        array column becomes a var_array column whose heap is the old data region
        (row i at i * row_bytes, all rows of the old shape); a ``none`` column is
        replaced by an empty column of the new kind with ``rows`` absent rows.
        """
        old = self.leaf
        if old.kind == "none":
            col = make_column(self.path, leaf, self.new_spill, self.compression)
            col.append_absent(rows)
            self.close()
            return col
        if old.kind == "array" and leaf.kind == "var_array":
            assert isinstance(self, FixedColumn)
            return VarColumn.from_fixed(self, leaf, rows)
        self.leaf = leaf
        self.present = self.new_spill(False)
        self.present.write_repeated(b"\x01", rows)
        return self


def promotable(old: Leaf, new: Leaf) -> bool:
    """True when a column of ``old`` becomes one of ``new`` without rewriting its rows (Column.promoted)."""
    if old == new:
        return True
    if old.kind == "none":
        return new.optional
    if old.optional and not new.optional:
        return False
    if old.kind == "array" and new.kind == "var_array":
        return old.dtype == new.dtype and len(old.row_shape) == new.ndim
    return Leaf(old.kind, old.dtype, old.shape, old.ndim, old.format, old.item, True) == new


class FixedColumn(Column):
    """int, float, bool, array, image and none leaves: row i at i * row_bytes of the data region."""

    def __init__(self, path: str, leaf: Leaf, new_spill: SpillFactory, compression: Compression | None) -> None:
        super().__init__(path, leaf, new_spill, compression)
        self.data = new_spill(False)
        self.zeros = bytes(leaf.row_bytes)

    def _append(self, encoded: Any) -> None:
        self.data.write(self.zeros if encoded is None else encoded)

    def append_code(self, ns: dict[str, Any], k: int, var: str) -> str:
        if self.present is not None:
            return super().append_code(ns, k, var)
        return self.data.write_code(ns, f"{k}d", var)

    def append_absent(self, rows: int) -> None:
        if self.zeros:
            self.data.write_repeated(self.zeros, rows)
        self.present.write_repeated(b"\x00", rows)

    def spills(self) -> list[Spill]:
        return [s for s in (self.data, self.present) if s is not None]

    def _regions(self) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        return {}, [("data", self.data)]


class VarColumn(Column):
    """str, bytes, encoded_image and var_array leaves: row i is heap bytes offsets[i]..offsets[i+1]-1."""

    def __init__(self, path: str, leaf: Leaf, new_spill: SpillFactory, compression: Compression | None,
                 heap: _Heap | None = None) -> None:
        super().__init__(path, leaf, new_spill, compression)
        self.offsets = new_spill(True)
        self.heap = heap if heap is not None else _Heap(new_spill(False), compression)
        self.shapes = new_spill(True) if leaf.kind == "var_array" else None
        self.shape_struct = struct.Struct(f"<{leaf.ndim}Q") if leaf.ndim else None
        self.empty_shape = bytes(8 * (leaf.ndim or 0))

    @classmethod
    def from_fixed(cls, fixed: FixedColumn, leaf: Leaf, rows: int) -> VarColumn:
        """The var_array column holding the rows of a fixed-shape array column (see Column.promoted)."""
        rb = fixed.leaf.row_bytes
        if fixed.compression is None:
            # The data region, as it is, is the heap: row i at i * row_bytes.
            heap = _Heap(fixed.data, None)
            heap.logical = fixed.data.size
            col = cls(fixed.path, leaf, fixed.new_spill, None, heap)
        else:
            col = cls(fixed.path, leaf, fixed.new_spill, fixed.compression)
            for chunk in fixed.data.read_back():
                col.heap.write(chunk)
            fixed.data.close()
        col.present = fixed.present
        if leaf.optional and col.present is None:
            col.present = fixed.new_spill(False)
            col.present.write_repeated(b"\x01", rows)
        if rb:
            step = 1 << 16
            for a in range(0, rows, step):
                col.offsets.write(array("Q", range(a * rb, min(rows, a + step) * rb, rb)).tobytes())
        else:
            col.offsets.write_repeated(_U64.pack(0), rows)
        col.shapes.write_repeated(col.shape_struct.pack(*fixed.leaf.row_shape), rows)
        return col

    def _append(self, encoded: Any) -> None:
        heap = self.heap
        if encoded is None:
            self.offsets.write(_U64.pack(heap.logical))
            if self.shapes is not None:
                self.shapes.write(self.empty_shape)
            return
        payload, shape = encoded if self.shapes is not None else (encoded, None)
        if shape is not None:
            pad = -heap.logical % VAR_ARRAY_ALIGN
            if pad:
                heap.write(b"\x00" * pad)
            self.shapes.write(self.shape_struct.pack(*shape))
        self.offsets.write(_U64.pack(heap.logical))
        heap.write(payload)

    def append_code(self, ns: dict[str, Any], k: int, var: str) -> str:
        heap = self.heap
        if self.present is not None or self.shapes is not None:
            return super().append_code(ns, k, var)
        # _append then _Heap.write: the row's offset, then its bytes.
        ns[f"H{k}"], ns["PU64"] = heap, _U64.pack
        return "\n    ".join([
            self.offsets.write_code(ns, f"{k}o", f"PU64(H{k}.logical)"),
            f"H{k}.logical += len({var})",
            heap.write_code(ns, f"{k}h", var),
        ])

    def append_rows(self, lengths: list[int], payload: bytes) -> None:
        """Rows whose bytes are ``payload`` cut at ``lengths``, at once: what ``append`` of each writes (a str or
        bytes column: no shapes, no presence flags)."""
        heap = self.heap
        self.offsets.write(array("Q", itertools.accumulate(lengths, initial=heap.logical)).tobytes()[:-8])
        heap.write(payload)

    def append_absent(self, rows: int) -> None:
        self.offsets.write_repeated(_U64.pack(self.heap.logical), rows)
        if self.shapes is not None:
            self.shapes.write_repeated(self.empty_shape, rows)
        self.present.write_repeated(b"\x00", rows)

    def spills(self) -> list[Spill]:
        return [s for s in (self.offsets, self.heap.spill, self.shapes, self.present) if s is not None]

    @property
    def nbytes(self) -> int:
        return super().nbytes + len(self.heap.raw)

    def _regions(self) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        self.offsets.write(_U64.pack(self.heap.logical))
        extra, regions = self.heap.finish()
        regions.insert(0, ("offsets", self.offsets))
        if self.shapes is not None:
            regions.append(("shapes", self.shapes))
        return extra, regions


class ListColumn(Column):
    """var_list leaves: row i holds items offsets[i]..offsets[i+1]-1 (packed scalars, or str items ending at items[k+1])."""

    def __init__(self, path: str, leaf: Leaf, new_spill: SpillFactory, compression: Compression | None) -> None:
        super().__init__(path, leaf, new_spill, compression)
        self.offsets = new_spill(True)
        self.heap = _Heap(new_spill(False), compression)
        self.items = new_spill(True) if leaf.item == "str" else None
        self.count = 0  # items so far

    def _append(self, encoded: Any) -> None:
        self.offsets.write(_U64.pack(self.count))
        if encoded is None:
            return
        items, n = encoded
        self.count += n
        if self.items is None:
            self.heap.write(items)
            return
        heap = self.heap
        starts = array("Q")
        for item in items:
            starts.append(heap.logical)
            heap.write(item)
        self.items.write(starts.tobytes())

    def append_code(self, ns: dict[str, Any], k: int, var: str) -> str:
        heap = self.heap
        if self.present is not None or self.items is not None:
            return super().append_code(ns, k, var)
        # _append then _Heap.write, for packed scalar items: the row's first item, then its items.
        ns[f"L{k}"], ns[f"H{k}"], ns["PU64"] = self, heap, _U64.pack
        return "\n    ".join([
            self.offsets.write_code(ns, f"{k}o", f"PU64(L{k}.count)"),
            f"L{k}.count += {var}[1]",
            f"H{k}.logical += len({var}[0])",
            heap.write_code(ns, f"{k}h", f"{var}[0]"),
        ])

    def append_rows(self, counts: list[int], payload: bytes) -> None:
        """Rows of ``counts`` packed scalar items whose bytes are ``payload``, at once: what ``append`` of each
        writes (no str items, no presence flags)."""
        offsets = array("Q", itertools.accumulate(counts, initial=self.count))
        self.count = offsets.pop()
        self.offsets.write(offsets.tobytes())
        self.heap.write(payload)

    def append_absent(self, rows: int) -> None:
        self.offsets.write_repeated(_U64.pack(self.count), rows)
        self.present.write_repeated(b"\x00", rows)

    def spills(self) -> list[Spill]:
        return [s for s in (self.offsets, self.heap.spill, self.items, self.present) if s is not None]

    @property
    def nbytes(self) -> int:
        return super().nbytes + len(self.heap.raw)

    def _regions(self) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
        self.offsets.write(_U64.pack(self.count))
        extra, regions = self.heap.finish()
        regions.insert(0, ("offsets", self.offsets))
        if self.items is not None:
            self.items.write(_U64.pack(self.heap.logical))
            regions.append(("items", self.items))
        return extra, regions


def make_column(path: str, leaf: Leaf, new_spill: SpillFactory, compression: Compression | None) -> Column:
    """The empty column of a leaf."""
    if leaf.kind == "var_list":
        return ListColumn(path, leaf, new_spill, compression)
    if leaf.fixed_size:
        return FixedColumn(path, leaf, new_spill, compression)
    return VarColumn(path, leaf, new_spill, compression)


def copy_into(src: Any, dst_fd: int, dst_off: int) -> None:
    """Copy a region into the output at dst_off: kernel-side when possible, read/write otherwise."""
    if isinstance(src, Bytes):
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
