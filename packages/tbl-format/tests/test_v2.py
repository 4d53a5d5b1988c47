"""TBL v2 (TurboLoader) files read through tbl_format.open: schema mapping, zero-copy column, validation rules."""

from __future__ import annotations

import importlib.util
import json
import pickle
import struct
from pathlib import Path

import pytest

import tbl_format as tf
import tbl_format.reader as native_reader
from tbl_format import codec
from tbl_format import turboloader as v2

GOLDEN = Path(__file__).parent / "golden"
_spec = importlib.util.spec_from_file_location("tbl_golden_make", GOLDEN / "make_golden.py")
mg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mg)


@pytest.fixture(params=["numpy", "no-numpy"])
def np_mode(request, monkeypatch):
    """Run with numpy visible to the readers, and again as if it were not installed."""
    if request.param == "numpy":
        pytest.importorskip("numpy")
    else:
        monkeypatch.setattr(v2, "_numpy", lambda: None)
        monkeypatch.setattr(native_reader, "_numpy", lambda: None)
    return request.param


def _as_bytes(x) -> bytes:
    return x.tobytes() if hasattr(x, "tobytes") else bytes(x)


def _shape(x) -> tuple[int, ...]:
    return tuple(x.shape)


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


IMGS = mg.raw_images(4, 3, 2, seed=11)
RAW = [(im, mg.RAW_U8, 2, 3) for im in IMGS]


def test_crc16_check_value():
    assert v2.crc16(b"123456789") == 0x4B37  # CRC-16/MODBUS check value
    assert v2.crc16(b"") == 0xFFFF


def test_uniform_raw_is_an_image_column(tmp_path, np_mode):
    path = _write(tmp_path, "raw.tbl", mg.v2_bytes(RAW))
    ds = tf.open(path, verify=True)
    assert isinstance(ds.shard(0), v2.TurboLoaderFile)
    assert ds.leaf_paths == ["image"]
    leaf = ds.schema.leaves["image"]
    assert (leaf.kind, leaf.dtype, leaf.shape) == ("image", "uint8", (3, 2, 3))
    assert len(ds) == 4
    for i, im in enumerate(IMGS):
        assert _shape(ds[i]["image"]) == (3, 2, 3)
        assert _as_bytes(ds[i]["image"]) == im
    assert _as_bytes(ds[-1]["image"]) == IMGS[-1]
    assert [_as_bytes(r["image"]) for r in ds] == IMGS
    (col,) = ds.segments("image")
    assert _shape(col) == (4, 3, 2, 3)
    assert _as_bytes(col) == b"".join(IMGS)
    with pytest.raises(IndexError):
        ds[4]
    with pytest.raises(IndexError):
        ds[-5]
    ds.close()


def test_image_column_is_a_view_of_the_file(tmp_path):
    np = pytest.importorskip("numpy")
    path = _write(tmp_path, "raw.tbl", mg.v2_bytes(RAW))
    ds = tf.open(path)
    (col,) = ds.segments("image")
    assert not col.flags.owndata and not col.flags.writeable
    assert col.flags.c_contiguous and col.dtype == np.uint8
    # The row returned by ds[i] lies inside the column's memory: no per-row copy either.
    assert np.shares_memory(ds[2]["image"], col[2]) and not np.shares_memory(ds[2]["image"], col[1])
    expect = np.frombuffer(b"".join(IMGS), dtype=np.uint8).reshape(4, 3, 2, 3)
    assert np.array_equal(col, expect)


def test_labels_from_json_metadata(tmp_path, np_mode):
    meta = [(i, json.dumps({"label": 10 - i, "name": f"n{i}"}).encode(), mg.META_JSON) for i in range(4)]
    ds = tf.open(_write(tmp_path, "l.tbl", mg.v2_bytes(RAW, metadata=meta)))
    assert ds.leaf_paths == ["image", "label", "meta"]
    assert [r["label"] for r in ds] == [10, 9, 8, 7]
    assert ds[1]["meta"] == meta[1][1]
    (labels,) = ds.segments("label")
    assert list(labels) == [10, 9, 8, 7]


@pytest.mark.parametrize(
    "meta",
    [
        [(0, b'{"label": 1}', 1)],  # not every sample has a block
        [(i, b'{"label": true}', 1) for i in range(4)],  # bool is not an int label
        [(i, b'{"label": "cat"}', 1) for i in range(4)],
        [(i, b"[1, 2]", 1) for i in range(4)],
        [(i, b"not json", 1) for i in range(4)],
        [(i, b'{"label": 1}', 255) for i in range(4)],  # CUSTOM type: opaque bytes
    ],
)
def test_metadata_without_int_labels_is_kept_as_bytes(tmp_path, meta):
    ds = tf.open(_write(tmp_path, "m.tbl", mg.v2_bytes(RAW, metadata=meta)))
    assert ds.leaf_paths == ["image", "meta"]
    by_index = {}
    for i, m, _t in meta:
        by_index.setdefault(i, m)
    assert [r["meta"] for r in ds] == [by_index.get(i, b"") for i in range(4)]
    # values() of a v2 file: the Shard default, whole rows then the leaf.
    assert ds.values("meta", [3, 0, 3]) == [by_index.get(i, b"") for i in (3, 0, 3)]


