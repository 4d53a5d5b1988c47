from __future__ import annotations

import gc
import json
import os
import pickle
import random

import pytest

import tbl_format as tf
from tbl_format import Leaf, Schema


def rows(a, b):
    return [{"i": i, "s": f"s{i}", "v": [float(i), float(-i)]} for i in range(a, b)]


def test_directory_dataset_global_index(tmp_path, numpy_mode):
    d = tf.write(rows(0, 23), tmp_path / "ds", shard_rows=5)
    ds = tf.open(d)
    assert len(ds) == 23 and ds.segment_rows == [5, 5, 5, 5, 3]
    assert [ds[i] for i in range(23)] == rows(0, 23) == list(ds)
    assert ds[-1] == rows(22, 23)[0]
    with pytest.raises(IndexError):
        ds[23]
    segs = ds.segments("i")
    assert [len(s) for s in segs] == [5, 5, 5, 5, 3] and segs[1].tolist() == [5, 6, 7, 8, 9]
    with pytest.raises(ValueError, match="not fixed-size"):
        ds.segments("s")
    with pytest.raises(KeyError):
        ds.segments("nope")
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["rows"] == 23 and len(manifest["shards"]) == 5
    ds.verify()


def test_lazy_open_and_lru_bound(tmp_path):
    d = tf.write(rows(0, 40), tmp_path / "ds", shard_rows=4)
    ds = tf.open(d, max_open=3)
    assert len(ds._shards) == 0  # nothing mapped before the first access
    ds[0]
    assert len(ds._shards) == 1
    view = ds.segments("i")[0]  # touches all ten shards; only three stay held
    assert len(ds._shards) == 3
    assert [ds[i]["i"] for i in range(0, 40, 3)] == list(range(0, 40, 3))
    assert list(view) == [0, 1, 2, 3]  # an evicted shard's view stays valid
    ds.close()
    assert ds[5]["i"] == 5  # reopens lazily


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to count descriptors")
def test_evicted_shards_release_their_descriptors_without_gc(tmp_path):
    # A thousand-shard dataset read in random order must hold at most max_open maps
    # (and descriptors) at any time, even with the cyclic garbage collector off.
    d = tf.write(rows(0, 300), tmp_path / "ds", shard_rows=2)
    ds = tf.open(d, max_open=4)
    gc.disable()
    try:
        before = len(os.listdir("/proc/self/fd"))
        for i in random.Random(0).sample(range(300), 300):
            assert ds[i]["i"] == i
        assert len(os.listdir("/proc/self/fd")) - before <= 4
    finally:
        gc.enable()
        ds.close()


class _MoveIn:
    """A fetch_shard hook: shard files live in a store folder and are copied beside the manifest on demand."""

    def __init__(self, store, folder, files):
        self.store, self.folder, self.files, self.calls = store, folder, files, []

    def __call__(self, k):
        self.calls.append(k)
        target = self.folder / self.files[k]
        if not target.exists():
            target.write_bytes((self.store / self.files[k]).read_bytes())
        return target


def _split_store(tmp_path):
    """A 10-shard dataset whose shard files are moved out to a store folder (only the manifest stays)."""
    d = tf.write(rows(0, 40), tmp_path / "ds", shard_rows=4)
    files = [e["file"] for e in tf.open(d).shard_entries]
    store = tmp_path / "store"
    store.mkdir()
    for name in files:
        (d / name).rename(store / name)
    return d, store, files


def test_fetch_shard_makes_only_the_touched_shards_present(tmp_path):
    d, store, files = _split_store(tmp_path)
    hook = _MoveIn(store, d, files)
    ds = tf.open(d, max_open=2, fetch_shard=hook)
    assert hook.calls == [] and len(ds) == 40  # opening reads the manifest only
    assert ds[13]["i"] == 13 and ds[37]["i"] == 37
    assert hook.calls == [3, 9]
    assert sorted(p.name for p in d.iterdir() if p.name != "manifest.json") == [files[3], files[9]]
    # The copy is checked against the manifest like any shard: a stray file is refused by name.
    (d / files[5]).write_bytes((store / files[6]).read_bytes())
    with pytest.raises(tf.ManifestMismatchError, match=files[5]):
        ds[21]
    # Pickled, the hook travels with the dataset.
    (d / files[5]).unlink()
    ds2 = pickle.loads(pickle.dumps(ds))
    assert ds2[21]["i"] == 21 and ds2._fetch_shard.calls[-1] == 5


