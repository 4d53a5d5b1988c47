"""ChunkWriter: rows written at their slots, around the page cache or through it, give the same file."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tbl_loader.conversion import chunk_writer
from tbl_loader.conversion.chunk_writer import ALIGN, ChunkWriter


def _rows(n: int, row_bytes: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, row_bytes, dtype=np.uint8).tobytes() for _ in range(n)]


def _expected(size: int, base: int, row_bytes: int, rows: list[bytes | None]) -> bytes:
    out = bytearray(size)
    for i, row in enumerate(rows):
        if row is not None:
            out[base + i * row_bytes : base + (i + 1) * row_bytes] = row
    return bytes(out)


def _write(path: Path, base: int, row_bytes: int, chunk: int, rows: list[bytes | None], direct: bool) -> bool:
    """Write ``rows`` in chunks of ``chunk`` slots through one writer; returns whether direct I/O was used."""
    with open(path, "wb") as f:
        f.truncate(base + len(rows) * row_bytes + ALIGN)
    w = ChunkWriter(str(path), base, row_bytes, chunk, direct=direct)
    try:
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            w.begin(start, len(part))
            for k, row in enumerate(part):
                w.put(k, row)
            w.finish()
        return w.direct
    finally:
        w.close()


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of two blocks, so that small rows still go out in several direct writes per chunk."""
    monkeypatch.setattr(chunk_writer, "PIECE", 2 * ALIGN)


