from __future__ import annotations

import copy
import random
import struct

import pytest

import tbl_format as tf
from tbl_format import Leaf, Schema


@pytest.fixture
def good(tmp_path):
    rows = [{"i": i, "s": f"str-{i}", "b": bytes(i % 7), "f": i * 0.5} for i in range(300)]
    return tf.write(rows, tmp_path / "g.tbl")


def flip(path, offset):
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_bad_magic(good):
    flip(good, 1)
    with pytest.raises(tf.BadMagicError):
        tf.open(good)
    good.write_bytes(b"PK\x03\x04" + b"\x00" * 100)
    with pytest.raises(tf.BadMagicError):
        tf.open(good)


def test_unknown_major_version(good):
    raw = bytearray(good.read_bytes())
    struct.pack_into("<H", raw, 8, 2)
    good.write_bytes(bytes(raw))
    with pytest.raises(tf.UnsupportedVersionError, match="2.0"):
        tf.open(good)


def test_newer_minor_version_is_read(good, hdr):
    header = hdr.read(good)
    header["future_field"] = {"ignored": True}  # minor versions only add fields
    raw = bytearray(good.read_bytes())
    struct.pack_into("<H", raw, 10, 7)
    good.write_bytes(bytes(raw))
    hdr.rewrite(good, header)  # also refreshes the CRC over the new minor
    ds = tf.open(good)
    assert ds[3]["s"] == "str-3" and ds.shard(0).version == (1, 7)


def test_header_length_cap(good):
    raw = bytearray(good.read_bytes())
    struct.pack_into("<I", raw, 12, (16 << 20) + 1)
    good.write_bytes(bytes(raw))
    with pytest.raises(tf.HeaderTooLargeError):
        tf.open(good)


def test_header_checksum(good):
    flip(good, 40)
    with pytest.raises(tf.HeaderChecksumError):
        tf.open(good)


@pytest.mark.parametrize("keep", [0, 5, 31, 40, -1])
def test_truncated(good, keep):
    raw = good.read_bytes()
    good.write_bytes(raw[:keep] if keep >= 0 else raw[:-1])
    with pytest.raises(tf.TruncatedFileError):
        tf.open(good)


def test_trailing_bytes(good):
    with open(good, "ab") as f:
        f.write(b"\x00")
    with pytest.raises(tf.RegionBoundsError):
        tf.open(good)


def test_region_out_of_range_misaligned_overlapping(good, hdr):
    header = hdr.read(good)
    header["columns"][0]["regions"]["data"]["offset"] = 1 << 62
    hdr.rewrite(good, header)
    with pytest.raises(tf.RegionBoundsError, match="outside the data area"):
        tf.open(good)
    header["columns"][0]["regions"]["data"]["offset"] = 4097
    hdr.rewrite(good, header)
    with pytest.raises(tf.RegionAlignmentError):
        tf.open(good)
    header["columns"][0]["regions"]["data"]["offset"] = header["columns"][1]["regions"]["offsets"]["offset"]
    hdr.rewrite(good, header)
    with pytest.raises(tf.RegionBoundsError, match="overlap"):
        tf.open(good)


def test_header_fields(good, hdr):
    header = hdr.read(good)
    for mutate, err in [
        (lambda h: h.pop("rows"), tf.HeaderFormatError),
        (lambda h: h.update(rows=-1), tf.HeaderFormatError),
        (lambda h: h.update(rows="3"), tf.HeaderFormatError),
        (lambda h: h.update(rows=301), tf.RegionBoundsError),
        (lambda h: h.update(block_size=1000), tf.HeaderFormatError),
        (lambda h: h["schema"].update(dict=[["i", {"leaf": {"kind": "quux"}}]]), tf.InvalidSchemaError),
        (lambda h: h["columns"].pop(), tf.HeaderFormatError),
        (lambda h: h["columns"][1].update(compression={"codec": "brotli"}), tf.UnknownCodecError),
        (lambda h: h["columns"][0]["regions"]["data"].update(first_block=10**6), tf.RegionBoundsError),
    ]:
        h = copy.deepcopy(header)
        mutate(h)
        hdr.rewrite(good, h)
        with pytest.raises(err):
            tf.open(good)
    hdr.rewrite(good, header)
    tf.open(good)


def test_offsets_table_checksum(good, hdr):
    flip(good, hdr.region(good, "s", "offsets")["offset"] + 9)
    with pytest.raises(tf.TableChecksumError):
        tf.open(good)


