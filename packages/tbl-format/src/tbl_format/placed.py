"""PlacedWriter: one .tbl file whose big fixed-size column is written in place, by other processes too.

The streaming `Writer` spills every column to a temp file and copies the
spills into the output at ``close()``: every byte is written twice. When the
rows are fixed-size and their number is known up front (at most
``capacity``), the big column's place in the output is known before any row
arrives, so its rows can be written straight there, by anyone who can open
the temp file (`PlacedWriter.path`): row slot ``i`` of the placed leaf is at
byte `offset(i)` (``row_bytes`` long). The other leaves (a label, small
fixed-size columns) are given to `commit` and spilled as usual.

Commit order is row order: ``commit(slot, values)`` makes the bytes at slot
``slot`` the next row. A slot that is not the next row (earlier slots were
never committed: a skipped image) is moved down to it, so committed rows are
always contiguous; the per-block CRC-32s are computed as rows are committed,
and committed bytes are handed to the disk as they accumulate
(``WRITEBACK_STEP``). Whoever writes a row may checksum it too (`row_crcs`,
while the row is in its cache) and pass the CRCs to `commit`, which folds
them in (``crc32_combine``); otherwise, or where the row moves down, the row
is checksummed from the page cache (a memory map), never from a second copy.

The file is byte-for-byte the file `Writer` writes from the same rows
(same layout, header and checksums): the placed column is staged where it
would lie if all ``capacity`` rows were committed under the longest header
those rows could need, which is where it ends up unless rows were left out
before it in the layout or the header came out shorter across a 4096-byte
boundary; then ``close()`` moves it down once. Bytes of uncommitted slots
beyond the last row are cut off before the rest of the file is written, so
the gaps between regions stay zero as in a freshly written file.

Publishing is the writer's: temp name next to ``dst`` (hidden, with
``.tbl-tmp-`` in it), fsync, atomic rename, fsync of the directory;
``abort()`` (or an exception in a ``with`` block) removes the temp file.
Free space for the whole placed column is checked at construction.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .columns import FixedColumn, copy_into
from .crc import crc32, crc32_combine
from .destination import check_destination
from .errors import SchemaMismatchError
from .fsutil import ensure_space, fsync_dir, start_writeback
from .layout import BLOCK_SIZE, PREAMBLE_SIZE, align_up
from .schema import Schema
from .writer import FileWriter, check_header_room, check_metadata

__all__ = ["PlacedWriter", "row_crcs"]

_MOVE_CHUNK = 8 * BLOCK_SIZE
#: Committed rows are handed to the disk in steps of this many bytes (`fsutil.start_writeback`), so that the
#: final fsync finds little left to write: without it, a 768 MiB column waited 0.35-0.65 s there, CPUs idle.
WRITEBACK_STEP = 16 * BLOCK_SIZE
_MAX_U32 = 0xFFFFFFFF


def _pieces(offset: int, size: int) -> list[int]:
    """Lengths of ``size`` bytes at ``offset`` of a data region, cut where a CRC block (BLOCK_SIZE) ends."""
    out = []
    while size:
        n = min(size, BLOCK_SIZE - offset % BLOCK_SIZE)
        out.append(n)
        offset += n
        size -= n
    return out


def row_crcs(slot: int, row: bytes | bytearray | memoryview) -> list[int]:
    """The CRC-32 of each piece of ``row`` at slot ``slot`` of a placed column, cut where a CRC block ends.

    Whoever writes a row in place can compute these while the row is in its cache and hand them to
    `PlacedWriter.commit`, which then folds them into the block checksums instead of reading the row back.
    """
    with memoryview(row) as view:
        rb = view.nbytes
        out = []
        done = 0
        for n in _pieces(slot * rb, rb):
            out.append(crc32(view[done : done + n]))
            done += n
        return out


class _Longest:
    """A region as the header sees it, at its largest: used to find the longest header ``capacity`` rows need."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.blocks = range(-(-size // BLOCK_SIZE))
        self.crc = _MAX_U32


