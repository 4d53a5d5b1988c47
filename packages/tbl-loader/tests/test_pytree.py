"""PyTree datasets: writing, ds[i], get_batch, projection, padding, pickling and the PyTreeLoader stream."""

from __future__ import annotations

import functools
import importlib.util
import pickle

import numpy as np
import pytest
from conftest import assert_tree_equal

import tbl_format
from tbl_format import write, write_parallel
from tbl_loader.pytree import Padded, PyTreeDataset, PyTreeLoader, collate_identity
from tbl_loader.stream import order

N = 101  # prime: every batch size and world size leaves a remainder


def make_sample(i: int) -> dict:
    return {
        "id": i,
        "x": i / 3.0,
        "ok": i % 3 == 0,
        "name": f"row-{i}-" + "é" * (i % 4),
        "raw": bytes(range(i % 9)),
        "arr": np.arange(6, dtype=np.float32).reshape(2, 3) * i,
        "seq": np.arange(i % 5, dtype=np.int16) + i,
        "nest": [np.uint8(i % 256), (f"t{i}", np.float64(i) / 7)],
    }


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return write((make_sample(i) for i in range(N)), tmp_path_factory.mktemp("pt") / "ds", variable=["seq"],
                 shard_rows=40)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return write((make_sample(i) for i in range(N)), tmp_path_factory.mktemp("pt") / "one.tbl", variable=["seq"])


def expected(i: int) -> dict:
    """What ds[i] returns for make_sample(i): numpy scalars come back as Python scalars."""
    s = make_sample(i)
    s["nest"] = [int(s["nest"][0]), (s["nest"][1][0], float(s["nest"][1][1]))]
    return s


@pytest.mark.parametrize("which", ["sharded", "single"])
def test_items_round_trip(which, request):
    ds = PyTreeDataset(request.getfixturevalue(which))
    assert len(ds) == N
    for i in (0, 1, 39, 40, 41, 80, N - 1):
        assert_tree_equal(ds[i], expected(i))
    assert_tree_equal(ds[-1], expected(N - 1))
    assert_tree_equal(ds[np.int64(7)], expected(7))
    rows = list(ds)
    assert len(rows) == N
    for i, row in enumerate(rows):
        assert_tree_equal(row, expected(i))
    with pytest.raises(IndexError):
        ds[N]


def test_item_arrays_are_read_only_views_unless_copied(sharded):
    assert not PyTreeDataset(sharded)[3]["arr"].flags.writeable
    copied = PyTreeDataset(sharded, copy_arrays=True)[3]
    assert copied["arr"].flags.writeable and copied["seq"].flags.writeable
    assert_tree_equal(copied, expected(3))


def stacked(ds, ids):
    """The reference batch: per-item reads stacked leaf by leaf."""
    items = [ds[int(i)] for i in ids]
    return {
        "id": np.array([s["id"] for s in items], dtype=np.int64),
        "x": np.array([s["x"] for s in items], dtype=np.float64),
        "ok": np.array([s["ok"] for s in items], dtype=bool),
        "name": [s["name"] for s in items],
        "raw": [s["raw"] for s in items],
        "arr": np.stack([s["arr"] for s in items]) if items else np.empty((0, 2, 3), np.float32),
        "seq": [np.array(s["seq"]) for s in items],
        "nest": [np.array([s["nest"][0] for s in items], dtype=np.int64),
                 ([s["nest"][1][0] for s in items], np.array([s["nest"][1][1] for s in items], dtype=np.float64))],
    }


