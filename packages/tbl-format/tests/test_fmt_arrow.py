"""Arrow export (tbl_format.arrow): batches equal the rows as the reader returns them, zero-copy where promised,
and DuckDB / Polars queries over a .tbl equal the same queries over a Parquet file of the same rows."""

from __future__ import annotations

import pytest

np = pytest.importorskip("numpy")
pa = pytest.importorskip("pyarrow")

import tbl_format as tf  # noqa: E402
from tbl_format.arrow import shard_batch  # noqa: E402


def _rows(n: int) -> list[dict]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        out.append({
            "x": rng.standard_normal(4).astype(np.float32),
            "id": i * 7 - 20,
            "f": i / 3,
            "b": i % 3 == 0,
            "text": "é日" * (i % 5) + f"row{i}",
            "blob": bytes(range(i % 7)),
            "tags": list(range(i % 4)),  # empty lists included
            "flags": [j % 2 == 0 for j in range(i % 11)],
            "words": ["a", "ñü", ""][: i % 4],
            "va": np.arange(i % 5, dtype=np.float32),  # 4-byte items, 16-byte aligned rows: gaps
            "vd": np.arange(i % 3, dtype=np.float64) * 2,  # 16 bytes a row at most: packed when even
            "m": np.full((i % 3, 2), i, np.int16),
            "meta": {"opt": None if i % 4 == 0 else i, "s": None if i % 2 else f"s{i}", "img": np.full((2, 2, 3), i, np.uint8),
                     "ol": None if i % 5 == 1 else [i, -i], "oa": None if i % 3 == 2 else np.ones(i % 4, np.int32)},
        })
    return out


def _py(v):
    """A value as Arrow's to_pylist gives it (the independent reference)."""
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, dict):
        raise AssertionError("leaf expected")
    return v


def _leaf(row: dict, path: str):
    for part in path.split("/"):
        row = row[part]
    return row


def _check(batch, rows: list[dict], which: list[int]) -> None:
    assert batch.num_rows == len(which)
    cols = {name: batch.column(name).to_pylist() for name in batch.schema.names}
    for k, i in enumerate(which):
        for name, col in cols.items():
            assert col[k] == _py(_leaf(rows[i], name)), (name, i)


@pytest.fixture(params=[None, "lz4"], ids=["raw", "lz4"])
def compression(request):
    if request.param == "lz4":
        pytest.importorskip("lz4")
    return request.param


def test_row_ranges_and_index_batches_equal_the_rows(tmp_path, compression):
    rows = _rows(60)
    path = tf.write(rows, tmp_path / "a", shard_rows=25, compression=compression)  # shards of 25, 25, 10
    with tf.open(path) as ds:
        assert [f.name for f in tf.arrow_schema(ds.schema)] == list(ds.schema.leaves)
        for a, z in [(0, 60), (3, 20), (20, 30), (25, 50), (59, 60), (7, 7)]:
            _check(tf.to_arrow_batch(ds, range(a, z)), rows, list(range(a, z)))
        for idx in ([5, 1, 49, -1, 30, 30], [33], list(range(59, -1, -3)), []):
            _check(tf.to_arrow_batch(ds, idx), rows, [i % 60 for i in idx])
        sel = tf.to_arrow_batch(ds, range(10, 40), leaves=["meta/s", "tags"])
        assert sel.schema.names == ["tags", "meta/s"]  # schema order
        _check(sel, rows, list(range(10, 40)))


def test_types_and_nulls(tmp_path):
    path = tf.write(_rows(8), tmp_path / "a.tbl")
    with tf.open(path) as ds:
        b = tf.to_arrow_batch(ds, range(0, 8))
    t = dict(zip(b.schema.names, b.schema.types, strict=True))
    assert t["text"] == pa.large_string() and t["blob"] == pa.large_binary()
    assert t["tags"] == pa.large_list(pa.int64()) and t["words"] == pa.large_list(pa.large_string())
    assert t["m"] == pa.large_list(pa.large_list(pa.int16()))
    assert t["meta/img"] == pa.list_(pa.list_(pa.list_(pa.uint8(), 3), 2), 2)
    assert b.column("meta/opt").null_count == 2 and b.column("meta/s").null_count == 4
    assert not b.schema.field("id").nullable and b.schema.field("meta/opt").nullable
    b.validate(full=True)


