"""Regenerate the golden files of this directory and expected.json, deterministically.

    python packages/tbl-format/tests/golden/make_golden.py

Native files are written by ``tbl_format.write`` and then damaged byte-wise,
one rule per file. TBL v2 files are written by ``write_v2`` below, a small
writer that follows the byte layout documented in SPEC.md ("TBL v2 files"),
independent of TurboLoader; tests/test_v2_turboloader.py checks that it
produces the same bytes as TurboLoader's own writer.

expected.json lists, per file, what ``tbl_format.open(file)`` followed by
reading every row and ``verify()`` must do: ``{"outcome": "ok"}`` or
``{"outcome": "error", "stage": "open" | "read" | "verify", "error": <FormatError
subclass name>}``, plus ``"requires"`` (Python packages needed to read it) and
``"rows"`` for valid files.
"""

from __future__ import annotations

import json
import struct
import sys
import tempfile
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ---- TBL v2 writer (layout: SPEC.md, "TBL v2 files") -------------------------------------------

V2_HEADER = struct.Struct("<4sIQIIQQII16s")
V2_ENTRY = struct.Struct("<QIIHHBBH")
V2_META = struct.Struct("<QIHH")
V2_FLAG_COMPRESSED, V2_FLAG_HAS_METADATA, V2_FLAG_HAS_CHECKSUMS = 1, 2, 4
V2_SAMPLE_COMPRESSED, V2_SAMPLE_HAS_METADATA = 1, 2
JPEG, PNG, RAW_U8 = 1, 2, 8
META_JSON, META_CUSTOM = 1, 255


def _crc16(data: bytes) -> int:
    crc = 0xFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0xA001 if crc & 1 else crc >> 1
    return crc


def v2_bytes(
    samples: list[tuple[bytes, int, int, int]],
    *,
    compress: bool = False,
    metadata: list[tuple[int, bytes, int]] = (),
) -> bytes:
    """A TBL v2 file. samples: (payload, format, width, height); metadata: (sample index, payload, type) in order.

    With compress, a payload is stored as an LZ4 block when that is shorter than the payload itself.
    """
    n = len(samples)
    pos = V2_HEADER.size + n * V2_ENTRY.size
    has_meta = {i for i, _, _ in metadata}
    index, data = [], []
    for i, (payload, fmt, w, h) in enumerate(samples):
        stored, flags = payload, 0
        if compress:
            import lz4.block

            packed = lz4.block.compress(payload, store_size=False)
            if len(packed) < len(payload):
                stored, flags = packed, V2_SAMPLE_COMPRESSED
        if i in has_meta:
            flags |= V2_SAMPLE_HAS_METADATA
        index.append(V2_ENTRY.pack(pos, len(stored), len(payload), w, h, fmt, flags, _crc16(payload)))
        data.append(stored)
        pos += len(stored)
    meta = b"".join(V2_META.pack(i, len(m), t, 0) + m for i, m, t in metadata)
    flags = V2_FLAG_HAS_CHECKSUMS | (V2_FLAG_COMPRESSED if compress else 0) | (V2_FLAG_HAS_METADATA if meta else 0)
    meta_off = pos if meta else 0
    head = V2_HEADER.pack(b"TBL\x02", 2, n, V2_HEADER.size + n * V2_ENTRY.size, 0, meta_off, len(meta), flags, 0, bytes(16))
    head = head[:44] + struct.pack("<I", zlib.crc32(head)) + head[48:]
    return head + b"".join(index) + b"".join(data) + meta


def v2_refresh_crc(raw: bytes | bytearray) -> bytes:
    """The same v2 file with its header CRC-32 recomputed (so a damaged field reaches the rule behind it)."""
    raw = bytearray(raw)
    raw[44:48] = bytes(4)
    raw[44:48] = struct.pack("<I", zlib.crc32(raw[:64]))
    return bytes(raw)


def raw_images(n: int, h: int, w: int, seed: int) -> list[bytes]:
    """n deterministic HWC uint8 images (a linear congruential byte stream: no numpy needed)."""
    x = seed
    out = []
    for _ in range(n):
        b = bytearray(h * w * 3)
        for k in range(len(b)):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
            b[k] = x >> 16 & 0xFF
        out.append(bytes(b))
    return out


