from __future__ import annotations

import array
import pickle

import pytest

import tbl_format as tf
from tbl_format import Leaf, Schema


def scalars(i: int) -> dict:
    return {"i": i - 5, "f": i / 3, "b": i % 2 == 0, "s": "é" * (i % 4) + str(i), "y": bytes([i % 256]) * (i % 3),
            "nest": [i, ("t" * i, {"deep": -i})]}


def test_scalar_kinds_round_trip_without_numpy(tmp_path, numpy_mode):
    rows = [scalars(i) for i in range(50)]
    ds = tf.open(tf.write(rows, tmp_path / "s.tbl"))
    assert len(ds) == 50
    assert [ds[i] for i in range(50)] == rows
    assert list(ds) == rows
    assert ds[-1] == rows[-1]
    got = ds[7]
    assert type(got["i"]) is int and type(got["f"]) is float and type(got["b"]) is bool
    assert type(got["s"]) is str and type(got["y"]) is bytes and type(got["nest"][1]) is tuple
    with pytest.raises(IndexError):
        ds[50]
    with pytest.raises(IndexError):
        ds[-51]
    assert ds.leaf_paths == ["i", "f", "b", "s", "y", "nest/0", "nest/1/0", "nest/1/1/deep"]


def test_extreme_scalars(tmp_path):
    rows = [{"i": v, "f": f, "s": s} for v, f, s in [(-(2**63), float("inf"), ""), (2**63 - 1, -0.0, "\x00\U0010ffff")]]
    ds = tf.open(tf.write(rows, tmp_path / "x.tbl"))
    assert list(ds) == rows and [ds[0], ds[1]] == rows


def test_arrays_from_stdlib_buffers(tmp_path, numpy_mode):
    schema = Schema({"v": Leaf("array", dtype="float32", shape=(3,)), "m": Leaf("array", dtype="int16", shape=(2, 2)),
                     "r": Leaf("var_array", dtype="int32", ndim=1)})
    rows = []
    for i in range(20):
        m = memoryview(array.array("h", [i, -i, 2 * i, 7]).tobytes()).cast("h", (2, 2))
        rows.append({"v": array.array("f", [i, i + 0.5, -i]), "m": m, "r": array.array("i", range(i % 5))})
    ds = tf.open(tf.write(rows, tmp_path / "a.tbl", schema=schema))
    for i, got in enumerate(ds):
        assert got["v"].tolist() == list(rows[i]["v"])
        assert got["m"].tolist() == rows[i]["m"].tolist()
        assert ds[i]["r"].tolist() == list(rows[i]["r"])
    seg = ds.segments("m")
    assert len(seg) == 1 and tuple(seg[0].shape) == (20, 2, 2)


def test_every_array_kind_with_numpy(tmp_path, numpy_mode):
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    schema = Schema({
        "image": Leaf("image", shape=(4, 5, 3)),
        "jpeg": Leaf("encoded_image", format="jpeg"),
        "h": Leaf("array", dtype="float16", shape=(2,)),
        "b": Leaf("array", dtype="bool", shape=(3,)),
        "u": Leaf("array", dtype="uint64", shape=()),
        "boxes": Leaf("var_array", dtype="float64", ndim=2),
        "empty": Leaf("var_array", dtype="uint8", ndim=1),
    })
    rows = [{
        "image": rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
        "jpeg": rng.integers(0, 256, i, dtype=np.uint8).tobytes(),
        "h": np.array([i, -0.5], np.float16),
        "b": np.array([i % 2, 1, 0], bool),
        "u": np.array(2**64 - 1 - i, np.uint64),
        "boxes": rng.standard_normal((i % 4, 4)),
        "empty": np.zeros(0, np.uint8),
    } for i in range(30)]
    path = tf.write(rows, tmp_path / "n.tbl", schema=schema)
    ds = tf.open(path)
    for i, got in enumerate(list(ds)):
        for k in ("image", "h", "b", "u", "boxes", "empty"):
            want = rows[i][k]
            arr = np.asarray(got[k]) if numpy_mode == "numpy" else np.asarray(memoryview(got[k]))
            if k == "h" and numpy_mode != "numpy":  # float16 without numpy: the raw bits as uint16
                arr = arr.view(np.float16)
            if k == "b" and numpy_mode != "numpy":
                arr = arr.astype(bool)
            if want.size == 0 and numpy_mode != "numpy":  # memoryview cannot hold a shape with a zero: 1-D, empty
                assert arr.size == 0
                continue
            assert arr.shape == want.shape and np.array_equal(arr, want), k
        assert got["jpeg"] == rows[i]["jpeg"]
    if numpy_mode == "numpy":
        img = ds[3]["image"]
        assert img.dtype == np.uint8 and not img.flags.writeable
        col = ds.segments("image")[0]
        assert col.shape == (30, 4, 5, 3) and np.array_equal(col[3], rows[3]["image"])
        assert np.shares_memory(col, ds[3]["image"])
        base = col
        while isinstance(base, np.ndarray):
            base = base.base
        owner = base.obj if isinstance(base, memoryview) else base
        assert type(owner).__name__ == "mmap"  # the column is a view of the file map, not a copy
        assert np.array_equal(ds.segments("u")[0], [r["u"] for r in rows])