@pytest.mark.parametrize("max_open", [64, 1])  # one kernel call over all shards / shards in groups
def test_get_batch_equals_stacked_items(sharded, max_open):
    ds = PyTreeDataset(sharded, max_open=max_open)
    ids = np.random.default_rng(1).integers(0, N, 77)
    batch = ds.get_batch(ids)
    assert_tree_equal(batch, stacked(ds, ids))
    assert ds.open_shards <= max_open
    for leaf in (batch["id"], batch["arr"], batch["seq"][0]):
        assert leaf.flags.writeable
    assert_tree_equal(ds[ids.tolist()], batch)
    assert_tree_equal(collate_identity(ds.__getitems__(ids.tolist())), batch)
    assert_tree_equal(ds[10:20], stacked(ds, range(10, 20)))
    assert_tree_equal(ds.get_batch([]), stacked(ds, []))
    assert_tree_equal(ds.get_batch([-1, 0]), stacked(ds, [N - 1, 0]))
    # Only variable-size leaves: negative rows take the same path through the full index check.
    names = PyTreeDataset(sharded, fields=["name", "raw"], max_open=max_open)
    assert names.get_batch(np.array([-1, 0, 5])) == {"name": [ds[N - 1]["name"], ds[0]["name"], ds[5]["name"]],
                                                    "raw": [ds[N - 1]["raw"], ds[0]["raw"], ds[5]["raw"]]}


def test_get_batch_rejects_bad_indices(sharded):
    ds = PyTreeDataset(sharded)
    with pytest.raises(IndexError, match="out of range"):
        ds.get_batch([0, N])
    with pytest.raises(IndexError, match="out of range"):
        ds.get_batch([-N - 1])
    with pytest.raises(TypeError, match="integers"):
        ds.get_batch([0.5])
    with pytest.raises(ValueError, match="one-dimensional"):
        ds.get_batch([[1, 2]])


def test_pad_mode(sharded):
    ds = PyTreeDataset(sharded, var="pad")
    ids = [4, 0, 13, 22]
    b = ds.get_batch(ids)
    seq = b["seq"]
    assert isinstance(seq, Padded)
    assert seq.lengths.tolist() == [[4], [0], [3], [2]]
    assert seq.data.shape == (4, 4) and seq.data.dtype == np.int16
    for row, i in enumerate(ids):
        n = i % 5
        assert np.array_equal(seq.data[row, :n], np.arange(n, dtype=np.int16) + i)
        assert not seq.data[row, n:].any()
        assert bytes(b["raw"].data[row, : b["raw"].lengths[row]]) == bytes(range(i % 9))
    assert b["name"] == [f"row-{i}-" + "é" * (i % 4) for i in ids]
    with pytest.raises(ValueError, match="var must be one of"):
        PyTreeDataset(sharded, var="ragged")


def test_leaf_selection_prunes_the_tree(sharded):
    ds = PyTreeDataset(sharded, fields=["id", "nest/1/1"])
    assert ds.leaf_paths == ["id", "nest/1/1"]
    assert ds[8] == {"id": 8, "nest": [(8 / 7,)]}
    b = ds.get_batch([8, 9])
    assert list(b) == ["id", "nest"] and np.array_equal(b["id"], [8, 9])
    assert list(ds)[8] == {"id": 8, "nest": [(8 / 7,)]}
    with pytest.raises(KeyError, match="no leaves"):
        PyTreeDataset(sharded, fields=["nope"])
    with pytest.warns(DeprecationWarning, match="leaves= is now fields="):
        older = PyTreeDataset(sharded, leaves=["id", "nest/1/1"])  # the older keyword, same selection
    assert older.leaf_paths == ds.leaf_paths and older[8] == ds[8]
    with pytest.raises(TypeError, match="fields= only"):
        PyTreeLoader(sharded, 4, fields=["id"], leaves=["id"])


def test_pickle_drops_maps_and_reopens(sharded):
    ds = PyTreeDataset(sharded)
    ds.get_batch([0, 50, 90])
    assert ds.open_shards == 3
    blob = pickle.dumps(ds)
    assert len(blob) < 2000  # path, options and fingerprint: no mapped data
    copy = pickle.loads(blob)
    assert copy.open_shards == 0
    assert_tree_equal(copy[45], expected(45))
    assert copy.open_shards == 1
    ds.close()
    assert ds.open_shards == 0
    assert_tree_equal(ds[2], expected(2))  # maps again on demand


