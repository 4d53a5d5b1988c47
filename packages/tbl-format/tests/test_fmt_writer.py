from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import tbl_format as tf
from tbl_format import Leaf, Schema, SchemaMismatchError, codec


def leftovers(d):
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize(
    ("sample", "match"),
    [
        ({"a": 1, "b": {"c": "x"}, "l": [1.0, 2.0]}, None),
        ({"a": "1", "b": {"c": "x"}, "l": [1.0, 2.0]}, r"sample 3: leaf 'a': expected an int"),
        ({"a": 1, "b": {"c": 5}, "l": [1.0, 2.0]}, r"sample 3: leaf 'b/c': expected a str"),
        ({"a": 1, "b": {"c": "x"}, "l": [1.0, "2"]}, r"sample 3: leaf 'l/1': expected a float"),
        ({"a": 1, "b": {"c": "x"}, "l": [1.0]}, None),  # an inferred list of varying length becomes a var_list
        ({"a": 1, "b": {"d": "x"}, "l": [1.0, 2.0]}, r"sample 3: leaf 'b': dict keys differ: missing \['c'\]"),
        ({"a": 1, "b": {"c": "x"}, "l": (1.0, 2.0)}, r"sample 3: leaf 'l': expected a list"),
        ({"a": 2**63, "b": {"c": "x"}, "l": [1.0, 2.0]}, r"sample 3: leaf 'a': int .* does not fit in int64"),
        ({"a": True, "b": {"c": "x"}, "l": [1.0, 2.0]}, r"sample 3: leaf 'a': expected an int"),
        ({"a": 1, "b": {"c": "\ud800"}, "l": [1.0, 2.0]}, r"sample 3: leaf 'b/c': str is not encodable"),
    ],
)
def test_mismatch_names_index_and_path_and_writer_stays_usable(tmp_path, sample, match):
    good = {"a": 1, "b": {"c": "x"}, "l": [1.0, 2.0]}
    with tf.Writer(tmp_path / "d.tbl") as w:
        for _ in range(3):
            w.write(good)
        if match is None:
            w.write(sample)
        else:
            with pytest.raises(SchemaMismatchError, match=match):
                w.write(sample)
        w.write(good)
    assert len(tf.open(tmp_path / "d.tbl")) == (5 if match is None else 4)


def test_a_given_schema_is_kept_as_given(tmp_path):
    schema = Schema({"l": [Leaf("float"), Leaf("float")], "x": Leaf("int")})
    with tf.Writer(tmp_path / "g.tbl", schema) as w:
        w.write({"l": [1.0, 2.0], "x": 1})
        with pytest.raises(SchemaMismatchError, match=r"sample 1: leaf 'l': expected 2 elements"):
            w.write({"l": [1.0], "x": 1})
        with pytest.raises(SchemaMismatchError, match=r"sample 1: leaf 'x': expected an int, got NoneType"):
            w.write({"l": [1.0, 2.0], "x": None})
    assert tf.open(tmp_path / "g.tbl").schema == schema


def test_array_mismatches(tmp_path):
    np = pytest.importorskip("numpy")
    schema = Schema({"v": Leaf("array", dtype="float32", shape=(2,)), "r": Leaf("var_array", dtype="int8", ndim=2)})
    w = tf.Writer(tmp_path / "a.tbl", schema)
    with pytest.raises(SchemaMismatchError, match="sample 0: leaf 'v': expected dtype float32, got float64"):
        w.write({"v": np.zeros(2), "r": np.zeros((1, 1), np.int8)})
    with pytest.raises(SchemaMismatchError, match=r"leaf 'v': expected shape \(2,\), got \(3,\)"):
        w.write({"v": np.zeros(3, np.float32), "r": np.zeros((1, 1), np.int8)})
    with pytest.raises(SchemaMismatchError, match="leaf 'r': expected ndim 2"):
        w.write({"v": np.zeros(2, np.float32), "r": np.zeros(1, np.int8)})
    w.write({"v": np.array([1, 2], ">f4"), "r": np.zeros((2, 3), np.int8)[:, ::2]})  # big-endian, non-contiguous
    w.close()
    got = tf.open(tmp_path / "a.tbl")[0]
    assert got["v"].tolist() == [1.0, 2.0] and got["r"].shape == (2, 2)


def test_exception_mid_write_leaves_nothing(tmp_path):
    dst = tmp_path / "x.tbl"
    with pytest.raises(RuntimeError, match="boom"), tf.Writer(dst) as w:
        for i in range(100):
            w.write({"a": i, "s": "x" * i})
        raise RuntimeError("boom")
    assert leftovers(tmp_path) == []


def test_exception_keeps_previous_version(tmp_path):
    dst = tf.write([{"a": 1}], tmp_path / "x.tbl")
    before = dst.read_bytes()

    def gen():
        yield {"a": 2}
        raise KeyError("source failed")

    with pytest.raises(KeyError):
        tf.write(gen(), dst, overwrite=True)
    assert dst.read_bytes() == before and leftovers(tmp_path) == ["x.tbl"]