# ---- native damage helpers ----------------------------------------------------------------------

PREAMBLE = struct.Struct("<8sHHIQII")


def native_header(raw: bytes) -> dict:
    hlen = PREAMBLE.unpack_from(raw, 0)[3]
    return json.loads(raw[32 : 32 + hlen])


def native_refresh_crc(raw: bytes | bytearray) -> bytes:
    """Recompute the preamble + header CRC-32 of a native file."""
    raw = bytearray(raw)
    hlen = PREAMBLE.unpack_from(raw, 0)[3]
    raw[24:28] = struct.pack("<I", zlib.crc32(bytes(raw[32 : 32 + hlen]), zlib.crc32(bytes(raw[:24]))))
    return bytes(raw)


def native_with_header(raw: bytes, header: dict) -> bytes:
    """Replace the header JSON (it must still end before the first region at 4096) and fix the length and CRC."""
    raw = bytearray(raw)
    hlen = PREAMBLE.unpack_from(raw, 0)[3]
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    if 32 + len(text) > 4096:
        raise ValueError("new header does not fit before the first region")
    raw[32 : 32 + max(hlen, len(text))] = text.ljust(max(hlen, len(text)), b" ")
    struct.pack_into("<I", raw, 12, len(text))
    return native_refresh_crc(raw)


def flip(raw: bytes, pos: int, mask: int = 0x01) -> bytes:
    b = bytearray(raw)
    b[pos] ^= mask
    return bytes(b)


def put(raw: bytes, pos: int, fmt: str, value: int) -> bytes:
    b = bytearray(raw)
    struct.pack_into(fmt, b, pos, value)
    return bytes(b)


# ---- the golden set -----------------------------------------------------------------------------