class PlacedRegion:
    """The data region of the placed column, inside the output temp file at ``base``; CRCs follow commits."""

    def __init__(self, fd: int, base: int, row_bytes: int, capacity: int) -> None:
        self.fd = fd
        self.base = base
        self.row_bytes = row_bytes
        self.capacity = capacity
        self.rows = 0
        self.blocks = array("I")
        self.crc = 0  # no whole-region CRC: a data region is covered by its block CRCs
        self._block_crc = 0
        self._block_fill = 0
        self._written_back = 0  # bytes of the region handed to the disk so far (start_writeback)
        span = row_bytes * capacity
        # A map starts at a multiple of the allocation granularity (4096 on Linux, where base already is one).
        self._skip = base % mmap.ALLOCATIONGRANULARITY
        self._map = mmap.mmap(fd, self._skip + span, offset=base - self._skip) if span else None

    @property
    def size(self) -> int:
        return self.rows * self.row_bytes

    def commit(self, slot: int, crcs: Sequence[int] | None = None) -> None:
        """Slot ``slot`` (>= the next row) holds the next row's bytes: move them down if needed, checksum them.

        ``crcs``: the row's `row_crcs` from whoever wrote it, folded in without reading the row back; they hold
        only where the row stays (``slot`` is the next row), and are ignored where it moves down.
        """
        rb = self.row_bytes
        row = self.rows
        if not row <= slot < self.capacity:
            raise IndexError(f"slot {slot} is not in [{row}, {self.capacity}): slots are committed once, in order")
        pieces = _pieces(row * rb, rb)
        given = crcs is not None and slot == row
        if given and len(crcs) != len(pieces):
            raise ValueError(f"slot {slot}: {len(crcs)} CRCs for a row in {len(pieces)} pieces (see row_crcs)")
        self.rows += 1
        if not rb:
            return
        if given:
            for n, crc in zip(pieces, crcs, strict=True):
                self._add_piece(n, crc32_combine(self._block_crc, crc, n) if self._block_fill else crc)
        else:
            m = self._map
            assert m is not None
            at, src = self._skip + row * rb, self._skip + slot * rb
            if slot != row:  # earlier slots were left out: the rows stay contiguous
                m[at : at + rb] = m[src : src + rb]
            with memoryview(m) as view:
                done = at
                for n in pieces:
                    self._add_piece(n, crc32(view[done : done + n], self._block_crc))
                    done += n
        done = self.rows * rb
        if done - self._written_back >= WRITEBACK_STEP:
            start_writeback(self.fd, self.base + self._written_back, done - self._written_back)
            self._written_back = done

    def _add_piece(self, n: int, block_crc: int) -> None:
        """The current block grew by ``n`` bytes and its CRC is now ``block_crc``; a full block is recorded."""
        self._block_crc = block_crc
        self._block_fill += n
        if self._block_fill == BLOCK_SIZE:
            self.blocks.append(block_crc)
            self._block_crc = 0
            self._block_fill = 0

    def finish(self) -> None:
        """Close the last, partial block; unmap (nothing reads through the map after this)."""
        if self._block_fill:
            self.blocks.append(self._block_crc)
            self._block_crc = 0
            self._block_fill = 0
        self.close()

    def place(self, fd: int, offset: int) -> None:
        """Put the committed rows at ``offset`` of the output (<= base: a move down, if any) and cut off
        everything after them, so that later regions land in a zeroed file."""
        if offset > self.base:
            raise AssertionError(f"the placed column would move up ({self.base} -> {offset})")
        size = self.size
        done = 0
        while done < size and offset != self.base:  # forward copy: safe for a move down, overlapping or not
            chunk = os.pread(fd, min(_MOVE_CHUNK, size - done), self.base + done)
            if not chunk:
                raise OSError(f"the output temp file is shorter than its placed rows ({self.base + done})")
            os.pwrite(fd, chunk, offset + done)
            done += len(chunk)
        os.ftruncate(fd, offset + size)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None