def test_a_row_range_of_one_shard_is_a_view_of_the_map(tmp_path):
    rows = [{"x": np.full(3, i, np.float32), "text": "ab" * i, "tags": [i] * (i % 3), "vd": np.ones(2 + i % 2 * 2) * i}
            for i in range(40)]
    path = tf.write(rows, tmp_path / "a.tbl")
    with tf.open(path) as ds:
        shard = ds.shard(0)
        b = shard_batch(shard, 5, 30)

        def addr(view) -> int:
            return np.frombuffer(view, np.uint8).ctypes.data

        x, text, tags, vd = (shard.buffers(p) for p in ("x", "text", "tags", "vd"))
        assert b.column("x").values.buffers()[1].address == addr(x.data) + 5 * 12
        assert b.column("text").buffers()[1].address == addr(text.offsets) + 5 * 8
        assert b.column("text").buffers()[2].address == addr(text.heap)
        assert b.column("tags").buffers()[1].address == addr(tags.offsets) + 5 * 8
        assert b.column("tags").values.buffers()[1].address == addr(tags.heap)
        assert b.column("vd").values.buffers()[1].address == addr(vd.heap) + (2 + 4 + 2 + 4 + 2) * 8  # packed: a view
    _check(b, rows, list(range(5, 30)))  # still readable after close: the batch keeps the map


def test_bad_rows_and_leaves(tmp_path):
    path = tf.write(_rows(5), tmp_path / "a.tbl")
    with tf.open(path) as ds:
        with pytest.raises(IndexError):
            tf.to_arrow_batch(ds, range(2, 6))
        with pytest.raises(IndexError):
            tf.to_arrow_batch(ds, [0, 5])
        with pytest.raises(TypeError):
            tf.to_arrow_batch(ds, [0.5])
        with pytest.raises(KeyError):
            tf.to_arrow_batch(ds, range(0, 2), leaves=["nope"])


def _parquet_twin(rows: list[dict], tmp_path):
    """The same rows in Parquet, built from the Python values with pyarrow (independent of the export)."""
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({
        "id": pa.array([r["id"] for r in rows], pa.int64()),
        "text": pa.array([r["text"] for r in rows], pa.large_string()),
        "tags": pa.array([r["tags"] for r in rows], pa.large_list(pa.int64())),
        "x": pa.array([r["x"].tolist() for r in rows], pa.list_(pa.float32(), 4)),
        "meta/opt": pa.array([r["meta"]["opt"] for r in rows], pa.int64()),
    })
    out = tmp_path / "twin.parquet"
    pq.write_table(table, out)
    return out


_QUERIES = [
    'SELECT id, text FROM {t} WHERE id % 3 = 0 ORDER BY id',
    'SELECT count(*), sum(len(tags)), sum(length(text)), count("meta/opt"), sum("meta/opt") FROM {t}',
    'SELECT id, tags, x[2] AS x1 FROM {t} WHERE len(tags) = 0 OR text LIKE \'%日%\' ORDER BY id DESC LIMIT 9',
]


def test_duckdb_queries_equal_parquet(tmp_path):
    duckdb = pytest.importorskip("duckdb")
    rows = _rows(70)
    path = tf.write(rows, tmp_path / "a", shard_rows=30)
    twin = _parquet_twin(rows, tmp_path)
    tbl = tf.to_arrow_dataset(path, batch_rows=16)
    con = duckdb.connect()
    con.register("tbl", tbl)
    for q in _QUERIES:
        got = con.execute(q.format(t="tbl")).fetchall()
        want = con.execute(q.format(t=f"read_parquet('{twin}')")).fetchall()
        assert got == want and got, q


def test_polars_queries_equal_parquet(tmp_path):
    pl = pytest.importorskip("polars")
    rows = _rows(70)
    path = tf.write(rows, tmp_path / "a", shard_rows=30)
    twin = _parquet_twin(rows, tmp_path)

    def query(frame):
        return (frame.filter(pl.col("id") % 2 == 0)
                .select("id", pl.col("text").str.len_chars().alias("n"), pl.col("tags").list.len().alias("k"),
                        pl.col("meta/opt"))
                .sort("id").collect())

    got = query(pl.scan_pyarrow_dataset(tf.to_arrow_dataset(path, leaves=["id", "text", "tags", "meta/opt"])))
    want = query(pl.scan_parquet(twin))
    assert got.height == 35 and got.equals(want)


def test_arrow_dataset_projects_leaves(tmp_path):
    path = tf.write(_rows(30), tmp_path / "a", shard_rows=12)
    ds = tf.to_arrow_dataset(path, batch_rows=5)
    table = ds.to_table(columns=["meta/s", "id"])
    assert table.column_names == ["meta/s", "id"]
    assert table.column("id").to_pylist() == [i * 7 - 20 for i in range(30)]
    assert ds.count_rows() == 30
    with pytest.raises(ValueError):
        tf.to_arrow_dataset(path, batch_rows=0)


def test_a_turboloader_v2_file_has_no_columns_to_export(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("tbl_golden_make", Path(__file__).parent / "golden" / "make_golden.py")
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    path = tmp_path / "v2.tbl"
    path.write_bytes(mg.v2_bytes([(im, mg.RAW_U8, 2, 3) for im in mg.raw_images(4, 3, 2, seed=1)]))
    with tf.open(path) as ds, pytest.raises(tf.ColumnarLayoutError, match="no per-leaf columns"):
        tf.to_arrow_batch(ds, range(0, 2))
