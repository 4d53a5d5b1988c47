"""The generated row encoder's inlined appends (Column.append_code) store what the general path stores."""

from __future__ import annotations

import pytest

import tbl_format as tf


def test_int_lists_str_and_bytes_round_trip_and_misfits_are_named(tmp_path):
    np = pytest.importorskip("numpy")
    rows = [{"tags": [i, -i, 2**62] if i % 3 else [], "t": "ü" * (i % 4), "raw": bytes(i % 5), "o": [i] * (i % 3)}
            for i in range(1, 300)]
    rows[7]["tags"] = [np.int64(5), 6]  # not plain ints: the general path converts them
    path = tf.write(rows, tmp_path / "a.tbl", variable=["tags", "o"])
    with tf.open(path) as ds:
        assert [ds[i] for i in range(len(ds))] == [
            {**r, "tags": [int(x) for x in r["tags"]]} for r in rows
        ]
    with pytest.raises(tf.SchemaMismatchError, match=r"sample 1: leaf 'tags'.*bool"):
        tf.write([{"tags": [1]}, {"tags": [1, True]}], tmp_path / "b.tbl", variable=["tags"])
    with pytest.raises(tf.SchemaMismatchError, match=r"sample 1: leaf 'tags'.*int64"):
        tf.write([{"tags": [1]}, {"tags": [2**63]}], tmp_path / "c.tbl", variable=["tags"])
    assert not (tmp_path / "b.tbl").exists() and not (tmp_path / "c.tbl").exists()


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_inlined_appends_write_the_general_paths_bytes(tmp_path, monkeypatch, compression):
    """Byte for byte the same file as the general path (Column.append), compressed heaps included: rows of
    str, bytes and int lists over several heap blocks, so that blocks are cut and compressed mid-row."""
    pytest.importorskip("lz4" if compression == "lz4" else "zstandard" if compression == "zstd" else "array")
    from tbl_format import columns, writer

    rows = [{"t": "ab" * (i % 97) + str(i), "raw": bytes([i % 251]) * (i % 113), "tags": list(range(1 + i % 9))}
            for i in range(4000)]
    fast = tf.write(rows, tmp_path / "fast.tbl", variable=["tags"], compression=compression)
    for cls in (columns.VarColumn, columns.ListColumn):
        monkeypatch.setattr(cls, "append_code", columns.Column.append_code)
    monkeypatch.setattr(writer.FileWriter, "_compile_chunk", lambda self: None)
    general = tf.write(rows, tmp_path / "general.tbl", variable=["tags"], compression=compression)
    assert fast.read_bytes() == general.read_bytes()
    with tf.open(fast) as ds:
        assert [ds[i] for i in (0, 1999, 3999)] == [rows[0], rows[1999], rows[3999]]


def _rows_of_every_chunk_kind(n):
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(0)
    return [{"id": i, "score": i / 7, "flag": i % 3 == 0, "name": "é" * (i % 5) + str(i),
             "x": rng.standard_normal(4).astype(np.float32), "tags": list(range(i % 6)) if i else [7],
             "meta": {"lang": ["en", "fr"][i % 2], "pair": (i, [i, i + 1])}} for i in range(n)]


def _one_by_one(rows, path, **kw):
    with tf.Writer(path, **kw) as w:
        for row in rows:
            w.write(row)
    return path


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("shard_rows", [None, 700])
def test_column_wise_chunks_write_the_row_by_row_bytes(tmp_path, compression, shard_rows):
    """write() encodes up to 2,048 rows leaf by leaf (FileWriter.append_chunk): every kind with a column-wise
    form, nested dicts, lists and tuples, chunks cut at shard ends: the bytes of writing each row alone."""
    if compression:
        pytest.importorskip("zstandard")
    rows = _rows_of_every_chunk_kind(5000)
    kw = dict(variable=["tags", "meta/pair/1"], compression=compression, shard_rows=shard_rows)
    chunked = tf.write(rows, tmp_path / "chunked", **kw)
    single = _one_by_one(rows, tmp_path / "single", **kw)
    files = sorted(p.name for p in single.glob("*.tbl")) if shard_rows else [None]
    if shard_rows:
        assert len(files) == 8
        token = lambda p: p.name.split("-")[1]  # noqa: E731  (shard names carry a per-writer token)
        pairs = [(a, b) for a in sorted(chunked.glob("*.tbl")) for b in sorted(single.glob("*.tbl"))
                 if a.name.replace(token(a), "") == b.name.replace(token(b), "")]
        assert len(pairs) == 8 and all(a.read_bytes() == b.read_bytes() for a, b in pairs)
    else:
        assert chunked.read_bytes() == single.read_bytes()
    with tf.open(chunked) as ds:
        assert ds[4999]["meta"]["pair"][1] == [4999, 5000] and ds[2048]["name"] == "é" * 3 + "2048"
    with tf.Writer(tmp_path / "probe.tbl", variable=["tags", "meta/pair/1"], compression=compression) as w:
        w.write(rows[0])
        assert w._file.append_chunk is not None and w._file.append_chunk(rows[1:3000])  # the schema has the form


def test_a_misfit_inside_a_chunk_is_named_by_its_sample_and_nothing_is_published(tmp_path):
    rows = _rows_of_every_chunk_kind(5000)
    rows[3001]["tags"] = [1, "2"]
    with pytest.raises(tf.SchemaMismatchError, match=r"sample 3001: leaf 'tags'"):
        tf.write(rows, tmp_path / "a.tbl", variable=["tags", "meta/pair/1"])
    assert not (tmp_path / "a.tbl").exists()


def test_rows_the_chunks_cannot_take_are_written_one_by_one_with_the_same_bytes(tmp_path):
    """numpy scalars, a widening None (the leaf becomes optional) and an int past int64's range in a float
    leaf's chunk: the chunk falls back to the rows one by one, which convert, widen or refuse as before."""
    np = pytest.importorskip("numpy")
    rows = _rows_of_every_chunk_kind(4500)
    rows[100]["id"] = np.int64(100)
    rows[2500]["name"] = None
    chunked = tf.write(rows, tmp_path / "chunked.tbl", variable=["tags", "meta/pair/1"])
    single = _one_by_one(rows, tmp_path / "single.tbl", variable=["tags", "meta/pair/1"])
    assert chunked.read_bytes() == single.read_bytes()
    with tf.open(chunked) as ds:
        assert ds[2500]["name"] is None and ds[100]["id"] == 100 and ds[4499]["name"] == "é" * 4 + "4499"
