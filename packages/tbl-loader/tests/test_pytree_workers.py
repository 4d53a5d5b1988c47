"""PyTreeDataset inside torch DataLoader workers: fork and spawn, persistent workers, every row once per epoch."""

from __future__ import annotations

import numpy as np
import pytest

from tbl_format import write
from tbl_loader.pytree import PyTreeDataset, collate_identity, collate_tensors

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, default_collate  # noqa: E402

N = 103


@pytest.fixture(scope="module")
def three_shards(tmp_path_factory):
    samples = ({"id": i, "vec": np.full(4, i, np.float32), "name": f"n{i}"} for i in range(N))
    return write(samples, tmp_path_factory.mktemp("dl") / "ds", shard_rows=40)  # shards of 40, 40, 23 rows


def check_epoch(batches) -> None:
    """Every row exactly once; each row's leaves agree with its id."""
    ids = []
    for b in batches:
        batch_ids = np.asarray(b["id"])
        assert np.array_equal(np.asarray(b["vec"])[:, 0], batch_ids.astype(np.float32))
        assert b["name"] == [f"n{i}" for i in batch_ids.tolist()]
        ids.append(batch_ids)
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(N))


def test_fork_workers_see_every_row_once_per_epoch(three_shards):
    ds = PyTreeDataset(three_shards)
    ds.get_batch([0, 50, 100])  # the parent holds maps: forked workers must close their inherited copies
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, collate_fn=collate_identity,
                        multiprocessing_context="fork", persistent_workers=True)
    for _ in range(2):
        batches = list(loader)
        assert all(isinstance(b["vec"], np.ndarray) and b["vec"].flags.writeable for b in batches)
        check_epoch(batches)


def test_spawn_persistent_workers_with_tensor_batches(three_shards):
    ds = PyTreeDataset(three_shards)
    loader = DataLoader(ds, batch_size=16, shuffle=True, num_workers=2, collate_fn=collate_tensors,
                        multiprocessing_context="spawn", persistent_workers=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable array" warning from torch, ever
        for _ in range(2):
            batches = list(loader)
            assert isinstance(batches[0]["vec"], torch.Tensor) and batches[0]["id"].dtype == torch.int64
            check_epoch(batches)


@pytest.mark.parametrize("workers", [0, 2])
def test_default_collate_gives_the_values_of_collate_identity(three_shards, workers):
    """torch's default collate (no collate_fn) collates the rows one by one: the same values as the fast path."""
    ds = PyTreeDataset(three_shards)
    kw = dict(batch_size=16, shuffle=False, num_workers=workers)
    if workers:
        kw["multiprocessing_context"] = "spawn"
    fast = list(DataLoader(ds, collate_fn=collate_identity, **kw))
    default = list(DataLoader(ds, **kw))
    assert len(fast) == len(default) == -(-N // 16)
    for f, d in zip(fast, default, strict=True):
        assert torch.equal(d["id"], torch.from_numpy(f["id"]))
        assert torch.equal(d["vec"], torch.from_numpy(f["vec"]))
        assert d["name"] == f["name"]
    rows = ds.__getitems__([3, 1])
    assert torch.equal(default_collate(rows)["vec"], torch.from_numpy(ds.get_batch([3, 1])["vec"]))
    ds.close()