def test_read_ahead_hears_the_orders_and_the_close(tmp_path):
    """The read_ahead hook gets each order as ints, and ``[]`` at close: a fetcher stops with the dataset."""
    d, store, files = _split_store(tmp_path)
    heard = []
    ds = tf.open(d, fetch_shard=_MoveIn(store, d, files), read_ahead=heard.append)
    ds.read_ahead((4, 1))
    assert ds[5]["i"] == 5
    ds.close()
    assert heard == [[4, 1], []]


def test_a_fetched_file_evicted_before_it_is_opened_is_fetched_again(tmp_path):
    """A cache shared by threads may evict the file between the hook's return and the open: the dataset asks
    the hook again; a file that keeps vanishing is a MissingShardError naming the shard."""
    d, store, files = _split_store(tmp_path)
    hook = _MoveIn(store, d, files)

    class EvictedOnce:
        def __init__(self):
            self.calls = 0

        def __call__(self, k):
            self.calls += 1
            path = hook(k)
            if self.calls == 1:  # another reader of the cache made room with it
                path.unlink()
            return path

    evicted = EvictedOnce()
    assert tf.open(d, fetch_shard=evicted)[13]["i"] == 13 and evicted.calls == 2

    def always_gone(k):
        path = hook(k)
        path.unlink()
        return path

    with pytest.raises(tf.MissingShardError, match=files[2]):
        tf.open(d, fetch_shard=always_gone)[9]


def test_fetch_shard_needs_a_dataset_directory(tmp_path):
    f = tf.write(rows(0, 4), tmp_path / "one.tbl")
    with pytest.raises(ValueError, match="fetch_shard needs a dataset directory"):
        tf.open(f, fetch_shard=lambda k: f)


def test_pickle_directory_dataset(tmp_path):
    ds = tf.open(tf.write(rows(0, 10), tmp_path / "ds", shard_rows=3))
    ds2 = pickle.loads(pickle.dumps(ds))
    assert ds2[9] == ds[9] and list(ds2) == rows(0, 10)


def test_zero_row_shards(tmp_path):
    schema = Schema({"i": Leaf("int"), "s": Leaf("str"), "v": [Leaf("float"), Leaf("float")]})
    a = tf.write(rows(0, 3), tmp_path / "a.tbl")
    empty = tf.write([], tmp_path / "e.tbl", schema=schema)
    b = tf.write(rows(3, 5), tmp_path / "b.tbl")
    ds = tf.open(tf.merge_manifests([empty, a, empty, b], tmp_path / "m"))
    assert ds.segment_rows == [0, 3, 0, 2]
    assert [ds[i] for i in range(5)] == rows(0, 5) == list(ds)


def test_merge_parts(tmp_path):
    p0 = tf.write(rows(0, 7), tmp_path / "p0", shard_rows=3, metadata={"classes": ["a"]})
    p1 = tf.write(rows(7, 9), tmp_path / "p1", shard_rows=3, metadata={"classes": ["a"]})
    before = sorted(p.read_bytes() for p in p0.glob("*.tbl"))
    out = tf.merge_manifests([p0, p1], tmp_path / "all")
    ds = tf.open(out)
    assert list(ds) == rows(0, 9) and ds.metadata == {"classes": ["a"]} and ds.segment_rows == [3, 3, 1, 2]
    assert sorted(p.read_bytes() for p in p0.glob("*.tbl")) == before  # parts untouched
    shard = next(out.glob("*.tbl"))
    assert shard.stat().st_nlink == 2  # hard link, not a copy
    with pytest.raises(FileExistsError):
        tf.merge_manifests([p0], out)


def test_merge_parts_inside_destination(tmp_path):
    root = tmp_path / "out"
    root.mkdir()
    tf.write(rows(0, 4), root / "part-0", shard_rows=3)
    tf.write(rows(4, 6), root / "part-1", shard_rows=3)
    tf.merge_manifests([root / "part-0", root / "part-1"], root)
    manifest = json.loads((root / "manifest.json").read_text())
    assert all(s["file"].startswith("part-") and "/" in s["file"] for s in manifest["shards"])
    assert list(tf.open(root)) == rows(0, 6)


def test_merge_rejects_schema_or_metadata_mismatch(tmp_path):
    p0 = tf.write(rows(0, 2), tmp_path / "p0.tbl")
    p1 = tf.write([{"i": 1}], tmp_path / "p1.tbl")
    with pytest.raises(tf.SchemaMismatchError, match="p1.tbl"):
        tf.merge_manifests([p0, p1], tmp_path / "m")
    p2 = tf.write(rows(0, 2), tmp_path / "p2.tbl", metadata={"x": 1})
    with pytest.raises(tf.SchemaMismatchError, match="metadata"):
        tf.merge_manifests([p0, p2], tmp_path / "m")


