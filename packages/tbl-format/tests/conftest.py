"""Shared fixtures.

``hdr`` rewrites a .tbl header with a valid CRC so that tests reach the rules
behind the header check; ``numpy_mode`` runs a test with and without numpy
visible to the reader. Helpers are fixtures rather than importable functions
so that the tests run under any pytest import mode.
"""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest

from tbl_format.layout import PREAMBLE, PREAMBLE_CRC_SPAN, PREAMBLE_SIZE


class HeaderTools:
    @staticmethod
    def read(path: Path) -> dict:
        raw = path.read_bytes()
        hlen = PREAMBLE.unpack_from(raw, 0)[3]
        return json.loads(raw[PREAMBLE_SIZE : PREAMBLE_SIZE + hlen])

    @staticmethod
    def rewrite(path: Path, header: dict) -> None:
        """Replace the header JSON in place (it must fit before the first region) and fix up the CRC."""
        raw = bytearray(path.read_bytes())
        magic, major, minor, hlen, fsize, _crc, res = PREAMBLE.unpack_from(raw, 0)
        text = json.dumps(header, separators=(",", ":")).encode()
        regions = [r["offset"] for c in header["columns"] for r in c["regions"].values()]
        assert PREAMBLE_SIZE + len(text) <= min([*regions, header["checksums"]["offset"]]), "header too long"
        raw[PREAMBLE_SIZE : PREAMBLE_SIZE + max(hlen, len(text))] = text.ljust(max(hlen, len(text)), b" ")
        pre = PREAMBLE.pack(magic, major, minor, len(text), fsize, 0, res)
        crc = zlib.crc32(text, zlib.crc32(pre[:PREAMBLE_CRC_SPAN]))
        raw[:PREAMBLE_SIZE] = PREAMBLE.pack(magic, major, minor, len(text), fsize, crc, res)
        path.write_bytes(bytes(raw))

    @staticmethod
    def patch_u64(path: Path, offset: int, value: int) -> None:
        raw = bytearray(path.read_bytes())
        struct.pack_into("<Q", raw, offset, value)
        path.write_bytes(bytes(raw))

    @classmethod
    def region(cls, path: Path, leaf: str, name: str) -> dict:
        col = next(c for c in cls.read(path)["columns"] if c["path"] == leaf)
        return col["regions"][name]

    @classmethod
    def refresh_table_crc(cls, path: Path, header: dict, leaf: str, name: str) -> None:
        """Recompute the crc32 of a table region after its bytes were patched, then rewrite the header."""
        region = next(c for c in header["columns"] if c["path"] == leaf)["regions"][name]
        raw = path.read_bytes()
        region["crc32"] = zlib.crc32(raw[region["offset"] : region["offset"] + region["size"]])
        cls.rewrite(path, header)


@pytest.fixture
def hdr() -> type[HeaderTools]:
    return HeaderTools


@pytest.fixture(params=["numpy", "no-numpy"])
def numpy_mode(request, monkeypatch):
    """Run a test with the reader seeing numpy, and again as if numpy were not installed."""
    import tbl_format.reader as reader

    if request.param == "numpy":
        pytest.importorskip("numpy")
    else:
        monkeypatch.setattr(reader, "_numpy", lambda: None)
    return request.param
