"""Byte-level constants of the .tbl layout (SPEC.md, "File layout")."""

from __future__ import annotations

import struct

MAGIC = b"\x89TBL\r\n\x1a\n"
#: (major, minor) this version reads and writes at most. A file declares the lowest minor that has
#: the leaf kinds and fields it uses (SPEC.md, "Version and stability").
FORMAT_VERSION = (1, 1)
#: magic, major u16, minor u16, header_len u32, file_size u64, header_crc32 u32, reserved u32.
PREAMBLE = struct.Struct("<8sHHIQII")
PREAMBLE_SIZE = PREAMBLE.size  # 32
#: Bytes of the preamble covered by header_crc32 (everything before the CRC field).
PREAMBLE_CRC_SPAN = 24
HEADER_CAP = 16 * 1024 * 1024
ALIGN = 4096
BLOCK_SIZE = 1 << 20
#: Logical bytes per compressed heap block, for every codec: a random read decodes at most this much per
#: range it touches (SPEC.md, "Columns").
HEAP_BLOCK = 64 * 1024
MAX_U64 = (1 << 64) - 1
#: The manifest of a dataset directory (SPEC.md, "Datasets of several files").
MANIFEST_NAME = "manifest.json"


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a