def test_pickled_copy_detects_a_changed_dataset(tmp_path):
    path = write(({"a": i} for i in range(5)), tmp_path / "d.tbl")
    blob = pickle.dumps(PyTreeDataset(path))
    write(({"a": i} for i in range(6)), tmp_path / "d.tbl", overwrite=True)
    with pytest.raises(tbl_format.DatasetChangedError):
        pickle.loads(blob)[0]


def test_torch_tensors_are_written_as_arrays(tmp_path):
    torch = pytest.importorskip("torch")
    path = write(({"t": torch.arange(4, dtype=torch.float32) * i, "n": i} for i in range(3)), tmp_path / "t.tbl")
    ds = PyTreeDataset(path)
    assert np.array_equal(ds.get_batch([2])["t"], [[0.0, 2.0, 4.0, 6.0]])


def test_write_errors(tmp_path):
    with pytest.raises(KeyError, match="variable"):
        write([{"a": np.zeros(2)}], tmp_path / "x.tbl", variable=["b"])
    with pytest.raises(ValueError, match="only array leaves"):
        write([{"a": 1}], tmp_path / "x.tbl", variable=["a"])
    with pytest.raises(tbl_format.SchemaMismatchError, match="sample 1: leaf 'a': expected dtype float64, got int32"):
        write([{"a": np.zeros(2)}, {"a": np.zeros(3, np.int32)}], tmp_path / "x.tbl")
    assert not (tmp_path / "x.tbl").exists()


def _part(i: int, per: int) -> list[dict]:
    return [{"id": i * per + j, "s": "p" * j, "v": np.arange(j, dtype=np.int32)} for j in range(per)]


def _bad_part(i: int) -> list[dict]:
    if i == 1:
        raise RuntimeError("boom")
    return _part(i, 3)


@pytest.mark.parametrize("workers,kwargs", [(0, {}), (2, {"shard_rows": 2})])
def test_write_parallel_merges_parts_in_order(tmp_path, workers, kwargs):
    dst = write_parallel(functools.partial(_part, per=5), 3, tmp_path / "par", workers=workers, mp_context="fork",
                         variable=["v"], **kwargs)
    ds = PyTreeDataset(dst)
    assert np.array_equal(ds.get_batch(range(15))["id"], np.arange(15))
    assert ds[7]["s"] == "pp" and np.array_equal(ds[7]["v"], [0, 1])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["par"]  # temporaries removed


def test_write_parallel_failure_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="part 1 failed"):
        write_parallel(_bad_part, 3, tmp_path / "par", workers=0, variable=["v"])
    assert list(tmp_path.iterdir()) == []


# ---- PyTreeLoader -----------------------------------------------------------------------------


def loader_ids(loader, limit=None):
    """Concatenated ids of the next `limit` batches (or the rest of the epoch); checks each batch's rows."""
    out, it = [], iter(loader)
    for batch, idx in it:
        idx = np.asarray(idx)
        assert np.array_equal(np.asarray(batch["id"]), idx)
        assert [int(s.split("-")[1]) for s in batch["name"]] == idx.tolist()
        out.append(idx.copy())
        if limit is not None and len(out) == limit:
            break
    del it
    return np.concatenate(out) if out else np.empty(0, np.int64)


def test_loader_follows_the_epoch_order(sharded):
    loader = PyTreeLoader(sharded, 16, seed=3, return_indices=True, backend="numpy")
    for epoch in range(2):
        assert loader.epoch == epoch
        want = order.EpochOrder(N, 3, epoch).indices
        assert np.array_equal(loader_ids(loader), want)
    loader.close()


@pytest.mark.parametrize("prefetch,batch_size", [(0, 7), (3, 32), (1, 101)])
def test_loader_independent_of_prefetch_and_batch_size(sharded, prefetch, batch_size):
    ref = PyTreeLoader(sharded, 10, seed=5, return_indices=True, backend="numpy")
    other = PyTreeLoader(sharded, batch_size, seed=5, prefetch=prefetch, return_indices=True, backend="numpy")
    assert np.array_equal(loader_ids(ref), loader_ids(other))