@pytest.fixture(scope="module")
def small_pieces_module() -> Iterator[None]:
    """`small_pieces` for a hypothesis test (one setting for all its examples)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunk_writer, "PIECE", 2 * ALIGN)
        yield


@settings(max_examples=40, deadline=None)
@given(
    base=st.sampled_from([0, ALIGN, 3 * ALIGN]),
    row_bytes=st.sampled_from([3, 1000, ALIGN - 1, ALIGN, ALIGN + 1, 76800, 3 * ALIGN + 7]),
    n=st.integers(0, 40),
    chunk=st.integers(1, 17),
    left_out=st.sets(st.integers(0, 39), max_size=6),
    seed=st.integers(0, 2**16),
)
def test_direct_and_page_cache_write_the_same_file(tmp_path_factory, small_pieces_module, base, row_bytes, n, chunk,
                                                   left_out, seed) -> None:
    tmp = tmp_path_factory.mktemp("cw")
    rows: list[bytes | None] = list(_rows(n, row_bytes, seed))
    for i in left_out:
        if i < n:
            rows[i] = None  # an image that failed: its slot is zeros
    want = _expected(base + n * row_bytes + ALIGN, base, row_bytes, rows)
    _write(tmp / "direct.bin", base, row_bytes, chunk, rows, direct=True)
    _write(tmp / "cached.bin", base, row_bytes, chunk, rows, direct=False)
    assert (tmp / "direct.bin").read_bytes() == want
    assert (tmp / "cached.bin").read_bytes() == want


def test_this_file_system_takes_direct_writes(tmp_path: Path) -> None:
    # Not a requirement (other file systems fall back), but on Linux's usual ones the fast path must be the one
    # the tests above exercise, not the fallback.
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    assert _write(tmp_path / "f.bin", 0, 76800, 64, list(_rows(64, 76800, 1)), direct=True)


def test_neighbouring_chunks_written_at_once_by_two_writers(tmp_path: Path, small_pieces) -> None:
    # Two workers: alternate chunks, concurrently; the blocks their chunks share go through the page cache.
    row_bytes, chunk, n = 5000, 7, 280  # 7 * 5000 is not a multiple of ALIGN: every chunk boundary splits a block
    rows = _rows(n, row_bytes, 7)
    path = tmp_path / "out.bin"
    with open(path, "wb") as f:
        f.truncate(n * row_bytes)
    writers = [ChunkWriter(str(path), 0, row_bytes, chunk) for _ in range(2)]
    errors: list[BaseException] = []

    def work(w: ChunkWriter, first_chunk: int) -> None:
        try:
            for start in range(first_chunk * chunk, n, 2 * chunk):
                part = rows[start : start + chunk]
                w.begin(start, len(part))
                for k, row in enumerate(part):
                    w.put(k, row)
                w.finish()
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w, i)) for i, w in enumerate(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        w.close()
    assert errors == []
    assert path.read_bytes() == b"".join(rows)


def test_a_file_system_refusing_direct_io_at_open_gets_the_page_cache(tmp_path: Path, monkeypatch) -> None:
    real_open = os.open

    def no_direct(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    rows = _rows(20, 76800, 2)
    assert not _write(tmp_path / "f.bin", ALIGN, 76800, 8, list(rows), direct=True)
    assert (tmp_path / "f.bin").read_bytes() == _expected(ALIGN + 20 * 76800 + ALIGN, ALIGN, 76800, list(rows))


def test_a_direct_write_refused_midway_is_written_through_the_page_cache(tmp_path: Path, monkeypatch,
                                                                         small_pieces) -> None:
    if not hasattr(os, "O_DIRECT"):
        pytest.skip("no O_DIRECT on this platform")
    real_pwrite = os.pwrite
    direct_fds: set[int] = set()
    calls = {"direct": 0}

    def refusing(fd, data, offset):
        if fd in direct_fds:
            calls["direct"] += 1
            if calls["direct"] == 3:  # two pieces went out direct; the third is refused
                raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    real_init = ChunkWriter.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        direct_fds.add(self.direct_fd)

    monkeypatch.setattr(os, "pwrite", refusing)
    monkeypatch.setattr(ChunkWriter, "__init__", init)
    rows = _rows(30, 9000, 3)
    used_direct = _write(tmp_path / "f.bin", 0, 9000, 10, list(rows), direct=True)
    assert calls["direct"] == 3 and not used_direct  # refused once, then the page cache for the rest
    assert (tmp_path / "f.bin").read_bytes() == _expected(30 * 9000 + ALIGN, 0, 9000, list(rows))


def test_a_failed_write_is_raised_by_finish_after_every_piece_is_done(tmp_path: Path, monkeypatch,
                                                                      small_pieces) -> None:
    real_pwrite = os.pwrite
    disk = {"full": True}
    after_failure: list[int] = []

    def full_disk(fd, data, offset):
        if disk["full"] and offset >= 5 * ALIGN:
            after_failure.append(offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", full_disk)
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(20 * 5000))
    w = ChunkWriter(str(path), 0, 5000, 20)
    try:
        w.begin(0, 20)
        for k, row in enumerate(_rows(20, 5000, 4)):
            w.put(k, row)
        with pytest.raises(OSError) as info:
            w.finish()
        assert info.value.errno == errno.ENOSPC
        assert len(after_failure) >= 2  # the pieces after the first failure were still tried, then waited for
        # Once space is back the same writer writes a chunk in full: nothing of the failed one is in flight.
        disk["full"] = False
        rows = _rows(20, 5000, 5)
        w.begin(0, 20)
        for k, row in enumerate(rows):
            w.put(k, row)
        w.finish()
    finally:
        w.close()
    assert path.read_bytes() == b"".join(rows)


def test_rows_out_of_order_or_of_the_wrong_size_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(4 * 100))
    w = ChunkWriter(str(path), 0, 100, 4)
    try:
        with pytest.raises(ValueError, match="at most 4"):
            w.begin(0, 5)
        w.begin(0, 2)
        with pytest.raises(ValueError, match="in order"):
            w.put(1, bytes(100))
        with pytest.raises(ValueError, match="99 bytes"):
            w.put(0, bytes(99))
        w.put(0, bytes(100))
        with pytest.raises(ValueError, match="after 1 of 2 rows"):
            w.finish()
    finally:
        w.close()


def test_chunks_of_huge_images_go_through_the_page_cache(tmp_path: Path) -> None:
    # A direct writer holds a chunk's buffer; past DIRECT_BUFFER_MAX (huge images) rows go one by one instead.
    row_bytes = 1024 * 1024 * 3
    rows = _rows(3, row_bytes, 6)
    max_rows = chunk_writer.DIRECT_BUFFER_MAX // row_bytes + 1
    path = tmp_path / "f.bin"
    with open(path, "wb") as f:
        f.truncate(3 * row_bytes)
    w = ChunkWriter(str(path), 0, row_bytes, max_rows)
    try:
        assert not w.direct
        w.begin(0, 3)
        for k, row in enumerate(rows):
            w.put(k, row)
        w.finish()
    finally:
        w.close()
    assert path.read_bytes() == b"".join(rows)


@pytest.mark.parametrize("direct", [True, False])
def test_rows_made_in_place_give_the_file_put_gives(tmp_path: Path, small_pieces, direct: bool) -> None:
    """fill: each row made in the writer's own buffer (or scratch row); a row not made leaves its slot zero."""
    base, row_bytes, chunk = 3 * ALIGN + 100, 2 * ALIGN + 7, 5
    rows: list[bytes | None] = list(_rows(12, row_bytes, 4))
    rows[3] = rows[7] = rows[9] = None  # 3: no row; 7: its maker gives up halfway; 9: its maker raises halfway
    path = tmp_path / "f.bin"
    size = base + len(rows) * row_bytes + ALIGN
    path.write_bytes(bytes(size))

    def make(i: int, view: memoryview) -> int | None:
        if i in (7, 9):
            view[: row_bytes // 2] = b"\xff" * (row_bytes // 2)  # written into the row, then no row after all
            if i == 9:
                raise ValueError("a maker's own failure")
        if rows[i] is None:
            return None
        np.frombuffer(view, np.uint8)[:] = np.frombuffer(rows[i], np.uint8)  # an array over the row, gone on return
        return len(view)

    w = ChunkWriter(str(path), base, row_bytes, chunk, direct=direct)
    try:
        for start in range(0, len(rows), chunk):
            w.begin(start, min(chunk, len(rows) - start))
            for i in range(start, min(start + chunk, len(rows))):
                try:
                    assert w.fill(i - start, lambda view, i=i: make(i, view)) == (None if rows[i] is None else row_bytes)
                except ValueError:
                    w.put(i - start, None)  # nothing was counted: the slot is put as left out
            w.finish()
    finally:
        w.close()
    assert path.read_bytes() == _expected(size, base, row_bytes, rows)


def test_a_failed_write_of_a_row_made_in_place_raises(tmp_path: Path, monkeypatch) -> None:
    """Page cache only: fill writes the row at once, and a full disk raises out of fill (not taken for the maker's)."""
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(300))
    w = ChunkWriter(str(path), 0, 100, 3, direct=False)

    def full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(chunk_writer.os, "pwrite", full)
    try:
        w.begin(0, 3)
        with pytest.raises(OSError, match="No space left"):
            w.fill(0, lambda view: view.__setitem__(slice(None), b"\x01" * 100) or 1)
    finally:
        monkeypatch.undo()
        w.close()
