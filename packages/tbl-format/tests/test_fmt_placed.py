"""PlacedWriter: rows written in place by others; the file equals the streaming Writer's file byte for byte."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest

import tbl_format
from tbl_format import Leaf, PlacedWriter, Schema, SchemaMismatchError, row_crcs

np = pytest.importorskip("numpy")


def image_schema(side: int, label_first: bool = False) -> Schema:
    image = Leaf("image", shape=(side, side, 3))
    label = Leaf("int")
    return Schema({"label": label, "image": image} if label_first else {"image": image, "label": label})


def streamed(path: Path, schema: Schema, images: np.ndarray, kept: list[int], metadata: dict) -> bytes:
    with tbl_format.Writer(path, schema, metadata=metadata) as w:
        for i in kept:
            w.write({key: images[i] if key == "image" else i for key in schema.tree})
    return path.read_bytes()


def placed(path: Path, schema: Schema, images: np.ndarray, kept: list[int], metadata: dict,
           capacity: int | None = None, with_crcs: bool = False) -> tuple[bytes, int]:
    """The file PlacedWriter writes when every slot is written from another descriptor and ``kept`` committed
    (with the writer's `row_crcs` when ``with_crcs``); also the staging offset of slot 0."""
    with PlacedWriter(path, schema, placed="image", capacity=capacity or len(images), metadata=metadata) as w:
        assert Path(w.path).name.startswith(".") and ".tbl-tmp-" in w.path
        fd = os.open(w.path, os.O_WRONLY)
        try:
            for i in range(len(images)):
                os.pwrite(fd, images[i].tobytes(), w.offset(i))
        finally:
            os.close(fd)
        for i in kept:
            w.commit(i, {"label": i}, row_crcs(i, images[i].tobytes()) if with_crcs else None)
        base = w.offset(0) if w.capacity else -1
    return path.read_bytes(), base


def image_offset(data: bytes) -> int:
    (header_len,) = struct.unpack_from("<I", data, 12)
    header = json.loads(data[32 : 32 + header_len])
    return next(c for c in header["columns"] if c["path"] == "image")["regions"]["data"]["offset"]


@pytest.mark.parametrize("with_crcs", [False, True])
@pytest.mark.parametrize("skip", [(), (0,), (3, 4, 50), (299,), (1, 298, 299)])
@pytest.mark.parametrize("side", [20, 300])  # rows of 1,200 B (many per CRC block) and 270,000 B (blocks inside rows)
def test_same_bytes_as_the_streaming_writer(tmp_path: Path, skip: tuple[int, ...], side: int,
                                            with_crcs: bool) -> None:
    n = 300 if side == 20 else 12
    skip = tuple(s for s in skip if s < n) + ((n - 1,) if skip and side == 300 else ())
    images = np.random.default_rng(len(skip)).integers(0, 256, (n, side, side, 3), dtype=np.uint8)
    kept = [i for i in range(n) if i not in skip]
    meta = {"classes": ["a", "b"], "note": "x" * 100}
    want = streamed(tmp_path / "a.tbl", image_schema(side), images, kept, meta)
    got, _ = placed(tmp_path / "b.tbl", image_schema(side), images, kept, meta, with_crcs=with_crcs)
    assert got == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tbl", "b.tbl"]
    ds = tbl_format.open(tmp_path / "b.tbl")
    try:
        assert len(ds) == len(kept)
        assert np.array_equal(np.concatenate([np.array(a) for a in ds.segments("image")]), images[kept])
    finally:
        ds.close()


def test_given_crcs_of_rows_larger_than_a_block_fold_into_the_same_file(tmp_path: Path) -> None:
    # 700 x 700 x 3 = 1,470,000 B: each row ends a CRC block and starts another; slot 2 spans a whole one too.
    images = np.random.default_rng(7).integers(0, 256, (5, 700, 700, 3), dtype=np.uint8)
    kept = [0, 1, 2, 4]  # slot 4 moves down to row 3: its given CRCs no longer hold and are not used
    want = streamed(tmp_path / "a.tbl", image_schema(700), images, kept, {})
    got, _ = placed(tmp_path / "b.tbl", image_schema(700), images, kept, {}, with_crcs=True)
    assert got == want
    assert [len(row_crcs(i, images[i].tobytes())) for i in range(5)] == [2, 2, 3, 2, 3]


def test_a_wrong_count_of_crcs_is_refused_before_anything_is_committed(tmp_path: Path) -> None:
    image = np.zeros((300, 300, 3), np.uint8)
    with PlacedWriter(tmp_path / "x.tbl", image_schema(300), placed="image", capacity=8) as w:
        for slot in range(3):
            w.commit(slot, {"label": slot}, row_crcs(slot, image.tobytes()))
        # slot 3 (at 810,000 B) ends the first 1 MiB block: its row is in two pieces
        with pytest.raises(ValueError, match="1 CRCs for a row in 2 pieces"):
            w.commit(3, {"label": 3}, [0])
        assert w.rows == 3
        w.commit(3, {"label": 3}, row_crcs(3, image.tobytes()))
    ds = tbl_format.open(tmp_path / "x.tbl")
    try:
        assert len(ds) == 4
        ds.verify()  # raises on any checksum that does not match
    finally:
        ds.close()


@pytest.mark.parametrize("skip", [(), (2, 3)])
def test_committed_rows_are_handed_to_the_disk_in_steps(tmp_path: Path, monkeypatch, skip: tuple[int, ...]) -> None:
    """Writeback is asked for committed bytes only, in order and without gaps, and changes no byte."""
    from tbl_format import placed as placed_module

    asked: list[tuple[int, int]] = []
    given: list[bool] = []
    real = placed_module.start_writeback

    def recording(fd: int, offset: int, length: int) -> bool:
        asked.append((offset, length))
        given.append(real(fd, offset, length))
        return given[-1]

    monkeypatch.setattr(placed_module, "WRITEBACK_STEP", 5000)
    monkeypatch.setattr(placed_module, "start_writeback", recording)
    n, side = 40, 20  # rows of 1,200 B: a step every fifth row
    images = np.random.default_rng(7).integers(0, 256, (n, side, side, 3), dtype=np.uint8)
    kept = [i for i in range(n) if i not in skip]
    want = streamed(tmp_path / "a.tbl", image_schema(side), images, kept, {})
    got, base = placed(tmp_path / "b.tbl", image_schema(side), images, kept, {})
    assert got == want
    row = side * side * 3
    ends = [off + length - base for off, length in asked]
    assert [off - base for off, _ in asked] == [0, *ends[:-1]]  # from the start of the region, no gaps
    assert ends == [row * k for k in range(5, len(kept) + 1, 5)]  # whole committed rows, once 5,000 B gathered
    assert all(given) == sys.platform.startswith("linux")


def test_start_writeback_is_a_hint_that_changes_nothing(tmp_path: Path) -> None:
    from tbl_format.fsutil import start_writeback

    data = os.urandom(3 * 4096 + 100)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    try:
        assert start_writeback(fd, 0, len(data)) == sys.platform.startswith("linux")
        assert start_writeback(fd, 4096, 0) is False  # nothing to write back
        os.fsync(fd)
    finally:
        os.close(fd)
    assert start_writeback(fd, 0, 4096) is False  # a closed descriptor: the hint is not given, nothing raised
    assert path.read_bytes() == data


def test_placed_leaf_after_another_and_header_across_a_page(tmp_path: Path) -> None:
    # Staging assumes all capacity rows and the longest header; with fewer rows the label column before the
    # image shrinks, and a header near 4096 bytes can end a page lower: the rows then move down once.
    images = np.random.default_rng(0).integers(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    kept = list(range(0, 40, 3))
    moved = 0
    for pad in range(3600, 4100, 23):
        for label_first in (False, True):
            schema = image_schema(8, label_first)
            meta = {"pad": "p" * pad}
            want = streamed(tmp_path / "a.tbl", schema, images, kept, meta)
            got, base = placed(tmp_path / "b.tbl", schema, images, kept, meta, capacity=4000)
            assert got == want, (pad, label_first)
            moved += image_offset(got) != base
            (tmp_path / "a.tbl").unlink()
            (tmp_path / "b.tbl").unlink()
    assert moved >= 2  # both reasons to move were exercised


def test_capacity_zero_and_nothing_committed(tmp_path: Path) -> None:
    empty = np.zeros((0, 4, 4, 3), np.uint8)
    for capacity in (0, 5):
        want = streamed(tmp_path / "a.tbl", image_schema(4), empty, [], {})
        got, _ = placed(tmp_path / "b.tbl", image_schema(4), empty, [], {}, capacity=capacity or None)
        assert got == want
        (tmp_path / "a.tbl").unlink()
        (tmp_path / "b.tbl").unlink()


def test_rules_and_abort(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not fixed-size"):
        PlacedWriter(tmp_path / "x.tbl", Schema({"image": Leaf("image", shape=(4, 4, 3)), "name": Leaf("str")}),
                     placed="image", capacity=3)
    with pytest.raises(ValueError, match="not in the schema"):
        PlacedWriter(tmp_path / "x.tbl", image_schema(4), placed="pixels", capacity=3)
    w = PlacedWriter(tmp_path / "x.tbl", image_schema(4), placed="image", capacity=3)
    w.commit(1, {"label": 1})
    with pytest.raises(IndexError, match="in order"):
        w.commit(0, {"label": 0})
    with pytest.raises(IndexError):
        w.offset(3)
    with pytest.raises(SchemaMismatchError, match="label"):
        w.commit(2, {"label": "two"})
    with pytest.raises(SchemaMismatchError):
        w.commit(2, {})
    w.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError):
        with PlacedWriter(tmp_path / "x.tbl", image_schema(4), placed="image", capacity=3) as w:
            w.commit(0, {"label": 0})
            raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "x.tbl").write_bytes(b"old")
    with pytest.raises(tbl_format.DestinationExistsError):
        PlacedWriter(tmp_path / "x.tbl", image_schema(4), placed="image", capacity=3)
    assert (tmp_path / "x.tbl").read_bytes() == b"old"


def test_free_space_is_checked_up_front(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    too_many = st.f_bavail * st.f_frsize // (64 * 64 * 3) + 1000
    with pytest.raises(tbl_format.InsufficientSpaceError):
        PlacedWriter(tmp_path / "x.tbl", image_schema(64), placed="image", capacity=too_many)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("where", ["compile", "placed-file", "placed-writer"])
def test_a_constructor_ended_early_leaves_no_temp_file(tmp_path: Path, monkeypatch, where: str) -> None:
    """A Ctrl-C (or any exception) while a writer is being built removes what it made: the caller has no
    writer to abort yet."""
    from tbl_format import placed as placed_module
    from tbl_format import writer as writer_module

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "compile":  # inside FileWriter.__init__, after its spill folder is made
        monkeypatch.setattr(writer_module.FileWriter, "_compile_fast", interrupt)
    elif where == "placed-file":  # inside _PlacedFileWriter.__init__, after the temp file is made
        monkeypatch.setattr(placed_module, "PlacedRegion", interrupt)
    else:  # inside PlacedWriter.__init__, after its file writer is made
        monkeypatch.setattr(placed_module.PlacedWriter, "placed", property(interrupt, interrupt), raising=False)
    with pytest.raises(KeyboardInterrupt):
        PlacedWriter(tmp_path / "out.tbl", image_schema(8), placed="image", capacity=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    if where == "compile":
        w = tbl_format.Writer(tmp_path / "streamed.tbl", image_schema(8))
        with pytest.raises(KeyboardInterrupt):
            w.write({"image": np.zeros((8, 8, 3), np.uint8), "label": 1})
        w.abort()
        assert sorted(p.name for p in tmp_path.iterdir()) == []