def test_first_metadata_block_wins(tmp_path):
    meta = [(0, b"first", 1), (0, b"second", 1)]
    ds = tf.open(_write(tmp_path, "d.tbl", mg.v2_bytes(RAW[:1], metadata=meta)))
    assert ds[0]["meta"] == b"first"


def test_other_formats_read_as_bytes(tmp_path, np_mode):
    samples = [(b"\xff\xd8jpeg", mg.JPEG, 3, 3), (b"png!", mg.PNG, 0, 0), (b"", 0, 0, 0)]
    ds = tf.open(_write(tmp_path, "b.tbl", mg.v2_bytes(samples)), verify=True)
    assert ds.leaf_paths == ["data", "format"]
    assert list(ds) == [{"data": p, "format": f} for p, f, _, _ in samples]
    (fmt,) = ds.segments("format")
    assert list(fmt) == [mg.JPEG, mg.PNG, 0]
    with pytest.raises(ValueError, match="not fixed-size"):
        ds.segments("data")


def test_raw_with_mixed_dims_reads_as_bytes(tmp_path):
    samples = [RAW[0], (bytes(2 * 2 * 3), mg.RAW_U8, 2, 2)]
    ds = tf.open(_write(tmp_path, "mix.tbl", mg.v2_bytes(samples)))
    assert ds.leaf_paths == ["data", "format"]
    assert [r["data"] for r in ds] == [RAW[0][0], bytes(12)]


def test_zero_sized_raw_reads_as_bytes(tmp_path):
    ds = tf.open(_write(tmp_path, "z.tbl", mg.v2_bytes([(b"", mg.RAW_U8, 0, 5)])))
    assert ds.leaf_paths == ["data", "format"] and ds[0] == {"data": b"", "format": mg.RAW_U8}


def test_empty_file(tmp_path):
    ds = tf.open(_write(tmp_path, "e.tbl", mg.v2_bytes([])), verify=True)
    assert len(ds) == 0 and list(ds) == []


def test_gapped_payloads_read_but_have_no_zero_copy_column(tmp_path, np_mode):
    ds = tf.open(GOLDEN / "v2_valid_gapped.tbl", verify=True)
    rows = [_as_bytes(r["image"]) for r in ds]
    assert rows == [_as_bytes(tf.open(GOLDEN / "v2_valid_raw.tbl")[i]["image"]) for i in range(3)]
    with pytest.raises(v2.V2LayoutError, match="back to back"):
        ds.segments("image")


def test_lz4_samples(tmp_path, np_mode):
    pytest.importorskip("lz4")
    samples = [(bytes(2 * 3 * 3), mg.RAW_U8, 2, 3), RAW[1]]
    ds = tf.open(_write(tmp_path, "c.tbl", mg.v2_bytes(samples, compress=True)), verify=True)
    assert ds.leaf_paths == ["image"]
    assert [_as_bytes(r["image"]) for r in ds] == [bytes(18), IMGS[1]]
    with pytest.raises(v2.V2LayoutError, match="LZ4"):
        ds.segments("image")


def test_lz4_without_the_package_names_the_fix(tmp_path, monkeypatch):
    path = GOLDEN / "v2_valid_lz4.tbl"
    monkeypatch.setattr(codec, "_lz4_block", None)  # as if lz4 were not installed
    ds = tf.open(path)  # opening needs no codec
    with pytest.raises(tf.CompressionUnavailableError, match="pip install lz4"):
        ds[0]
    assert ds[1] == {"data": b"xyz", "format": mg.PNG}  # stored uncompressed


def test_verify_reports_progress_and_skips_crc_without_the_flag(tmp_path):
    raw = bytearray(mg.v2_bytes(RAW))
    raw[64 + 4 * 24] ^= 1  # damage sample 0's payload
    path = _write(tmp_path, "bad.tbl", bytes(raw))
    seen = []
    with pytest.raises(tf.DataChecksumError, match="sample 0"):
        tf.open(path).verify(lambda done, total: seen.append((done, total)))
    good = _write(tmp_path, "good.tbl", mg.v2_bytes(RAW))
    tf.open(good).verify(lambda done, total: seen.append((done, total)))
    assert seen[-1] == (4 * 18, 4 * 18)
    # Without HAS_CHECKSUMS the per-sample CRCs carry no promise, so verify does not check them.
    unflagged = mg.v2_refresh_crc(mg.put(bytes(raw), 40, "<I", 0))
    tf.open(_write(tmp_path, "noflag.tbl", unflagged), verify=True)


