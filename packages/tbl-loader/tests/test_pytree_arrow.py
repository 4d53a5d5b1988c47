"""PyTreeDataset.get_batch(..., format="arrow"): the same rows as get_batch's collated pytree, leaf by leaf."""

from __future__ import annotations

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from tbl_format import write  # noqa: E402
from tbl_loader.pytree import Masked, PyTreeDataset, collate_arrow  # noqa: E402


def _rows(n: int) -> list[dict]:
    rng = np.random.default_rng(3)
    return [{
        "x": rng.standard_normal(3).astype(np.float32),
        "id": i,
        "f": i * 0.25,
        "b": i % 2 == 1,
        "text": "ß→" * (i % 4) + str(i),
        "blob": bytes([i % 256]) * (i % 3),
        "tags": list(range(i % 5)),
        "words": ["κ"] * (i % 3),
        "va": np.arange(i % 4, dtype=np.int32),
        "nested": {"deep": {"opt": None if i % 3 == 0 else float(i), "img": np.full((2, 3), i, np.uint8)},
                   "ostr": None if i % 4 == 1 else f"o{i}"},
    } for i in range(n)]


def _leaf(tree, path: str):
    for part in path.split("/"):
        tree = tree[part]
    return tree


def _column(value, n: int) -> list:
    """One leaf of a collated pytree as n Python values (None where a row holds None)."""
    if isinstance(value, Masked):
        return [value.data[k].tolist() if value.present[k] else None for k in range(n)]
    if isinstance(value, np.ndarray):
        return [value[k].tolist() for k in range(n)]
    return [v.tolist() if isinstance(v, np.ndarray) else v for v in value]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(_rows(50), tmp_path_factory.mktemp("arrow") / "ds", shard_rows=20)


@pytest.mark.parametrize("indices", [range(0, 50), range(4, 17), range(15, 45), [49, 0, 21, 21, -3], np.arange(40, 2, -5)],
                         ids=["all", "in-shard", "across", "list", "array"])
def test_arrow_batch_equals_the_collated_pytree(path, indices):
    ds = PyTreeDataset(path)
    batch = ds.get_batch(indices, format="arrow")
    tree = ds.get_batch(indices)
    n = len(indices)
    assert isinstance(batch, pa.RecordBatch) and batch.num_rows == n
    assert batch.schema.names == ds.leaf_paths
    for name in ds.leaf_paths:
        assert batch.column(name).to_pylist() == _column(_leaf(tree, name), n), name


def test_slices_subsets_and_leaf_selection(path):
    ds = PyTreeDataset(path, leaves=["nested/ostr", "tags"], rows=range(10, 40))
    batch = ds.get_batch(range(5, 12), format="arrow")
    assert batch.schema.names == ["tags", "nested/ostr"]
    assert batch.column("tags").to_pylist() == [list(range(i % 5)) for i in range(15, 22)]
    assert batch.column("nested/ostr").to_pylist() == [None if i % 4 == 1 else f"o{i}" for i in range(15, 22)]
    assert ds.get_batch(range(0, 0), format="arrow").num_rows == 0
    with pytest.raises(IndexError):
        ds.get_batch(range(25, 31), format="arrow")
    with pytest.raises(ValueError, match="format"):
        ds.get_batch([0], format="table")


def test_collate_arrow(path):
    ds = PyTreeDataset(path)
    batch = collate_arrow(ds.__getitems__([3, 30, 7]))
    assert batch.column("id").to_pylist() == [3, 30, 7]
    assert collate_arrow([1, 2]) == [1, 2]