class _PlacedFileWriter(FileWriter):
    """A FileWriter whose ``placed`` leaf's data region is a PlacedRegion of the (already existing) temp file."""

    def __init__(self, final: Path, schema: Schema, metadata: dict[str, Any], file_id: str | None, placed: str,
                 capacity: int) -> None:
        self.fd = -1
        self.region: PlacedRegion | None = None
        super().__init__(final, schema, metadata, None, file_id)
        try:
            self.placed = placed
            col = next(c for c in self.columns if c.path == placed)
            assert isinstance(col, FixedColumn)
            col.data.close()
            base = self._staging_offset(capacity)
            self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            need = col.leaf.row_bytes * capacity
            ensure_space(self.tmp.parent, need, f"writing {final.name} ({capacity:,} rows of {placed!r} in place)")
            os.ftruncate(self.fd, base + need)
            col.data = self.region = PlacedRegion(self.fd, base, col.leaf.row_bytes, capacity)
        except BaseException:
            self.abort()
            raise
        self.append_fast = lambda sample, idx: False  # rows arrive through PlacedWriter.commit only

    def _staging_offset(self, capacity: int) -> int:
        """Where the placed region lies when all ``capacity`` rows are committed under the longest header."""
        parts = []
        nblocks = 0
        for col in self.columns:
            regions = [(name, _Longest(col.leaf.row_bytes * capacity)) for name, _ in col._regions()[1]]
            nblocks += sum(len(r.blocks) for _, r in regions)
            parts.append((col.path, {}, regions))
        table = _Longest(4 * nblocks)
        saved = self.rows
        self.rows = capacity
        try:
            data_start = align_up(PREAMBLE_SIZE)
            while True:
                header, places, _ = self._header(parts, table, data_start)
                need = align_up(PREAMBLE_SIZE + len(header))
                if need <= data_start:
                    break
                data_start = need
        finally:
            self.rows = saved
        placed_region = next(r for path, _, regions in parts if path == self.placed for _, r in regions)
        return next(pos for r, pos in places if r is placed_region)

    def finish(self) -> tuple[Path, int, int]:
        assert self.region is not None
        self.region.finish()  # the last partial block's CRC; Column.finish flushes Spills only
        return super().finish()

    def _open_output(self) -> int:
        return os.dup(self.fd)

    def _assembly_space(self, file_size: int) -> int:
        assert self.region is not None
        return max(0, file_size - self.region.base - self.region.size)  # the placed rows are on disk already

    def _copy(self, src: Any, fd: int, off: int) -> None:
        if isinstance(src, PlacedRegion):
            src.place(fd, off)
        else:
            copy_into(src, fd, off)

    def _drop_spills(self) -> None:
        super()._drop_spills()
        if self.region is not None:
            self.region.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class PlacedWriter:
    """One .tbl file of fixed-size leaves, at most ``capacity`` rows; leaf ``placed`` is written in place.

    ``path``: the temp file; anyone may open it and write the ``row_bytes``
    bytes of slot ``i`` at `offset(i)` (for example a worker process writing
    a decoded image). ``commit(slot, values)`` then makes slot ``slot`` the
    next row, with ``values`` the row's other leaves by path; slots are
    committed in increasing order, and a slot left out is simply never
    committed. ``close()`` publishes ``dst`` atomically and returns it;
    ``abort()`` removes the temp file. As a context manager it closes on
    success and aborts on exception. Every leaf must be fixed-size and not
    optional (ValueError otherwise). The destination rules are `Writer`'s
    (``overwrite``, links and special files never replaced).
    """

    def __init__(self, dst: str | os.PathLike[str], schema: Schema | Any, *, placed: str, capacity: int,
                 metadata: dict[str, Any] | None = None, overwrite: bool = False,
                 file_id: str | None = None) -> None:
        self.schema = schema if isinstance(schema, Schema) else Schema(schema)
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ValueError(f"capacity must be an int >= 0, got {capacity!r}")
        leaves = self.schema.leaves
        if placed not in leaves:
            raise ValueError(f"placed leaf {placed!r} is not in the schema (leaves: {list(leaves)})")
        for path, leaf in leaves.items():
            if not leaf.fixed_size or leaf.optional or leaf.kind == "var_list":
                raise ValueError(f"leaf {path!r} ({leaf.kind}) is not fixed-size: PlacedWriter writes fixed-size "
                                 "rows only (use Writer)")
        if file_id is not None and not isinstance(file_id, str):
            raise TypeError(f"file_id must be a str, got {type(file_id).__name__}")
        self.dst = Path(dst)
        self.metadata = check_metadata(metadata)
        check_header_room(self.schema, self.metadata)
        self.overwrite = bool(overwrite)
        check_destination(self.dst, overwrite=self.overwrite)
        self._fw = _PlacedFileWriter(self.dst, self.schema, self.metadata, file_id, placed, capacity)
        try:  # a constructor ended early (a Ctrl-C included) leaves no temp file: there is no writer to abort
            self._others = [c for c in self._fw.columns if c.path != placed]
            self.placed = placed
            self.capacity = capacity
            self.row_bytes = leaves[placed].row_bytes
            self.path = str(self._fw.tmp)
            self._done = False
        except BaseException:
            self._fw.abort()
            raise

    def offset(self, slot: int) -> int:
        """Byte offset in `path` of slot ``slot`` (0 <= slot < capacity) of the placed leaf."""
        if not 0 <= slot < self.capacity:
            raise IndexError(f"slot {slot} is not in [0, {self.capacity})")
        return self._fw.region.base + slot * self.row_bytes

    @property
    def rows(self) -> int:
        return self._fw.rows

    def commit(self, slot: int, values: Mapping[str, Any], crcs: Sequence[int] | None = None) -> None:
        """Make slot ``slot`` the next row; ``values``: its other leaves by path (SchemaMismatchError if wrong).

        ``crcs``: the placed leaf's `row_crcs` for this slot, from whoever wrote it: the row is then not read
        back to be checksummed (unless earlier slots were left out and it moves down).
        """
        if self._done:
            raise RuntimeError("commit() on a closed or aborted PlacedWriter")
        idx = self._fw.rows
        if len(values) != len(self._others) or any(c.path not in values for c in self._others):
            raise SchemaMismatchError(f"sample {idx}: expected values for {[c.path for c in self._others]}, "
                                      f"got {list(values)}")
        encoded = [c.encode(values[c.path], idx) for c in self._others]
        self._fw.region.commit(slot, crcs)
        for c, e in zip(self._others, encoded, strict=True):
            c.append(e)
        self._fw.rows += 1

    def close(self) -> Path:
        """Publish atomically and return the destination path."""
        if self._done:
            raise RuntimeError("close() on a closed or aborted PlacedWriter")
        self._done = True
        fw = self._fw
        try:
            tmp, _, _ = fw.finish()
            check_destination(self.dst, overwrite=self.overwrite)  # again, just before the rename
            os.replace(tmp, self.dst)
            fsync_dir(self.dst.parent)
        except BaseException:
            fw.abort()
            raise
        return self.dst

    def abort(self) -> None:
        """Remove the temp file; a previously published destination stays as it was."""
        if self._done:
            return
        self._done = True
        self._fw.abort()

    def __enter__(self) -> PlacedWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