def test_uncompressed_size_zero_is_accepted(tmp_path):
    # TurboLoader's format header documents 0 as "not compressed"; its writer stores the size itself.
    raw = mg.put(mg.v2_bytes(RAW), 64 + 12, "<I", 0)
    assert _as_bytes(tf.open(_write(tmp_path, "u0.tbl", raw))[0]["image"]) == IMGS[0]


@pytest.mark.parametrize(
    ("patch", "error", "match"),
    [
        (lambda r: r[:40], tf.TruncatedFileError, "shorter than the 64-byte"),
        (lambda r: mg.put(r, 0, "<4s", b"TBL\x03"), tf.BadMagicError, None),
        (lambda r: mg.v2_refresh_crc(mg.put(r, 4, "<I", 1)), tf.UnsupportedVersionError, "version 1"),
        (lambda r: mg.put(r, 60, "<B", 1), tf.HeaderChecksumError, None),
        (lambda r: mg.v2_refresh_crc(mg.put(r, 8, "<Q", 2**64 - 1)), tf.TruncatedFileError, "cannot hold"),
        (lambda r: mg.v2_refresh_crc(mg.put(r, 16, "<I", 64)), tf.HeaderFormatError, "header_size"),
        (lambda r: mg.put(r, 64 + 24 + 8, "<I", 2**32 - 1), tf.RegionBoundsError, "sample 1"),
        # Entries that differ only in their offsets take the uniform fast path; it names the same sample.
        (lambda r: mg.put(r, 64 + 24 * 2, "<Q", len(r) - 17), tf.RegionBoundsError, "sample 2"),
        (lambda r: mg.put(r, 64 + 24 * 3, "<Q", 64), tf.RegionBoundsError, "sample 3"),
        (lambda r: mg.put(r, 64 + 24 * 3, "<Q", 2**64 - 1), tf.RegionBoundsError, "sample 3"),
        (lambda r: mg.put(r, 64 + 24 + 12, "<I", 17), tf.HeaderFormatError, "uncompressed size"),
        (lambda r: mg.put(r, 64 + 24 + 16, "<H", 3), tf.RegionBoundsError, "RAW_U8"),
        (lambda r: mg.v2_refresh_crc(mg.put(r, 32, "<Q", 2**64 - 1)), tf.RegionBoundsError, "metadata section"),
        (lambda r: mg.v2_refresh_crc(mg.put(r, 24, "<Q", 2**64 - 1)), tf.RegionBoundsError, "metadata section"),
        (lambda r: mg.v2_refresh_crc(mg.put(r, 32, "<Q", 28 + 8)), tf.RegionBoundsError, "block header"),
        (lambda r: mg.v2_refresh_crc(mg.put(r, 32, "<Q", 20)), tf.RegionBoundsError, "runs past"),
        (lambda r: mg.put(r, len(r) - 16 - 12 + 8, "<I", 13), tf.RegionBoundsError, "runs past"),
        (lambda r: mg.put(r, len(r) - 16 - 12, "<Q", 4), tf.HeaderFormatError, "names sample 4"),
    ],
)
def test_each_rule_has_its_error(tmp_path, np_mode, patch, error, match):
    base = mg.v2_bytes(RAW, metadata=[(i, json.dumps({"label": i}).encode(), 1) for i in range(4)])
    assert base.endswith(b'{"label": 3}') and len(b'{"label": 3}') == 12
    path = _write(tmp_path, "x.tbl", patch(base))
    with pytest.raises(error, match=match):
        tf.open(path)


def test_numpy_and_python_index_checks_agree(tmp_path, monkeypatch):
    """The vectorised and the per-entry validation name the same first broken entry."""
    pytest.importorskip("numpy")
    raw = mg.v2_bytes(RAW)
    for k in range(4):
        bad = mg.put(raw, 64 + 24 * k + 21, "<B", 0x40)
        path = _write(tmp_path, f"f{k}.tbl", bad)
        with pytest.raises(tf.HeaderFormatError) as with_np:
            tf.open(path)
        monkeypatch.setattr(v2, "_numpy", lambda: None)
        with pytest.raises(tf.HeaderFormatError) as without:
            tf.open(path)
        monkeypatch.undo()
        assert str(with_np.value) == str(without.value) and f"sample {k}" in str(without.value)


def test_pickle_and_describe(tmp_path):
    path = _write(tmp_path, "raw.tbl", mg.v2_bytes(RAW))
    ds = tf.open(path)
    again = pickle.loads(pickle.dumps(ds))
    assert _as_bytes(again[3]["image"]) == IMGS[3]
    d = ds.shard(0).describe()
    assert d["zero_copy_images"] is True and d["columns"]["image"]["stored_bytes"] == 4 * 18
    assert ds.metadata == {"tbl_v2": {"version": 2, "flags": 4}}
    assert ds.shard(0).header_crc32 == struct.unpack_from("<I", path.read_bytes(), 44)[0]
