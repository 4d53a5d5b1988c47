"""The TAR listing's fast path (plain ustar / GNU headers read directly) lists exactly what tarfile lists."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tbl_loader.conversion.sources import (
    _OCTAL_FIELD,
    _plain_numbers,
    _scan_plain_tar,
    _scan_tar,
    _scan_tar_with_tarfile,
)
from tbl_loader.errors import SourceError


def add(tf: tarfile.TarFile, name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE, link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    info.size = len(data) if kind in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE) else 0
    tf.addfile(info, io.BytesIO(data) if info.size else None)


def build(path: Path, fmt: int, long_names: bool) -> Path:
    with tarfile.open(path, "w", format=fmt) as tf:
        add(tf, "n01/", kind=tarfile.DIRTYPE)
        add(tf, "n01/a.JPEG", b"A" * 700)
        add(tf, "./n01/b.jpg", b"B" * 512)
        add(tf, "n02/c.png", b"")
        add(tf, "n02/.hidden.jpg", b"h")
        add(tf, "n02/notes.txt", b"t")
        add(tf, "n02/link.jpg", kind=tarfile.SYMTYPE, link="../n01/a.JPEG")
        add(tf, "n02/hard.jpg", kind=tarfile.LNKTYPE, link="n01/a.JPEG")
        add(tf, "n02/pipe.jpg", kind=tarfile.FIFOTYPE)
        add(tf, "n02/cont.jpg", b"C" * 3, kind=tarfile.CONTTYPE)
        add(tf, "n03/caf\u00e9.jpg", b"e" * 10)
        add(tf, "n01/a.JPEG", b"second copy wins")
        if long_names:
            add(tf, "n04/" + "d" * 60 + "/" + "f" * 80 + ".jpg", b"L" * 5)  # ustar prefix, GNU or pax record
    return path


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("long_names", [False, True])
def test_same_listing_as_tarfile(tmp_path: Path, fmt: int, long_names: bool) -> None:
    tar = build(tmp_path / "t.tar", fmt, long_names)
    assert _scan_tar(tar) == _scan_tar_with_tarfile(tar)
    names, locators, ignored = _scan_tar(tar)
    assert "n01/a.JPEG" in names and "n01/b.jpg" in names and "n02/cont.jpg" in names
    assert {"n02/link.jpg", "n02/hard.jpg", "n02/pipe.jpg", "n02/notes.txt", "n02/.hidden.jpg"} <= set(ignored)
    data = tar.read_bytes()
    off, size = locators[names.index("n01/a.JPEG")]
    assert data[off : off + size] == b"second copy wins"
    fd = os.open(tar, os.O_RDONLY)
    try:
        plain = _scan_plain_tar(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
    # The fast path reads these itself; names in GNU long-name or pax records (a long name, or in a pax TAR
    # a non-ASCII one) are left to tarfile.
    assert (plain is None) == (fmt == tarfile.PAX_FORMAT or (long_names and fmt == tarfile.GNU_FORMAT))


def test_damaged_tars_take_tarfiles_reading(tmp_path: Path) -> None:
    tar = build(tmp_path / "t.tar", tarfile.USTAR_FORMAT, True)
    data = tar.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:1200])  # inside the first image's data
    with pytest.raises(SourceError, match="not a readable TAR"):
        _scan_tar_with_tarfile(cut)
    with pytest.raises(SourceError, match="not a readable TAR"):
        _scan_tar(cut)
    bad = bytearray(data)
    bad[1024 + 2048] ^= 0xFF  # a byte of a later header: its checksum fails
    (tmp_path / "bad.tar").write_bytes(bytes(bad))
    assert _scan_tar(tmp_path / "bad.tar") == _scan_tar_with_tarfile(tmp_path / "bad.tar")
    (tmp_path / "zeros.tar").write_bytes(bytes(10240))
    assert _scan_tar(tmp_path / "zeros.tar") == _scan_tar_with_tarfile(tmp_path / "zeros.tar") == ([], [], [])


def _listing_or_error(scan, path: Path) -> object:
    try:
        return scan(path)
    except SourceError as e:
        return type(e)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT]),
       flips=st.lists(st.tuples(st.integers(0, 4 * 512 + 1023), st.integers(1, 255)), min_size=1, max_size=3))
# The checksum unchanged ('n' -> 'f' in the name, '0' -> '8' in the mode): tarfile refuses the mode field.
@example(fmt=tarfile.USTAR_FORMAT, flips=[(0, 8), (100, 8)])
def test_damaged_headers_list_as_tarfile_lists_them(tmp_path: Path, fmt: int, flips: list[tuple[int, int]]) -> None:
    """Bytes changed in and around the first headers: the fast path lists what tarfile lists, or steps aside."""
    data = bytearray(build(tmp_path / "t.tar", fmt, False).read_bytes())
    for at, mask in flips:
        data[at] ^= mask
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(bytes(data))
    assert _listing_or_error(_scan_tar, damaged) == _listing_or_error(_scan_tar_with_tarfile, damaged)


_FIELD_BYTES = st.sampled_from(b"01234567 \t\x00\x80\xff89+-_xo\x1c")


@settings(max_examples=2000, deadline=None)
@given(fields=st.lists(st.binary(min_size=8, max_size=8) | st.lists(_FIELD_BYTES, min_size=8, max_size=8).map(bytes),
                       min_size=1, max_size=4))
def test_plain_numbers_are_the_octal_fields_tarfile_reads(fields: list[bytes]) -> None:
    """A header's number fields pass only where each is base-256 or an `_OCTAL_FIELD`, and tarfile reads those."""
    plain = [f[0] in (0x80, 0xFF) or _OCTAL_FIELD.fullmatch(f) is not None for f in fields]
    assert _plain_numbers(np.frombuffer(b"".join(fields), np.uint8).reshape(len(fields), 8).T) == all(plain)
    for field, ok in zip(fields, plain, strict=True):
        if ok:
            tarfile.nti(field)  # raises InvalidHeaderError where tarfile refuses the field
