"""Inferred schemas widen as samples differ: variable-shape arrays, variable-length lists, optional and none leaves."""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import random

import pytest

import tbl_format as tf
from tbl_format import Leaf, Schema, SchemaMismatchError

HAS_NUMPY = importlib.util.find_spec("numpy") is not None
HAS_LZ4 = importlib.util.find_spec("lz4") is not None
N = 3000


def make_sample(i: int) -> dict:
    """Every kind of variation, first seen at different rows (some only after many rows)."""
    r = random.Random(i)
    s = {
        "id": i,
        "tags": [f"t{i}-{k}" + "é" * (k % 2) for k in range(r.randrange(4))],  # [] first, then lengths vary
        "scores": [r.random() for _ in range((i % 3) + 1)],
        "flags": [k % 2 == 0 for k in range(i % 5)],
        "counts": [i, -i] if i < 1500 else [i],  # a fixed length for half the dataset
        "maybe": None if i % 7 == 3 else i * 2,  # first None at row 3
        "late_none": None if i == 2500 else f"v{i}",  # one None, late
        "nothing": None,  # None in every sample
        "first_none": None if i < 10 else [float(i)],  # None first, then a list
        "meta": {"name": f"row{i}", "inner": {"opt": None if i % 2 else i / 4, "deep": (i, f"d{i}")}},
    }
    if HAS_NUMPY:
        import numpy as np

        s["vec"] = np.arange(i % 6, dtype=np.float32) * i  # shape varies from row 1 on
        s["img"] = np.full((2, 3) if i < 2000 else (3, 2), i % 256, dtype=np.uint8)  # varies late
        s["maybe_arr"] = None if i % 11 == 5 else np.arange(3, dtype=np.int16) + i
    return s


def assert_same(got, want, path=""):
    if HAS_NUMPY:
        import numpy as np

        if isinstance(want, np.ndarray):
            assert isinstance(got, np.ndarray), path
            assert got.dtype == want.dtype and np.array_equal(got, want), path
            return
    assert type(got) is type(want), (path, got, want)
    if isinstance(want, dict):
        assert list(got) == list(want), path
        for k in want:
            assert_same(got[k], want[k], f"{path}/{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for k, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}/{k}")
    else:
        assert got == want, path


def expected_schema() -> Schema:
    tree = {
        "id": Leaf("int"),
        "tags": Leaf("var_list", item="str"),
        "scores": Leaf("var_list", item="float"),
        "flags": Leaf("var_list", item="bool"),
        "counts": Leaf("var_list", item="int"),
        "maybe": Leaf("int", optional=True),
        "late_none": Leaf("str", optional=True),
        "nothing": Leaf("none"),
        "first_none": Leaf("var_list", item="float", optional=True),
        "meta": {"name": Leaf("str"), "inner": {"opt": Leaf("float", optional=True),
                                                "deep": (Leaf("int"), Leaf("str"))}},
    }
    if HAS_NUMPY:
        tree["vec"] = Leaf("var_array", dtype="float32", ndim=1)
        tree["img"] = Leaf("var_array", dtype="uint8", ndim=2)
        tree["maybe_arr"] = Leaf("array", dtype="int16", shape=(3,), optional=True)
    return Schema(tree)


@pytest.mark.parametrize("layout", ["file", "shards", "lz4"])
def test_3000_varying_samples_round_trip_without_variable(tmp_path, layout):
    if layout == "lz4" and not HAS_LZ4:
        pytest.skip("needs lz4")
    kwargs = {"shards": {"shard_rows": 700}, "lz4": {"compression": "lz4"}}.get(layout, {})
    dst = tmp_path / ("ds" if layout == "shards" else "d.tbl")
    ds = tf.open(tf.write((make_sample(i) for i in range(N)), dst, **kwargs), verify=True)
    assert ds.schema == expected_schema()
    assert len(ds) == N
    want = [make_sample(i) for i in range(N)]
    for i in range(N):
        assert_same(ds[i], want[i], f"[{i}]")
    for i, row in enumerate(ds):
        assert_same(row, want[i], f"iter[{i}]")
    rows = list(range(N - 1, -1, -3))
    for path in ds.leaf_paths:
        keys = path.split("/")

        def pick(s, keys=keys):
            for k in keys:
                s = s[int(k)] if isinstance(s, tuple) else s[k]
            return s

        assert_same(ds.values(path, rows), [pick(want[i]) for i in rows], path)
    if layout == "file":
        assert ds.shard(0).version == (1, 1)


def test_files_without_new_kinds_stay_format_1_0(tmp_path):
    ds = tf.open(tf.write([{"a": i, "s": "x" * i} for i in range(5)], tmp_path / "a.tbl"))
    assert ds.shard(0).version == (1, 0)


def test_a_late_variation_rewrites_nothing_already_written(tmp_path, monkeypatch):
    """Promotions of a leaf (None, another shape) keep the bytes written so far: no row is read again."""
    from tbl_format import writer

    def no_rewrite(*args, **kwargs):
        raise AssertionError("rows were rewritten")

    monkeypatch.setattr(writer, "rewrite", no_rewrite)
    samples = [{"a": i, "s": f"s{i}"} for i in range(1000)] + [{"a": None, "s": None}]
    ds = tf.open(tf.write(samples, tmp_path / "a.tbl"))
    assert ds.schema == Schema({"a": Leaf("int", optional=True), "s": Leaf("str", optional=True)})
    assert [ds[i] for i in (0, 999, 1000)] == [{"a": 0, "s": "s0"}, {"a": 999, "s": "s999"}, {"a": None, "s": None}]