def test_offsets_must_span_the_heap(good, hdr):
    off = hdr.region(good, "s", "offsets")
    # A valid CRC over offsets that end past the heap: caught at open without a per-row loop.
    hdr.patch_u64(good, off["offset"] + off["size"] - 8, 10**9)
    hdr.refresh_table_crc(good, hdr.read(good), "s", "offsets")
    with pytest.raises(tf.OffsetsError, match="span"):
        tf.open(good)


def test_non_monotonic_offsets_caught_on_access(good, hdr):
    off = hdr.region(good, "s", "offsets")
    hdr.patch_u64(good, off["offset"] + 8 * 10, 10**6)  # row 9 ends, row 10 starts, far past the heap
    hdr.refresh_table_crc(good, hdr.read(good), "s", "offsets")
    ds = tf.open(good)
    assert ds[3]["s"] == "str-3"
    with pytest.raises(tf.OffsetsError):
        ds[9]
    with pytest.raises(tf.OffsetsError):
        ds[10]
    with pytest.raises(tf.OffsetsError):
        list(ds)
    with pytest.raises(tf.FormatError):
        ds.verify()


def test_data_corruption_found_by_verify(good, hdr):
    flip(good, hdr.region(good, "f", "data")["offset"] + 17)
    ds = tf.open(good)
    assert len(ds) == 300  # data blocks are not read at open
    with pytest.raises(tf.DataChecksumError, match="leaf 'f'"):
        ds.verify()
    with pytest.raises(tf.DataChecksumError):
        tf.open(good, verify=True)


def test_invalid_utf8_is_corrupt_data(good, hdr):
    flip(good, hdr.region(good, "s", "heap")["offset"] + 1)
    ds = tf.open(good)
    with pytest.raises(tf.CorruptDataError, match="row 0"):
        ds[0]
    with pytest.raises(tf.CorruptDataError):
        list(ds)


def test_var_array_shape_larger_than_bytes(tmp_path, hdr):
    np = pytest.importorskip("numpy")
    schema = Schema({"r": Leaf("var_array", dtype="int32", ndim=1)})
    path = tf.write([{"r": np.arange(3, dtype=np.int32)}] * 4, tmp_path / "v.tbl", schema=schema)
    shapes = hdr.region(path, "r", "shapes")
    hdr.patch_u64(path, shapes["offset"] + 8, 1000)
    hdr.refresh_table_crc(path, hdr.read(path), "r", "shapes")
    ds = tf.open(path)
    assert ds[0]["r"].tolist() == [0, 1, 2]
    with pytest.raises(tf.CorruptDataError, match="shape"):
        ds[1]


def test_random_byte_damage_raises_only_format_errors(tmp_path):
    rows = [{"i": i, "s": "é" * (i % 5), "l": [b"x" * (i % 3), i % 2 == 0]} for i in range(64)]
    src = tf.write(rows, tmp_path / "src.tbl").read_bytes()
    rng = random.Random(1234)
    target = tmp_path / "d.tbl"
    for _ in range(150):
        raw = bytearray(src)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        if rng.random() < 0.2:
            raw = raw[: rng.randrange(len(raw))]
        target.write_bytes(bytes(raw))
        try:
            ds = tf.open(target)
            list(ds)
            [ds[i] for i in range(len(ds))]
            ds.verify()
        except tf.FormatError:
            pass


def test_a_file_declares_the_minor_of_what_it_uses(tmp_path, hdr):
    path = tf.write([{"t": ["a"]}, {"t": []}], tmp_path / "l.tbl")
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, 10, 0)  # claim 1.0 for a file with a var_list leaf
    path.write_bytes(bytes(raw))
    hdr.rewrite(path, hdr.read(path))  # refreshes the header CRC over the new minor
    with pytest.raises(tf.InvalidSchemaError, match="needs format 1.1"):
        tf.open(path)


def test_a_later_minor_with_unknown_leaf_fields_is_an_unsupported_version(tmp_path, hdr):
    path = tf.write([{"a": 1}], tmp_path / "f.tbl")
    raw = bytearray(path.read_bytes())
    struct.pack_into("<H", raw, 10, 9)
    path.write_bytes(bytes(raw))
    header = hdr.read(path)
    header["schema"]["dict"][0][1]["leaf"]["unit"] = "m"  # a leaf field a later minor might add
    hdr.rewrite(path, header)
    with pytest.raises(tf.UnsupportedVersionError, match="1.9 uses what this reader"):
        tf.open(path)
