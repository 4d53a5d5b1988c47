"""tbl_format.crc: the same CRC-32 as zlib, whichever implementation is installed."""

from __future__ import annotations

import importlib.util
import mmap
import os
import zlib

from hypothesis import given
from hypothesis import strategies as st

from tbl_format.crc import IMPLEMENTATION, _combine_through_zeros, crc32, crc32_combine


def test_the_implementation_is_isal_exactly_when_it_is_installed() -> None:
    assert IMPLEMENTATION == ("isal" if importlib.util.find_spec("isal") is not None else "zlib")


@given(st.binary(max_size=3000), st.integers(0, 0xFFFFFFFF), st.integers(0, 3000))
def test_same_values_as_zlib_chained_and_on_slices(data: bytes, start: int, cut: int) -> None:
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data, start) == zlib.crc32(data, start)
    cut = min(cut, len(data))
    view = memoryview(data)
    assert crc32(view[cut:], crc32(view[:cut])) == zlib.crc32(data)


def test_same_values_on_large_buffers_and_memory_maps(tmp_path) -> None:
    data = os.urandom((3 << 20) + 7)  # past any SIMD block and the sizes where the GIL is released
    path = tmp_path / "f"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm, memoryview(mm) as view:
        assert crc32(view) == zlib.crc32(data)
        assert crc32(view[5 : 1 << 20], 12345) == zlib.crc32(data[5 : 1 << 20], 12345)


@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_combine_gives_the_crc_of_the_concatenation(a: bytes, b: bytes) -> None:
    want = zlib.crc32(a + b)
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == want
    assert _combine_through_zeros(zlib.crc32(a), zlib.crc32(b), len(b)) == want  # the fallback, wherever isal is