def test_real_mismatches_stay_named_errors(tmp_path):
    cases = [
        ({"a": 1}, {"a": "x"}, r"sample 1: leaf 'a': expected an int, got str"),
        ({"a": "x"}, {"a": 2}, r"sample 1: leaf 'a': expected a str, got int"),
        ({"a": [1, 2]}, {"a": ["x"]}, r"sample 1: leaf 'a'"),
        ({"a": [1, 2]}, {"a": [1, "x"]}, r"sample 1: leaf 'a/1': expected an int, got str"),
        ({"a": {"b": 1}}, {"a": {"c": 1}}, r"sample 1: leaf 'a': dict keys differ"),
        ({"a": (1, 2)}, {"a": (1,)}, r"sample 1: leaf 'a': expected 2 elements"),
        ({"a": {"b": 1}}, {"a": None}, r"sample 1: leaf 'a': expected a dict, got NoneType"),
    ]
    for n, (first, second, match) in enumerate(cases):
        with pytest.raises(SchemaMismatchError, match=match):
            tf.write([first, second], tmp_path / f"m{n}.tbl")
        assert not (tmp_path / f"m{n}.tbl").exists()
    with pytest.raises(SchemaMismatchError, match=r"sample 2: leaf 'a': list item: expected a str, got int"):
        tf.write([{"a": ["x"]}, {"a": ["x", "y"]}, {"a": ["x", 3]}], tmp_path / "l.tbl")


def test_variable_makes_leaves_variable_from_the_start(tmp_path):
    np = pytest.importorskip("numpy")
    samples = [{"v": np.zeros(3, np.float32), "t": ["a", "b"]}] * 2
    ds = tf.open(tf.write(samples, tmp_path / "v.tbl", variable=["v", "t"]))
    assert ds.schema == Schema({"v": Leaf("var_array", dtype="float32", ndim=1), "t": Leaf("var_list", item="str")})
    with pytest.raises(KeyError, match="variable"):
        tf.write(samples, tmp_path / "x.tbl", variable=["nope"])
    with pytest.raises(ValueError, match="only array leaves"):
        tf.write([{"a": 1}], tmp_path / "x.tbl", variable=["a"])
    with pytest.raises(ValueError, match="either schema or variable"):
        tf.write(samples, tmp_path / "x.tbl", variable=["v"], schema=ds.schema)


def test_none_leaves_and_optional_kinds_without_numpy(tmp_path, numpy_mode):
    rows = [{"n": None, "o": None if i % 2 else [i, i + 1][: i % 3 + 1], "b": None if i == 1 else bytes([i])}
            for i in range(6)]
    ds = tf.open(tf.write(rows, tmp_path / "n.tbl"))
    assert [ds[i] for i in range(6)] == rows
    assert list(ds) == rows
    with pytest.raises(ValueError, match="no column view"):
        ds.segments("n")
    present = ds.present_segments("b")[0]
    assert [bool(x) for x in present] == [i != 1 for i in range(6)]


def _part(i: int) -> list[dict]:
    # Part 0 sees one list length and no None; part 1 other lengths and a None.
    return [{"id": i * 10 + j, "t": ["a", "b"] if i == 0 else ["c"] * j, "o": None if (i, j) == (1, 2) else j}
            for j in range(4)]


@pytest.mark.parametrize("workers", [0, 2])
def test_write_parallel_joins_parts_of_different_inferred_schemas(tmp_path, workers):
    dst = tf.write_parallel(functools.partial(_part), 3, tmp_path / "par", workers=workers, mp_context="fork")
    ds = tf.open(dst)
    assert ds.schema == Schema({"id": Leaf("int"), "t": Leaf("var_list", item="str"), "o": Leaf("int", optional=True)})
    assert list(ds) == [s for i in range(3) for s in _part(i)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["par"]


def _bad_part(i: int) -> list[dict]:
    if i == 1:
        raise RuntimeError("boom")
    return _part(i)


def test_write_parallel_failure_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="part 1 failed"):
        tf.write_parallel(_bad_part, 3, tmp_path / "par", workers=0)
    assert list(tmp_path.iterdir()) == []


def _reference_fingerprint(ds) -> str:
    """The formula tbl_loader.stream.state.dataset_fingerprint applied to a tbl_format.Dataset (tbl-loader 0.1.0)."""
    body = {
        "rows": len(ds),
        "segment_rows": list(ds.segment_rows),
        "shard_headers": [entry.get("header_crc32") for entry in ds.shard_entries],
        "schema": ds.schema.fingerprint,
        "metadata": ds.metadata,
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def test_fingerprint_is_the_loader_state_formula(tmp_path):
    rows = [{"i": i, "s": "x" * i, "f": i / 2} for i in range(10)]
    one = tf.open(tf.write(rows, tmp_path / "a.tbl", metadata={"class_names": ["a"]}))
    many = tf.open(tf.write(rows, tmp_path / "d", shard_rows=4))
    for ds in (one, many):
        assert ds.fingerprint == _reference_fingerprint(ds)
    # Pinned to the value tbl-format 0.1.0 wrote and tbl-loader 0.1.0 computed for these rows: saved state dicts resume.
    assert one.fingerprint == "18135005355c0f77a7d6a37fb459f915"
    assert one.fingerprint != tf.open(tf.write(rows[:9], tmp_path / "b.tbl")).fingerprint
