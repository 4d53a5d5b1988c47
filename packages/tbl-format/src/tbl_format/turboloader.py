"""Read support for TurboLoader's files (magic ``TBL\\x02``; TurboLoader calls its format "TBL v2"), TURBOLOADER.md.

A v2 file is a 64-byte header, an index of 24-byte entries (one per sample),
the sample payloads, and an optional metadata section of per-sample blocks.
``open_turboloader(path)`` validates all of it (every offset and size against the file
size, in Python ints, so nothing overflows) and returns a ``TurboLoaderFile``: the same
``Shard`` interface as a native file, so ``tbl_format.open`` serves both.

What a v2 sample looks like here:

- every sample RAW_U8 with one (H, W): ``{"image": (H, W, 3) uint8}``. When the
  payloads are uncompressed and back to back (what TurboLoader writes),
  ``column("image")`` is a zero-copy (N, H, W, 3) view of the file; otherwise
  (gaps, reordered payloads, LZ4) rows still read one by one but
  ``column("image")`` raises ``V2LayoutError`` rather than copying the dataset
  into memory behind the caller's back.
- anything else: ``{"data": bytes, "format": int}`` (the payload, LZ4-decompressed
  when the entry says so, and TurboLoader's SampleFormat code).
- a file with a metadata section adds ``"meta"`` (bytes: the sample's first
  metadata block, b"" if it has none) and, when every sample's block is a JSON
  object with an integer ``"label"``, an int ``"label"`` leaf before it.
"""

from __future__ import annotations

import array
import json
import os
import struct
import sys
from pathlib import Path
from typing import Any

from .codec import load_lz4_block
from .crc import crc32
from .errors import (
    BadMagicError,
    CorruptDataError,
    DataChecksumError,
    HeaderChecksumError,
    HeaderFormatError,
    RegionBoundsError,
    TruncatedFileError,
    UnsupportedVersionError,
    V2LayoutError,
)
from .schema import Leaf, Schema
from .shard import Progress, Shard, fixed_leaf, map_file, release_map

try:
    import numpy as _np
except ImportError:  # the index is then checked by a Python loop
    _np = None

__all__ = [
    "ENTRY",
    "HEADER",
    "RAW_U8",
    "SAMPLE_FORMATS",
    "TURBOLOADER_MAGIC",
    "TurboLoaderFile",
    "crc16",
    "open_turboloader",
]

TURBOLOADER_MAGIC = b"TBL\x02"
V2_VERSION = 2
#: magic, version u32, num_samples u64, header_size u32, pad u32, metadata_offset u64,
#: metadata_size u64, flags u32, header_crc32 u32, reserved 16 bytes.
HEADER = struct.Struct("<4sIQIIQQII16s")
HEADER_CRC_AT = 44
#: offset u64, size u32, uncompressed_size u32, width u16, height u16, format u8, flags u8, crc16 u16.
ENTRY = struct.Struct("<QIIHHBBH")
#: sample_index u64, size u32, type u16, reserved u16.
META_BLOCK = struct.Struct("<QIHH")

RAW_U8 = 8
SAMPLE_FORMATS = {0: "UNKNOWN", 1: "JPEG", 2: "PNG", 3: "WEBP", 4: "BMP", 5: "TIFF", 6: "VIDEO_MP4", 7: "VIDEO_AVI", 8: "RAW_U8"}
FLAG_HAS_CHECKSUMS = 1 << 2
SAMPLE_COMPRESSED = 1 << 0
SAMPLE_KNOWN_FLAGS = 0b111  # compressed, has_metadata, verified
META_JSON = 1
# LZ4 cannot expand a block by more than 255x (one length byte adds at most 255);
# a larger claimed ratio is a corrupt entry, refused before any allocation.
_LZ4_MAX_RATIO = 255
_LZ4_SLACK = 64


def _numpy() -> Any:
    """numpy, or None when it is not installed (tests hide it by replacing this function)."""
    return _np


def _crc16_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xA001 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC16 = _crc16_table()


def crc16(data: bytes | memoryview, crc: int = 0xFFFF) -> int:
    """CRC-16 of TBL v2 sample entries: reflected polynomial 0xA001, init 0xFFFF, no final xor (CRC-16/MODBUS)."""
    t = _CRC16
    for b in data:
        crc = (crc >> 8) ^ t[(crc ^ b) & 0xFF]
    return crc