def test_manifest_validation(tmp_path):
    d = tf.write(rows(0, 6), tmp_path / "ds", shard_rows=3)
    m = d / "manifest.json"
    good = json.loads(m.read_text())
    (tmp_path / "empty").mkdir()
    with pytest.raises(tf.ManifestError, match="not a dataset"):
        tf.open(tmp_path / "empty")
    for mutate, err in [
        (lambda b: b.update(rows=7), tf.ManifestError),
        (lambda b: b["shards"][0].update(file="../x.tbl"), tf.ManifestError),
        (lambda b: b["shards"][0].update(file="/etc/passwd"), tf.ManifestError),
        (lambda b: b["shards"][0].update(rows=-1), tf.ManifestError),
        (lambda b: b.update(tbl_manifest=[9, 0]), tf.UnsupportedVersionError),
        (lambda b: b.update(schema={"leaf": {"kind": "nope"}}), tf.InvalidSchemaError),
    ]:
        body = json.loads(json.dumps(good))
        mutate(body)
        m.write_text(json.dumps(body))
        with pytest.raises(err):
            tf.open(d)
    m.write_text("{not json")
    with pytest.raises(tf.ManifestError):
        tf.open(d)
    # A shard that disagrees with the manifest is caught when it is first opened.
    body = json.loads(json.dumps(good))
    body["shards"][0]["rows"], body["shards"][1]["rows"] = 2, 4
    m.write_text(json.dumps(body))
    ds = tf.open(d)
    with pytest.raises(tf.ManifestMismatchError):
        ds[0]
    body = json.loads(json.dumps(good))
    body["shards"][1]["header_crc32"] ^= 1
    m.write_text(json.dumps(body))
    with pytest.raises(tf.ManifestMismatchError, match="CRC"):
        tf.open(d)[4]


def test_compression_round_trip(tmp_path):
    pytest.importorskip("lz4")
    np = pytest.importorskip("numpy")
    schema = Schema({"s": Leaf("str"), "b": Leaf("bytes"), "r": Leaf("var_array", dtype="float32", ndim=1),
                     "i": Leaf("int"), "img": Leaf("image", shape=(2, 2, 3))})
    data = [{"s": "text " * (i % 50), "b": bytes(range(i % 256)) * 3, "r": np.arange(i % 40, dtype=np.float32),
             "i": i, "img": np.full((2, 2, 3), i % 256, np.uint8)} for i in range(3000)]
    path = tf.write(data, tmp_path / "c.tbl", schema=schema, compression="lz4")
    plain = tf.write(data, tmp_path / "p.tbl", schema=schema)
    assert path.stat().st_size < plain.stat().st_size / 2
    ds = tf.open(path, verify=True)
    for i in (0, 1, 1234, 2999, 17, 2000):
        assert ds[i]["s"] == data[i]["s"] and ds[i]["b"] == data[i]["b"]
        assert np.array_equal(ds[i]["r"], data[i]["r"])
    got = list(ds)
    assert [g["s"] for g in got] == [d["s"] for d in data] and [g["b"] for g in got] == [d["b"] for d in data]
    assert np.array_equal(ds.segments("img")[0][5], data[5]["img"])  # raw image column stays uncompressed
    info = ds.shard(0).describe()["columns"]
    assert info["s"]["compression"] == "lz4" and info["s"]["raw_bytes"] > info["s"]["stored_bytes"]
    assert "compression" not in info["img"]


def test_compressed_block_corruption(tmp_path, hdr):
    pytest.importorskip("lz4")
    path = tf.write([{"s": "abc" * (i % 100)} for i in range(2000)], tmp_path / "c.tbl", compression="lz4")
    heap = hdr.read(path)["columns"][0]["regions"]["heap"]
    raw = bytearray(path.read_bytes())
    for k in range(heap["offset"] + 10, heap["offset"] + heap["size"], 97):
        raw[k] ^= 0x5A
    path.write_bytes(bytes(raw))
    ds = tf.open(path)
    with pytest.raises(tf.DataChecksumError):
        ds.verify()
    with pytest.raises(tf.FormatError):
        list(ds)


def test_closed_file_reads_fail_clearly(tmp_path):
    ds = tf.open(tf.write(rows(0, 5), tmp_path / "a.tbl"))
    it = iter(ds)
    next(it)
    shard = ds.shard(0)
    ds.close()
    with pytest.raises(ValueError, match="closed"):
        shard.get(0)
    assert ds[2] == rows(2, 3)[0]  # the dataset itself maps again on demand


