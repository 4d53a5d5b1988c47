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
    from tbl_format import columns

    rows = [{"t": "ab" * (i % 97) + str(i), "raw": bytes([i % 251]) * (i % 113), "tags": list(range(1 + i % 9))}
            for i in range(4000)]
    fast = tf.write(rows, tmp_path / "fast.tbl", variable=["tags"], compression=compression)
    for cls in (columns.VarColumn, columns.ListColumn):
        monkeypatch.setattr(cls, "append_code", columns.Column.append_code)
    general = tf.write(rows, tmp_path / "general.tbl", variable=["tags"], compression=compression)
    assert fast.read_bytes() == general.read_bytes()
    with tf.open(fast) as ds:
        assert [ds[i] for i in (0, 1999, 3999)] == [rows[0], rows[1999], rows[3999]]