def native_files(tmp: Path) -> dict[str, bytes]:
    import tbl_format as tf

    rich = [{"i": i * 7 - 3, "s": ["", "a", "bé", "ok\u2603"][i], "v": (i / 2, -i / 4)} for i in range(4)]
    schema = tf.Schema({"i": tf.Leaf("int"), "s": tf.Leaf("str"), "v": tf.Leaf("array", dtype="float32", shape=(2,))})
    w = tf.Writer(tmp / "rich.tbl", schema, metadata={"class_names": ["a", "b"]})
    for r in rich:
        # float32 pairs without numpy: the writer takes any buffer with the right format and shape
        import array

        w.write({"i": r["i"], "s": r["s"], "v": memoryview(array.array("f", r["v"]))})
    w.close()
    base = tf.write([{"s": s} for s in ["alpha", "bé", "", "gamma"]], tmp / "base.tbl")
    rich_raw, raw = (tmp / "rich.tbl").read_bytes(), base.read_bytes()
    header = native_header(raw)
    hlen = PREAMBLE.unpack_from(raw, 0)[3]
    regions = header["columns"][0]["regions"]
    offsets, heap = regions["offsets"], regions["heap"]
    schema_at = raw.index(b'"schema"', 32)

    # Format 1.1 leaf kinds: lists of any length, optional leaves, a leaf that is always None.
    v11_rows = [{"tags": None if i == 2 else ["a", "bé"][: i % 3], "o": None if i % 2 else i, "none": None}
                for i in range(4)]
    v11 = tf.write(v11_rows, tmp / "v11.tbl").read_bytes()
    v11_items = native_header(v11)["columns"][0]["regions"]["items"]
    future = json.loads(json.dumps(header))
    future["schema"]["dict"][0][1]["leaf"]["kind"] = "tensor"  # a leaf kind from a later minor
    later = json.loads(json.dumps(header))
    later["added_in_a_later_minor"] = {"ignored": True}  # a header key this reader does not know

    beyond = json.loads(json.dumps(header))
    beyond["columns"][0]["regions"]["heap"]["offset"] = 1 << 40
    wrap = json.loads(json.dumps(header))
    wrap["columns"][0]["regions"]["heap"]["offset"] = (1 << 64) - 4096
    wrap["columns"][0]["regions"]["heap"]["size"] = 8192

    # A token dataset (SPEC.md section 9) of 9 tokens in rows of 4 whose document index is not increasing
    # (row 1 lists 3, then 2). Its blocks are intact: only verify's document index check finds it. (The same
    # file with the starts [[0], [3], [0]] is valid; it is not committed, to keep the directory small.)
    import array

    token_schema = tf.Schema({"tokens": tf.Leaf("array", dtype="uint16", shape=(4,)), "length": tf.Leaf("int"),
                              "starts": tf.Leaf("var_list", item="int")})
    token_meta = {"tokens": {"chunk": 4, "dtype": "uint16", "eos": 9, "loss_mask": False}}

    def token_file(name: str, starts: list[list[int]]) -> bytes:
        rows = [([1, 2, 3, 4], 4), ([5, 6, 9, 7], 4), ([9, 0, 0, 0], 1)]
        w = tf.Writer(tmp / name, token_schema, metadata=token_meta)
        for (ids, length), row_starts in zip(rows, starts, strict=True):
            w.write({"tokens": memoryview(array.array("H", ids)), "length": length, "starts": row_starts})
        w.close()
        return (tmp / name).read_bytes()

    # A zstd-compressed heap (SPEC.md, "Columns"): one str leaf, one frame (one leaf keeps the file at 20 KiB).
    zstd_rows = [{"s": ["", "zstd", "bé" * 40, "ok\u2603"][i]} for i in range(4)]
    zstd_file = tf.write(zstd_rows, tmp / "zstd.tbl", compression="zstd").read_bytes()
    zstd_heap = native_header(zstd_file)["columns"][0]["regions"]["heap"]

    return {
        "native_valid_zstd.tbl": zstd_file,
        # A byte of the frame's compressed data flipped: the frame's checksum fails as the row is read.
        "native_zstd_corrupt.tbl": flip(zstd_file, zstd_heap["offset"] + zstd_heap["size"] - 8, 0x04),
        "native_tokens_index_order.tbl": token_file("tokens_bad.tbl", [[0], [3, 2], [0]]),
        "native_valid.tbl": rich_raw,
        "native_valid_small.tbl": raw,
        "native_bad_magic.tbl": b"\x89TBX" + raw[4:],
        "native_unknown_major.tbl": native_refresh_crc(put(raw, 8, "<H", 2)),
        "native_header_crc.tbl": flip(raw, 32 + hlen // 2, 0x20),
        "native_schema_crc.tbl": flip(raw, schema_at + 12, 0x01),
        "native_offsets_crc.tbl": flip(raw, offsets["offset"] + 8, 0x01),
        "native_truncated.tbl": raw[: heap["offset"] + 2],
        "native_offset_beyond_eof.tbl": native_with_header(raw, beyond),
        "native_offset_u64_wrap.tbl": native_with_header(raw, wrap),
        "native_header_over_cap.tbl": put(raw, 12, "<I", 16 * 1024 * 1024 + 1),
        "native_data_checksum.tbl": flip(raw, heap["offset"] + 1, 0x01),
        "native_valid_v11.tbl": v11,
        "native_v11_items_crc.tbl": flip(v11, v11_items["offset"] + 8, 0x01),
        "native_later_minor_unknown_kind.tbl": native_with_header(put(raw, 10, "<H", 7), future),
        "native_later_minor_known_kinds.tbl": native_with_header(put(raw, 10, "<H", 7), later),
    }


def v2_files() -> dict[str, bytes]:
    imgs = raw_images(3, 4, 5, seed=7)
    raw_samples = [(im, RAW_U8, 5, 4) for im in imgs]
    labels = [(i, json.dumps({"label": i * 3 + 1}).encode(), META_JSON) for i in range(3)]
    valid_raw = v2_bytes(raw_samples, metadata=labels)
    mixed = [(b"\xff\xd8\xff" + b"jpeg-ish " * 9, JPEG, 9, 9), (b"\x89PNG\r\n", PNG, 2, 3), (b"", JPEG, 0, 0)]
    valid_mixed = v2_bytes(mixed, metadata=[(1, b"\x00\x01custom", META_CUSTOM), (1, b"second", META_JSON)])
    valid_lz4 = v2_bytes([(b"abc" * 40, JPEG, 0, 0), (b"xyz", PNG, 0, 0), (bytes(60), RAW_U8, 5, 4)], compress=True)
    gapped = bytearray(v2_bytes(raw_samples))
    # Move sample 2's payload one byte later (a gap before it): still valid, no longer a zero-copy column.
    first2 = struct.unpack_from("<Q", gapped, 64 + 2 * 24)[0]
    gapped[first2:first2] = b"\x00"
    struct.pack_into("<Q", gapped, 64 + 2 * 24, first2 + 1)
    e0 = 64  # entry 0

    return {
        "v2_valid_raw.tbl": valid_raw,
        "v2_valid_mixed.tbl": valid_mixed,
        "v2_valid_lz4.tbl": valid_lz4,
        "v2_valid_gapped.tbl": v2_refresh_crc(gapped),
        "v2_valid_empty.tbl": v2_bytes([]),
        "v2_header_crc.tbl": flip(valid_raw, 8, 0x02),
        "v2_unknown_version.tbl": v2_refresh_crc(put(valid_raw, 4, "<I", 3)),
        "v2_truncated_index.tbl": valid_raw[: 64 + 24 * 2],
        "v2_header_size.tbl": v2_refresh_crc(put(valid_raw, 16, "<I", 64 + 24 * 3 + 8)),
        "v2_offset_beyond_eof.tbl": put(valid_raw, e0, "<Q", len(valid_raw) - 10),
        "v2_offset_u64_wrap.tbl": put(valid_raw, e0, "<Q", (1 << 64) - 8),
        "v2_offset_into_index.tbl": put(valid_raw, e0, "<Q", 40),
        "v2_raw_size_mismatch.tbl": put(valid_raw, e0 + 16, "<H", 6),
        "v2_unknown_sample_flags.tbl": put(valid_raw, e0 + 21, "<B", 0x80),
        "v2_lz4_ratio.tbl": put(valid_lz4, e0 + 12, "<I", 0xFFFFFFFF),
        "v2_metadata_beyond_eof.tbl": v2_refresh_crc(put(valid_raw, 32, "<Q", 1 << 20)),
        "v2_metadata_bad_sample.tbl": put(valid_raw, len(valid_raw) - (16 + len(labels[2][1])), "<Q", 3),
        "v2_sample_checksum.tbl": flip(valid_raw, 64 + 3 * 24 + 5, 0x10),
        # The first sequence is a token, 3 literals and a 2-byte match offset: point it before the output start.
        "v2_lz4_corrupt.tbl": put(valid_lz4, 64 + 3 * 24 + 4, "<H", 0xFFFF),
    }


EXPECTED: dict[str, dict] = {
    "native_valid.tbl": {"outcome": "ok", "rows": 4},
    "native_valid_small.tbl": {"outcome": "ok", "rows": 4},
    "native_bad_magic.tbl": {"outcome": "error", "stage": "open", "error": "BadMagicError"},
    "native_unknown_major.tbl": {"outcome": "error", "stage": "open", "error": "UnsupportedVersionError"},
    "native_header_crc.tbl": {"outcome": "error", "stage": "open", "error": "HeaderChecksumError"},
    # The schema is part of the header JSON, so a damaged schema is caught by the header CRC-32.
    "native_schema_crc.tbl": {"outcome": "error", "stage": "open", "error": "HeaderChecksumError"},
    "native_offsets_crc.tbl": {"outcome": "error", "stage": "open", "error": "TableChecksumError"},
    "native_truncated.tbl": {"outcome": "error", "stage": "open", "error": "TruncatedFileError"},
    "native_offset_beyond_eof.tbl": {"outcome": "error", "stage": "open", "error": "RegionBoundsError"},
    "native_offset_u64_wrap.tbl": {"outcome": "error", "stage": "open", "error": "RegionBoundsError"},
    "native_header_over_cap.tbl": {"outcome": "error", "stage": "open", "error": "HeaderTooLargeError"},
    "native_data_checksum.tbl": {"outcome": "error", "stage": "verify", "error": "DataChecksumError"},
    "native_valid_v11.tbl": {"outcome": "ok", "rows": 4},
    "native_valid_zstd.tbl": {"outcome": "ok", "rows": 4, "requires": ["zstandard"]},
    "native_zstd_corrupt.tbl": {"outcome": "error", "stage": "read", "error": "CorruptDataError",
                                "requires": ["zstandard"]},
    "native_tokens_index_order.tbl": {"outcome": "error", "stage": "verify", "error": "DocumentIndexError"},
    "native_v11_items_crc.tbl": {"outcome": "error", "stage": "open", "error": "TableChecksumError"},
    # A later minor's unknown leaf kind is refused as a version this reader cannot read, never guessed at;
    "native_later_minor_unknown_kind.tbl": {"outcome": "error", "stage": "open", "error": "UnsupportedVersionError"},
    # a later minor whose schema uses only known kinds reads, its unknown header keys ignored.
    "native_later_minor_known_kinds.tbl": {"outcome": "ok", "rows": 4},
    "v2_valid_raw.tbl": {"outcome": "ok", "rows": 3},
    "v2_valid_mixed.tbl": {"outcome": "ok", "rows": 3},
    "v2_valid_lz4.tbl": {"outcome": "ok", "rows": 3, "requires": ["lz4"]},
    "v2_valid_gapped.tbl": {"outcome": "ok", "rows": 3},
    "v2_valid_empty.tbl": {"outcome": "ok", "rows": 0},
    "v2_header_crc.tbl": {"outcome": "error", "stage": "open", "error": "HeaderChecksumError"},
    "v2_unknown_version.tbl": {"outcome": "error", "stage": "open", "error": "UnsupportedVersionError"},
    "v2_truncated_index.tbl": {"outcome": "error", "stage": "open", "error": "TruncatedFileError"},
    "v2_header_size.tbl": {"outcome": "error", "stage": "open", "error": "HeaderFormatError"},
    "v2_offset_beyond_eof.tbl": {"outcome": "error", "stage": "open", "error": "RegionBoundsError"},
    "v2_offset_u64_wrap.tbl": {"outcome": "error", "stage": "open", "error": "RegionBoundsError"},
    "v2_offset_into_index.tbl": {"outcome": "error", "stage": "open", "error": "RegionBoundsError"},
    "v2_raw_size_mismatch.tbl": {"outcome": "error", "stage": "open", "error": "RegionBoundsError"},
    "v2_unknown_sample_flags.tbl": {"outcome": "error", "stage": "open", "error": "HeaderFormatError"},
    "v2_lz4_ratio.tbl": {"outcome": "error", "stage": "open", "error": "HeaderFormatError"},
    "v2_metadata_beyond_eof.tbl": {"outcome": "error", "stage": "open", "error": "RegionBoundsError"},
    "v2_metadata_bad_sample.tbl": {"outcome": "error", "stage": "open", "error": "HeaderFormatError"},
    "v2_sample_checksum.tbl": {"outcome": "error", "stage": "verify", "error": "DataChecksumError"},
    "v2_lz4_corrupt.tbl": {"outcome": "error", "stage": "read", "error": "CorruptDataError", "requires": ["lz4"]},
}


def build() -> dict[str, bytes]:
    with tempfile.TemporaryDirectory() as tmp:
        files = native_files(Path(tmp))
    files.update(v2_files())
    if set(files) != set(EXPECTED):
        raise SystemExit(f"files and expectations differ: {sorted(set(files) ^ set(EXPECTED))}")
    return files


def main() -> int:
    files = build()
    for old in HERE.glob("*.tbl"):
        if old.name not in files:
            old.unlink()
    for name, data in files.items():
        (HERE / name).write_bytes(data)
    (HERE / "expected.json").write_text(json.dumps(EXPECTED, indent=1, sort_keys=True) + "\n")
    total = sum(len(d) for d in files.values())
    print(f"wrote {len(files)} files, {total} bytes, to {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