def test_abort_sharded_keeps_previous_manifest(tmp_path):
    dst = tmp_path / "ds"
    tf.write(({"a": i} for i in range(10)), dst, shard_rows=4)
    old = leftovers(dst)
    w = tf.Writer(dst, shard_rows=3, overwrite=True)
    for i in range(7):
        w.write({"a": 100 + i})
    w.abort()
    assert leftovers(dst) == old and [s["a"] for s in tf.open(dst)] == list(range(10))


KILL_SCRIPT = textwrap.dedent("""
    import os, sys
    import tbl_format as tf
    dst, sharded = sys.argv[1], sys.argv[2] == "1"
    kw = {"shard_rows": 50} if sharded else {}
    w = tf.Writer(dst, overwrite=True, **kw)
    for i in range(500):
        w.write({"a": i, "s": "y" * (i % 13)})
    os._exit(9)  # killed before close(): no cleanup runs
""")


@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("previous", [False, True])
def test_kill_mid_write(tmp_path, sharded, previous):
    dst = tmp_path / ("ds" if sharded else "x.tbl")
    if previous:
        tf.write(({"a": i, "s": "old"} for i in range(5)), dst, **({"shard_rows": 2} if sharded else {}))
    rc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, str(dst), "1" if sharded else "0"], timeout=60).returncode
    assert rc == 9
    if previous:
        assert [s["s"] for s in tf.open(dst)] == ["old"] * 5
    elif sharded:
        with pytest.raises(tf.ManifestError):
            tf.open(dst)
    else:
        assert not dst.exists()
    # What a kill leaves behind is clearly named and never opens as a dataset.
    names = [p.name for p in (dst if sharded else tmp_path).iterdir()]
    temps = [n for n in names if ".tbl-tmp-" in n]
    assert temps and all(n.startswith(".") and not n.endswith(".tbl") for n in temps)


def test_sharding_by_rows_and_bytes(tmp_path):
    ds = tf.open(tf.write(({"a": i} for i in range(10)), tmp_path / "r", shard_rows=4))
    assert ds.segment_rows == [4, 4, 2] and [s["a"] for s in ds] == list(range(10))
    ds = tf.open(tf.write(({"s": "z" * 100} for i in range(50)), tmp_path / "b", shard_bytes=1000))
    assert len(ds.segment_rows) > 3 and sum(ds.segment_rows) == 50
    assert all(r <= 10 for r in ds.segment_rows)


def test_rewrite_sharded_removes_old_shards(tmp_path):
    dst = tmp_path / "ds"
    tf.write(({"a": i} for i in range(10)), dst, shard_rows=2)
    tf.write(({"a": i} for i in range(3)), dst, shard_rows=2, overwrite=True)
    assert len([n for n in os.listdir(dst) if n.endswith(".tbl")]) == 2
    assert [s["a"] for s in tf.open(dst)] == [0, 1, 2]


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="compression"):
        tf.Writer(tmp_path / "a.tbl", compression="brotli")
    with pytest.raises(ValueError, match="compression_level"):
        tf.Writer(tmp_path / "a.tbl", compression="lz4", compression_level=3)
    with pytest.raises(ValueError, match="shard_rows"):
        tf.Writer(tmp_path / "d", shard_rows=0)
    with pytest.raises(IsADirectoryError):
        tf.Writer(tmp_path)
    w = tf.Writer(tmp_path / "a.tbl", Schema({"a": Leaf("int")}))
    w.close()
    with pytest.raises(RuntimeError):
        w.write({"a": 1})


def test_multi_block_columns_and_block_checksums(tmp_path, hdr):
    np = pytest.importorskip("numpy")
    schema = Schema({"img": Leaf("image", shape=(128, 128, 4)), "s": Leaf("str")})
    rows = [{"img": np.full((128, 128, 4), i, np.uint8), "s": str(i) * 1000} for i in range(100)]  # 6.4 MiB column
    path = tf.write(rows, tmp_path / "big.tbl", schema=schema)
    ds = tf.open(path, verify=True)
    assert all(int(ds[i]["img"][5, 7, 2]) == i for i in range(100)) and ds[99]["s"] == "99" * 1000
    data = hdr.read(path)["columns"][0]["regions"]["data"]
    raw = bytearray(path.read_bytes())
    raw[data["offset"] + 3 * (1 << 20) + 5] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(tf.DataChecksumError, match="data block 3 "):
        tf.open(path).verify()


def test_copy_fallback_without_copy_file_range(tmp_path, monkeypatch):
    import errno

    def refuse(*args, **kwargs):
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    rows = [{"i": i, "s": "q" * i} for i in range(300)]
    assert list(tf.open(tf.write(rows, tmp_path / "f.tbl"))) == rows


def test_missing_lz4_is_a_named_error(tmp_path, monkeypatch):
    monkeypatch.setattr(codec, "_lz4_block", None)  # as if lz4 were not installed
    with pytest.raises(tf.CompressionUnavailableError, match="pip install lz4"):
        tf.Writer(tmp_path / "c.tbl", compression="lz4")
    assert leftovers(tmp_path) == []