def _leaf_of(sample, path):
    for key in path.split("/"):
        sample = sample[int(key) if isinstance(sample, (list, tuple)) else key]
    return sample


@pytest.mark.parametrize("layout", ["file", "shards"])
def test_values_read_one_leaf_like_rows(tmp_path, numpy_mode, layout):
    data = [{"i": i, "f": i / 4, "ok": i % 3 == 0, "s": "é" * (i % 4), "b": bytes([i % 256]) * (i % 3),
             "t": (i, [f"n{i}"])} for i in range(50)]
    kwargs = {"shard_rows": 7} if layout == "shards" else {}
    ds = tf.open(tf.write(data, tmp_path / ("ds" if layout == "shards" else "a.tbl"), **kwargs))
    rows = random.Random(1).choices(range(50), k=80)  # repeats, any order, every shard
    for path in ds.leaf_paths:
        got = ds.values(path, rows)
        want = [_leaf_of(ds[i], path) for i in rows]
        assert got == want and [type(g) for g in got] == [type(w) for w in want], path
    assert ds.values("s", []) == []
    for bad in (50, -1):
        with pytest.raises(IndexError, match=f"row {bad} out of range for 50 rows"):
            ds.values("s", [0, bad])
    with pytest.raises(KeyError, match="no leaf 'nope'"):
        ds.values("nope", [0])


def test_values_of_array_leaves_with_and_without_numpy(tmp_path, numpy_mode):
    np = pytest.importorskip("numpy")  # to write the arrays; the reader may still not see numpy
    schema = Schema({"img": Leaf("image", shape=(2, 3, 3)), "e": Leaf("array", dtype="float16", shape=(0,)),
                     "h": Leaf("array", dtype="float16", shape=(2,))})
    data = [{"img": np.full((2, 3, 3), i, np.uint8), "e": np.zeros(0, np.float16),
             "h": np.array([i, -i], np.float16)} for i in range(9)]
    ds = tf.open(tf.write(data, tmp_path / "a.tbl", schema=schema))
    rows = [8, 0, 4, 4]
    for path in ds.leaf_paths:
        got, want = ds.values(path, rows), [ds[i][path] for i in rows]
        assert [type(g) for g in got] == [type(w) for w in want]
        assert [g.tolist() for g in got] == [w.tolist() for w in want], path


def test_values_of_arrays_and_compressed_heaps(tmp_path):
    pytest.importorskip("lz4")
    np = pytest.importorskip("numpy")
    schema = Schema({"s": Leaf("str"), "r": Leaf("var_array", dtype="float32", ndim=1),
                     "img": Leaf("image", shape=(2, 2, 3))})
    data = [{"s": "text " * (i % 50), "r": np.arange(i % 40, dtype=np.float32),
             "img": np.full((2, 2, 3), i % 256, np.uint8)} for i in range(3000)]
    ds = tf.open(tf.write(data, tmp_path / "c.tbl", schema=schema, compression="lz4"))
    rows = [2999, 0, 1234, 17, 17]
    assert ds.values("s", rows) == [data[i]["s"] for i in rows]
    for got, i in zip(ds.values("r", rows), rows, strict=True):
        assert np.array_equal(got, data[i]["r"]) and got.dtype == np.float32
    for got, i in zip(ds.values("img", rows), rows, strict=True):
        assert np.array_equal(got, data[i]["img"])


def test_values_refuse_broken_offsets(tmp_path, hdr):
    path = tf.write([{"s": f"row{i}"} for i in range(10)], tmp_path / "a.tbl")
    offsets = hdr.region(path, "s", "offsets")
    hdr.patch_u64(path, offsets["offset"] + 8 * 4, 1 << 40)  # end of row 3, start of row 4
    header = hdr.read(path)
    hdr.refresh_table_crc(path, header, "s", "offsets")
    ds = tf.open(path)
    assert ds.values("s", [0, 9]) == ["row0", "row9"]
    with pytest.raises(tf.OffsetsError, match="row 3"):
        ds.values("s", [0, 3])


def test_values_after_close_reopen_or_fail_clearly(tmp_path):
    ds = tf.open(tf.write(rows(0, 5), tmp_path / "a.tbl"))
    shard = ds.shard(0)
    assert shard.values("s", [4]) == ["s4"]
    ds.close()
    with pytest.raises(ValueError, match="closed"):
        shard.values("s", [0])
    assert ds.values("s", [1, 2]) == ["s1", "s2"]
