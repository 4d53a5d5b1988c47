"""Leaves whose shape, length or presence varies, written without ``variable=``, read through PyTreeDataset and PyTreeLoader."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import assert_tree_equal

import tbl_format
from tbl_loader.pytree import Masked, Padded, PyTreeDataset, PyTreeLoader

N = 3000


def make_sample(i: int) -> dict:
    r = random.Random(i)
    return {
        "id": i,
        "tokens": np.arange(r.randrange(7), dtype=np.int32) + i,  # variable-length array
        "tags": [f"t{i}-{k}" for k in range(r.randrange(4))],  # variable-length list of str
        "scores": [i / 8] * (i % 3),  # variable-length list of float
        "label": None if i % 5 == 2 else i % 10,  # optional int
        "box": None if i % 9 == 4 else np.full(4, i, dtype=np.float32),  # optional fixed-shape array
        "caption": None if i % 4 == 1 else f"caption {i}",  # optional str
        "meta": {"src": f"s{i % 13}", "extra": {"w": i * 0.5, "maybe": None if i % 2 else [i]}},
    }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return tbl_format.write((make_sample(i) for i in range(N)), tmp_path_factory.mktemp("var") / "ds", shard_rows=1100)


def test_schema_states_what_varies(dataset):
    leaves = tbl_format.open(dataset).schema.leaves
    assert leaves["tokens"] == tbl_format.Leaf("var_array", dtype="int32", ndim=1)
    assert leaves["tags"] == tbl_format.Leaf("var_list", item="str")
    assert leaves["scores"] == tbl_format.Leaf("var_list", item="float")
    assert leaves["label"] == tbl_format.Leaf("int", optional=True)
    assert leaves["box"] == tbl_format.Leaf("array", dtype="float32", shape=(4,), optional=True)
    assert leaves["meta/extra/maybe"] == tbl_format.Leaf("var_list", item="int", optional=True)


def test_items_round_trip(dataset):
    ds = PyTreeDataset(dataset)
    assert len(ds) == N
    for i in range(N):
        assert_tree_equal(ds[i], make_sample(i), f"[{i}]")
    for i, row in enumerate(ds):
        assert_tree_equal(row, make_sample(i), f"iter[{i}]")


def reference_batch(ids, var):
    """The batch the docs promise, built from the samples alone."""
    rows = [make_sample(int(i)) for i in ids]

    def masked(values, shape, dtype):
        data = np.stack([np.zeros(shape, dtype) if v is None else np.asarray(v, dtype) for v in values]) if values \
            else np.empty((0, *shape), dtype)
        return Masked(data, np.array([v is not None for v in values], dtype=bool))

    tokens = [r["tokens"] for r in rows]
    scores = [r["scores"] for r in rows]
    maybe = [r["meta"]["extra"]["maybe"] for r in rows]
    if var == "pad":
        lengths = np.array([len(t) for t in tokens], dtype=np.int64).reshape(-1, 1)
        data = np.zeros((len(rows), int(lengths.max()) if rows else 0), np.int32)
        for b, t in enumerate(tokens):
            data[b, : len(t)] = t
        tokens = Padded(data, lengths)
        slen = np.array([len(s) for s in scores], dtype=np.int64)
        sdata = np.zeros((len(rows), int(slen.max()) if rows else 0))
        for b, s in enumerate(scores):
            sdata[b, : len(s)] = s
        scores = Padded(sdata, slen)
        mlen = np.array([len(m or []) for m in maybe], dtype=np.int64)
        mdata = np.zeros((len(rows), int(mlen.max()) if rows else 0), np.int64)
        for b, m in enumerate(maybe):
            mdata[b, : len(m or [])] = m or []
        maybe = Masked(Padded(mdata, mlen), np.array([m is not None for m in maybe], dtype=bool))
    return {
        "id": np.array([r["id"] for r in rows], dtype=np.int64),
        "tokens": tokens,
        "tags": [r["tags"] for r in rows],
        "scores": scores,
        "label": masked([r["label"] for r in rows], (), np.int64),
        "box": masked([r["box"] for r in rows], (4,), np.float32),
        "caption": [r["caption"] for r in rows],
        "meta": {"src": [r["meta"]["src"] for r in rows],
                 "extra": {"w": np.array([r["meta"]["extra"]["w"] for r in rows]), "maybe": maybe}},
    }


@pytest.mark.parametrize("var", ["list", "pad"])
@pytest.mark.parametrize("max_open", [64, 1])
def test_get_batch(dataset, var, max_open):
    ds = PyTreeDataset(dataset, var=var, max_open=max_open)
    ids = np.random.default_rng(3).integers(0, N, 300)
    assert_tree_equal(ds.get_batch(ids), reference_batch(ids, var))
    assert_tree_equal(ds.get_batch([]), reference_batch([], var))
    batch = ds.get_batch(ids)
    assert isinstance(batch["label"], Masked) and batch["label"].data.flags.writeable


@pytest.mark.parametrize("var", ["list", "pad"])
def test_loader_batches(dataset, var):
    loader = PyTreeLoader(dataset, 128, seed=4, var=var, return_indices=True, backend="numpy")
    seen = []
    for batch, idx in loader:
        assert_tree_equal(batch, reference_batch(idx, var))
        seen.append(np.asarray(idx).copy())
    loader.close()
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(N))


def test_fingerprint_is_the_datasets(dataset):
    assert PyTreeDataset(dataset).fingerprint == tbl_format.open(dataset).fingerprint


def _torch_to_numpy(value):
    """A torch-backend batch with every tensor as numpy (NamedTuples and containers kept)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, (Padded, Masked)):
        return type(value)(*(_torch_to_numpy(v) for v in value))
    if isinstance(value, dict):
        return {k: _torch_to_numpy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_torch_to_numpy(v) for v in value]
    return value


@pytest.mark.parametrize("var", ["list", "pad"])
def test_torch_loader_batches_hold_tensors_everywhere_numpy_has_arrays(dataset, var):
    torch = pytest.importorskip("torch")
    loader = PyTreeLoader(dataset, 256, seed=5, var=var, return_indices=True, backend="torch", prefetch=1)
    batch, idx = next(iter(loader))
    assert isinstance(batch["label"], Masked) and isinstance(batch["label"].present, torch.Tensor)
    if var == "pad":
        assert isinstance(batch["meta"]["extra"]["maybe"].data.data, torch.Tensor)
    else:
        assert all(t is None or isinstance(t, torch.Tensor) for t in batch["tokens"])
    assert_tree_equal(_torch_to_numpy(batch), reference_batch(idx.numpy(), var))
    loader.close()