def test_torch_tensors_written(tmp_path):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    rows = [{"t": torch.arange(6, dtype=torch.float32).reshape(2, 3) * i, "n": torch.tensor(i)} for i in range(4)]
    ds = tf.open(tf.write(rows, tmp_path / "t.tbl"))
    assert np.array_equal(ds[2]["t"], rows[2]["t"].numpy()) and ds[2]["n"] == 2


def test_root_leaf_and_empty_containers(tmp_path):
    ds = tf.open(tf.write(["a", "bc"], tmp_path / "r.tbl"))
    assert list(ds) == ["a", "bc"] and ds.leaf_paths == [""]
    ds = tf.open(tf.write([{"x": [], "y": {}}] * 3, tmp_path / "e.tbl"))
    assert list(ds) == [{"x": [], "y": {}}] * 3 and ds[1] == {"x": [], "y": {}}


def test_zero_rows_with_schema(tmp_path, numpy_mode):
    schema = Schema({"a": Leaf("int"), "s": Leaf("str"), "v": Leaf("array", dtype="float32", shape=(2,))})
    ds = tf.open(tf.write([], tmp_path / "z.tbl", schema=schema))
    assert len(ds) == 0 and list(ds) == []
    assert len(ds.segments("v")[0]) == 0
    ds.verify()
    with pytest.raises(ValueError, match="no schema"):
        tf.write([], tmp_path / "z2.tbl")
    assert not (tmp_path / "z2.tbl").exists()


def test_metadata_and_pickle(tmp_path):
    md = {"class_names": ["cat", "dog"], "preprocessing": {"size": 224}, "user": {"note": "é"}}
    path = tf.write([{"a": i} for i in range(5)], tmp_path / "m.tbl", metadata=md)
    ds = tf.open(path)
    assert ds.metadata == md
    ds2 = pickle.loads(pickle.dumps(ds))
    assert "not opened" in repr(ds2)  # maps again lazily
    ds3 = pickle.loads(pickle.dumps(ds2))
    assert "not opened" in repr(ds2) and "not opened" in repr(ds3)
    assert ds2[4] == {"a": 4} and len(ds2) == 5 and ds2.metadata == md
    with pytest.raises(ValueError, match="JSON"):
        tf.Writer(tmp_path / "bad.tbl", metadata={"x": float("nan")})


def test_pickle_detects_changed_schema(tmp_path):
    path = tf.write([{"a": 1}], tmp_path / "p.tbl")
    blob = pickle.dumps(tf.open(path))
    tf.write([{"a": "now a str"}], path, overwrite=True)
    with pytest.raises(tf.DatasetChangedError):
        pickle.loads(blob)[0]


def test_chunked_iteration_spans_chunks(tmp_path):
    rows = [{"s": "x" * (i % 7), "i": i} for i in range(9000)]
    ds = tf.open(tf.write(rows, tmp_path / "c.tbl"))
    assert list(ds) == rows


def test_index_accepts_integer_like(tmp_path):
    np = pytest.importorskip("numpy")
    ds = tf.open(tf.write([{"a": i} for i in range(3)], tmp_path / "i.tbl"))
    assert ds[np.int64(2)] == {"a": 2}
    with pytest.raises(TypeError):
        ds[1.0]