def test_loader_resume_and_ranks(sharded):
    full = loader_ids(PyTreeLoader(sharded, 8, seed=9, return_indices=True, backend="numpy"))
    first = PyTreeLoader(sharded, 8, seed=9, return_indices=True, backend="numpy")
    head = loader_ids(first, limit=3)
    state = first.state_dict()
    resumed = PyTreeLoader(sharded, 5, seed=9, prefetch=0, return_indices=True, backend="numpy")
    resumed.load_state_dict(state)
    assert np.array_equal(np.concatenate([head, loader_ids(resumed)]), full)
    ranks = [loader_ids(PyTreeLoader(sharded, 8, seed=9, rank=r, world_size=2, padding="drop",
                                     return_indices=True, backend="numpy")) for r in range(2)]
    assert np.array_equal(np.sort(np.concatenate(ranks)), np.sort(full[: N - N % 2]))
    with pytest.raises(Exception, match="seed"):
        PyTreeLoader(sharded, 8, seed=10).load_state_dict(state)


def test_loader_batches_match_get_batch(sharded):
    torch = pytest.importorskip("torch")
    ds = PyTreeDataset(sharded, var="pad")
    loader = PyTreeLoader(sharded, 13, seed=2, var="pad", return_indices=True)
    for batch, idx in loader:
        ref = ds.get_batch(idx.numpy())
        assert isinstance(batch["arr"], torch.Tensor) and np.array_equal(batch["arr"].numpy(), ref["arr"])
        assert np.array_equal(batch["nest"][0].numpy(), ref["nest"][0])
        assert np.array_equal(batch["seq"].data.numpy(), ref["seq"].data)
        assert np.array_equal(batch["seq"].lengths.numpy(), ref["seq"].lengths)
        assert batch["name"] == ref["name"] and batch["ok"].dtype == torch.bool
    loader.close()


def test_loader_leaf_selection_and_drop_last(sharded):
    loader = PyTreeLoader(sharded, 25, shuffle=False, drop_last=True, fields=["arr"], backend="numpy")
    batches = list(loader)
    assert len(batches) == len(loader) == 4
    assert list(batches[0]) == ["arr"] and batches[0]["arr"].shape == (25, 2, 3)
    assert np.array_equal(batches[1]["arr"][0], make_sample(25)["arr"])


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_compressed_datasets_batch_like_uncompressed(tmp_path, codec):
    """get_batch (pytree and Arrow) and single rows of an LZ4 / zstd dataset equal the uncompressed dataset's."""
    pytest.importorskip({"lz4": "lz4", "zstd": "zstandard"}[codec])
    rows = [make_sample(i) for i in range(N)]
    plain = PyTreeDataset(write(rows, tmp_path / "p", variable=["seq"], shard_rows=40))
    packed = PyTreeDataset(write(rows, tmp_path / "c", variable=["seq"], shard_rows=40, compression=codec))
    assert tbl_format.open(tmp_path / "c").shard(0).describe()["columns"]["name"]["compression"] == codec
    for idx in ([5, 0, N - 1, 41, 41], range(30, 90), [7]):
        assert_tree_equal(packed.get_batch(idx), plain.get_batch(idx), str(idx))
    for i in (0, 39, 40, N - 1):
        assert_tree_equal(packed[i], plain[i], str(i))
    if importlib.util.find_spec("pyarrow") is not None:
        assert packed.get_batch(range(10, 70), format="arrow").equals(plain.get_batch(range(10, 70), format="arrow"))


def test_bare_leaf_samples_and_lz4(tmp_path):
    bare = PyTreeDataset(write(range(10), tmp_path / "bare.tbl"))
    assert bare[3] == 3 and np.array_equal(bare.get_batch([3, 1]), [3, 1])
    path = write(({"s": "ab" * i, "v": np.arange(i, dtype=np.float32)} for i in range(50)), tmp_path / "z.tbl",
                 variable=["v"], compression="lz4")
    b = PyTreeDataset(path, var="pad").get_batch([7, 2])
    assert b["s"] == ["ab" * 7, "ab" * 2] and b["v"].lengths.tolist() == [[7], [2]]
    assert np.array_equal(b["v"].data[1], [0, 1, 0, 0, 0, 0, 0])
