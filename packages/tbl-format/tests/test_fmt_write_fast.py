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