def open_turboloader(path: str | os.PathLike[str]) -> TurboLoaderFile:
    """Open and validate a TurboLoader file; raises a FormatError subclass on the first broken rule."""
    return TurboLoaderFile(path)


class TurboLoaderFile(Shard):
    """One TurboLoader (TBL v2) file, memory-mapped read-only. See ``Shard`` for the interface."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._mm: Any = None
        self._views: dict[str, Any] = {}
        self._mm, size = map_file(self.path, HEADER.size, "v2 header")
        try:
            self._parse(size)
        except BaseException:
            self.close()
            raise

    # ---- open-time validation -------------------------------------------------------------------
    def _parse(self, size: int) -> None:
        mm = self._mm
        where = str(self.path)
        magic, version, n, header_size, _pad, meta_off, meta_size, flags, crc, _res = HEADER.unpack_from(mm, 0)
        if magic != TURBOLOADER_MAGIC:
            raise BadMagicError(f"{where}: not a TBL v2 file (magic {magic!r})")
        if version != V2_VERSION:
            raise UnsupportedVersionError(f"{where}: TBL v2 magic with version {version}; this reader knows version 2")
        head = bytearray(mm[: HEADER.size])
        head[HEADER_CRC_AT : HEADER_CRC_AT + 4] = b"\0\0\0\0"
        if crc32(head) != crc:
            raise HeaderChecksumError(f"{where}: v2 header CRC-32 mismatch")
        self.header_crc32 = crc
        self.flags = flags
        # The entry count is bounded by the file size before it is multiplied by anything.
        if n > (size - HEADER.size) // ENTRY.size:
            raise TruncatedFileError(f"{where}: {size} bytes cannot hold the index of {n} samples")
        index_end = HEADER.size + n * ENTRY.size
        if header_size != index_end:
            raise HeaderFormatError(f"{where}: header_size {header_size}, expected 64 + 24 x {n} = {index_end}")
        self.rows = n
        self._n = n
        self._index_end = index_end
        self._size = size
        np = _numpy()
        if np is not None:
            self._check_index_numpy(np, where)
        else:
            self._check_index_python(where)
        self._meta = self._read_metadata_section(meta_off, meta_size, where)
        self._build_schema(where)

    def _entry_error(self, i: int, off: int, sz: int, usize: int, w: int, h: int, fmt: int, fl: int, where: str) -> None:
        """Raise the error for entry i if it breaks a rule (the slow path names the sample and the rule)."""
        w_ = f"{where}: sample {i}"
        if off < self._index_end or off + sz > self._size:
            raise RegionBoundsError(f"{w_}: payload [{off}, {off + sz}) outside the data area [{self._index_end}, {self._size})")
        if fl & ~SAMPLE_KNOWN_FLAGS:
            raise HeaderFormatError(f"{w_}: unknown sample flags 0x{fl:02x}")
        if fl & SAMPLE_COMPRESSED:
            if usize > sz * _LZ4_MAX_RATIO + _LZ4_SLACK:
                raise HeaderFormatError(f"{w_}: {sz} LZ4 bytes cannot expand to {usize}")
        elif usize not in (0, sz):
            raise HeaderFormatError(f"{w_}: uncompressed sample of {sz} bytes declares uncompressed size {usize}")
        logical = usize if fl & SAMPLE_COMPRESSED else sz
        if fmt == RAW_U8 and logical != w * h * 3:
            raise RegionBoundsError(f"{w_}: RAW_U8 payload of {logical} bytes, expected {w} x {h} x 3")

    def _check_index_python(self, where: str) -> None:
        n = self._n
        if n and sys.byteorder == "little":
            # Same fast path as with numpy, at C speed through list operations: entries equal but for offsets.
            words = memoryview(self._mm)[HEADER.size : self._index_end].cast("Q").tolist()
            w1, w2 = words[1::3], words[2::3]
            mask = (1 << 48) - 1
            if w1.count(w1[0]) == n and len({w & mask for w in w2}) == 1:
                e0 = ENTRY.unpack_from(self._mm, HEADER.size)
                self._entry_error(0, *e0[:7], where)
                sz = e0[1]
                offs = words[0::3]
                if min(offs) < self._index_end or max(offs) > self._size - sz:
                    i = next(k for k, o in enumerate(offs) if o < self._index_end or o > self._size - sz)
                    self._entry_error(i, *ENTRY.unpack_from(self._mm, HEADER.size + i * ENTRY.size)[:7], where)
                contiguous = offs == list(range(offs[0], offs[0] + n * sz, sz)) if sz else offs.count(offs[0]) == n
                compressed = bool(e0[6] & SAMPLE_COMPRESSED)
                self._set_layout(e0[5] == RAW_U8, {(e0[4], e0[3])}, compressed, contiguous, offs[0])
                return
        self._check_index_loop(where)

    def _check_index_loop(self, where: str) -> None:
        mm = self._mm
        raw_dims: set[tuple[int, int]] = set()
        all_raw = self._n > 0
        contiguous = True
        first = None
        expect = 0
        any_compressed = False
        for i, (off, sz, usize, w, h, fmt, fl, _c) in enumerate(ENTRY.iter_unpack(mm[HEADER.size : self._index_end])):
            self._entry_error(i, off, sz, usize, w, h, fmt, fl, where)
            if fmt == RAW_U8:
                raw_dims.add((h, w))
            else:
                all_raw = False
            any_compressed = any_compressed or bool(fl & SAMPLE_COMPRESSED)
            if first is None:
                first, expect = off, off
            contiguous = contiguous and off == expect
            expect = off + sz
        self._set_layout(all_raw, raw_dims, any_compressed, contiguous, first)

    def _check_index_numpy(self, np: Any, where: str) -> None:
        n = self._n
        if n == 0:
            self._set_layout(False, set(), False, True, None)
            return
        # An entry is three u64 words: offset | size, usize << 32 | w, h << 16, format << 32, flags << 40, crc << 48.
        words = np.frombuffer(self._mm, dtype="<u8", count=3 * n, offset=HEADER.size).reshape(n, 3)
        off, w1, w2 = words[:, 0], words[:, 1], words[:, 2]
        shape_bits = np.uint64((1 << 48) - 1)  # every field of word 2 but the CRC
        if bool((w1 == w1[0]).all()) and bool(((w2 & shape_bits) == (w2[0] & shape_bits)).all()):
            # Fast path (every file TurboLoader's preprocess_to_tbl writes): all entries share size, dims,
            # format and flags, so the rules are checked once on entry 0, and only offsets vary.
            e0 = ENTRY.unpack_from(self._mm, HEADER.size)
            self._entry_error(0, *e0[:7], where)
            sz = e0[1]
            lo, hi = int(off.min()), int(off.max())
            if lo < self._index_end or hi > self._size - sz:
                bad = (off < self._index_end) | (off > self._size - sz) if sz <= self._size else off == off
                i = int(np.argmax(bad))
                self._entry_error(i, *ENTRY.unpack_from(self._mm, HEADER.size + i * ENTRY.size)[:7], where)
            contiguous = n == 1 or bool((off[1:] - off[:-1] == sz).all())
            fmt = e0[5]
            self._set_layout(fmt == RAW_U8, {(e0[4], e0[3])}, bool(e0[6] & SAMPLE_COMPRESSED), contiguous, int(off[0]))
            return
        sz = w1 & np.uint64(0xFFFFFFFF)
        usize = w1 >> np.uint64(32)
        width = w2 & np.uint64(0xFFFF)
        height = (w2 >> np.uint64(16)) & np.uint64(0xFFFF)
        fmt = (w2 >> np.uint64(32)) & np.uint64(0xFF)
        fl = (w2 >> np.uint64(40)) & np.uint64(0xFF)
        comp = (fl & np.uint64(SAMPLE_COMPRESSED)) != 0
        # off <= size first, so off + sz (sz < 2**32) cannot wrap in uint64.
        bad = (off < self._index_end) | (off > self._size)
        bad |= np.where(bad, False, off + sz > self._size)
        bad |= (fl & np.uint64(0xFF & ~SAMPLE_KNOWN_FLAGS)) != 0
        bad |= comp & (usize > sz * np.uint64(_LZ4_MAX_RATIO) + np.uint64(_LZ4_SLACK))
        bad |= ~comp & (usize != 0) & (usize != sz)
        logical = np.where(comp, usize, sz)
        bad |= (fmt == RAW_U8) & (logical != width * height * np.uint64(3))
        if bad.any():
            i = int(np.argmax(bad))
            self._entry_error(i, *ENTRY.unpack_from(self._mm, HEADER.size + i * ENTRY.size)[:7], where)
            raise AssertionError("vectorised and per-entry index checks disagree")  # pragma: no cover
        all_raw = bool((fmt == RAW_U8).all())
        raw_dims = set()
        if all_raw:
            raw_dims = {(int(height[0]), int(width[0]))}
            if bool((height != height[0]).any() or (width != width[0]).any()):
                raw_dims.add((-1, -1))
        contiguous = bool((off[1:] == off[:-1] + sz[:-1]).all())
        self._set_layout(all_raw, raw_dims, bool(comp.any()), contiguous, int(off[0]))

    def _set_layout(self, all_raw: bool, raw_dims: set[tuple[int, int]], compressed: bool, contiguous: bool, first: int | None) -> None:
        self._image_shape = None
        if all_raw and len(raw_dims) == 1:
            h, w = next(iter(raw_dims))
            if h > 0 and w > 0:
                self._image_shape = (h, w, 3)
        self._compressed = compressed
        self._zero_copy = self._image_shape is not None and not compressed and contiguous
        self._first = first

    def _read_metadata_section(self, off: int, size: int, where: str) -> list[tuple[int, int, int]] | None:
        """Per sample: (offset, size, type) of its first metadata block, (0, 0, 0) if none; None without a section."""
        if size == 0:
            return None
        if off < self._index_end or off > self._size or size > self._size - off:
            raise RegionBoundsError(f"{where}: metadata section [{off}, {off + size}) outside [{self._index_end}, {self._size})")
        blocks = [(0, 0, 0)] * self._n
        seen = bytearray(self._n)
        pos, end = off, off + size
        while pos < end:
            if end - pos < META_BLOCK.size:
                raise RegionBoundsError(f"{where}: metadata block header at {pos} runs past the section end {end}")
            idx, n, typ, _r = META_BLOCK.unpack_from(self._mm, pos)
            data = pos + META_BLOCK.size
            if n > end - data:
                raise RegionBoundsError(f"{where}: metadata block at {pos} ({n} bytes) runs past the section end {end}")
            if idx >= self._n:
                raise HeaderFormatError(f"{where}: metadata block at {pos} names sample {idx} of {self._n}")
            if not seen[idx]:  # TurboLoader's reader answers with a sample's first block
                seen[idx] = 1
                blocks[idx] = (data, n, typ)
            pos = data + n
        return blocks

    def _build_schema(self, where: str) -> None:
        tree: dict[str, Leaf] = {}
        if self._image_shape is not None:
            tree["image"] = Leaf("image", shape=self._image_shape)
        else:
            tree["data"] = Leaf("bytes")
            tree["format"] = Leaf("int")
        self._labels: list[int] | None = None
        if self._meta is not None:
            self._labels = self._json_labels()
            if self._labels is not None:
                tree["label"] = Leaf("int")
            tree["meta"] = Leaf("bytes")
        self.schema = Schema(tree)
        self.metadata = {"tbl_v2": {"version": V2_VERSION, "flags": self.flags}}

    def _json_labels(self) -> list[int] | None:
        """Every sample's "label" when every sample has a JSON metadata object with an int label; else None."""
        labels = []
        mm = self._mm
        for off, n, typ in self._meta or ():
            if typ != META_JSON:
                return None
            try:
                obj = json.loads(mm[off : off + n])
            except (ValueError, RecursionError):
                return None
            label = obj.get("label") if isinstance(obj, dict) else None
            if type(label) is not int or not -(2**63) <= label < 2**63:
                return None
            labels.append(label)
        return labels

    # ---- rows -----------------------------------------------------------------------------------
    def _entry(self, i: int) -> tuple[int, ...]:
        return ENTRY.unpack_from(self._mm, HEADER.size + i * ENTRY.size)

    def _payload(self, i: int) -> bytes:
        """Sample i's logical bytes (LZ4-decompressed when its entry is flagged compressed)."""
        off, sz, usize, *_rest, fl, _c = self._entry(i)
        raw = self._mm[off : off + sz]
        if not fl & SAMPLE_COMPRESSED:
            return raw
        lz4 = load_lz4_block()
        try:
            data = lz4.decompress(raw, uncompressed_size=usize)
        except Exception as exc:  # lz4.block.LZ4BlockError and friends
            raise CorruptDataError(f"{self.path}: sample {i}: LZ4 payload does not decompress: {exc}") from None
        if len(data) != usize:
            raise CorruptDataError(f"{self.path}: sample {i}: LZ4 payload has {len(data)} bytes, expected {usize}")
        return data

    def _image(self, i: int) -> Any:
        np = _numpy()
        shape = self._image_shape
        off, _sz, _u, *_rest, fl, _c = self._entry(i)
        if fl & SAMPLE_COMPRESSED:
            buf: Any = self._payload(i)
            offset = 0
        else:
            buf, offset = self._mm, off
        if np is not None:
            return np.frombuffer(buf, dtype=np.uint8, count=shape[0] * shape[1] * shape[2], offset=offset).reshape(shape)
        mv = memoryview(buf)
        return mv[offset : offset + shape[0] * shape[1] * shape[2]].cast("B", list(shape))

    def get(self, i: int) -> Any:
        n = self._n
        i = i.__index__()
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"row {i} out of range for {n} rows")
        if self._image_shape is not None:
            out: dict[str, Any] = {"image": self._image(i)}
        else:
            out = {"data": self._payload(i), "format": self._entry(i)[5]}
        if self._meta is not None:
            if self._labels is not None:
                out["label"] = self._labels[i]
            off, size, _t = self._meta[i]
            out["meta"] = self._mm[off : off + size]
        return out

    def column(self, leaf_path: str) -> Any:
        """(rows, *shape) view of a fixed-size leaf. "image" is zero-copy; "format" and "label" are small copies."""
        fixed_leaf(self.schema, leaf_path)
        if leaf_path not in self._views:
            self._views[leaf_path] = self._make_column(leaf_path)
        return self._views[leaf_path]

    def _make_column(self, leaf_path: str) -> Any:
        np = _numpy()
        if leaf_path == "image":
            if not self._zero_copy:
                why = "LZ4-compressed" if self._compressed else "not stored back to back in index order"
                raise V2LayoutError(
                    f"{self.path}: RAW_U8 payloads are {why}, so the image column cannot be a zero-copy view; "
                    "read rows with ds[i], or rewrite the file with tbl_format.write"
                )
            shape = (self._n, *self._image_shape)
            count = shape[0] * shape[1] * shape[2] * shape[3]
            if np is not None:
                return np.frombuffer(self._mm, dtype=np.uint8, count=count, offset=self._first).reshape(shape)
            return memoryview(self._mm)[self._first : self._first + count].cast("B", list(shape))
        if leaf_path == "format":
            values = [self._entry(i)[5] for i in range(self._n)]
        else:  # "label"
            values = list(self._labels or ())
        if np is not None:
            return np.array(values, dtype=np.int64)
        return memoryview(array.array("q", values))

    # ---- verification ---------------------------------------------------------------------------
    def verify(self, progress: Progress | None = None) -> None:
        """Check every sample's CRC-16 (when the file's HAS_CHECKSUMS flag is set) and that LZ4 payloads decode."""
        has_crc = bool(self.flags & FLAG_HAS_CHECKSUMS)
        entries = [self._entry(i) for i in range(self._n)]
        total = sum(e[1] for e in entries)
        done = 0
        for i, (_off, sz, _u, *_rest, fl, want) in enumerate(entries):
            if has_crc or fl & SAMPLE_COMPRESSED:
                data = self._payload(i)
                if has_crc and crc16(data) != want:
                    raise DataChecksumError(f"{self.path}: sample {i} fails its CRC-16")
            done += sz
            if progress is not None:
                progress(done, total)

    # ---- misc -----------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        stored = sum(self._entry(i)[1] for i in range(self._n))
        logical = sum(e[2] if e[6] & SAMPLE_COMPRESSED else e[1] for e in map(self._entry, range(self._n)))
        key = "image" if self._image_shape is not None else "data"
        columns = {key: {"stored_bytes": stored, "raw_bytes": logical}}
        if self._meta is not None:
            # "label" is parsed out of the metadata blocks and "format" out of the index: no bytes of their own.
            meta = sum(n for _off, n, _t in self._meta)
            columns["meta"] = {"stored_bytes": meta, "raw_bytes": meta}
        return {
            "format": "tbl v2 (TurboLoader)",
            "flags": self.flags,
            "zero_copy_images": self._zero_copy,
            "columns": columns,
        }

    def close(self) -> None:
        """Drop this file's map. Views handed out earlier keep the map alive until they are gone."""
        self._views = {}
        release_map(self._mm)
        self._mm = None

    def __repr__(self) -> str:
        return f"TurboLoaderFile({str(self.path)!r}, rows={self.rows})"
