"""Batches that torch and Lightning rebuild: every field survives their generic collection helpers."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
from conftest import make_images, tree_form

import tbl_format
from tbl_loader import (
    Batch,
    ImageDataset,
    ImageLoader,
    Mix,
    PyTreeBatch,
    PyTreeDataset,
    PyTreeLoader,
    RandomResizedCrop,
    TokenDataset,
    collate_identity,
    collate_tensors,
    write_tokens,
)
from tbl_loader.pytree import IndexedBatch

torch = pytest.importorskip("torch")
apply_func = pytest.importorskip("lightning.fabric.utilities.apply_func")
DataLoader = torch.utils.data.DataLoader

N = 24


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    images = make_images(N)
    rng = np.random.default_rng(5)
    samples = [{"image": images[i], "label": i % 3, "caption": f"photo {i}",
                "boxes": rng.random((i % 3, 4)).astype(np.float32), "score": i / 4.0} for i in range(N)]
    return tbl_format.write(samples, tmp_path_factory.mktemp("rebuild") / "ds", variable=["boxes"], shard_rows=10)


def _form(value):
    """A batch or any nested value as nested tuples that ``==`` compares exactly (tensors by their bytes)."""
    if isinstance(value, Batch):
        return ("Batch", tuple((f.name, _form(getattr(value, f.name))) for f in dataclasses.fields(Batch)))
    if isinstance(value, PyTreeBatch):
        return (type(value).__name__, _form(value.tree), _form(value.indices), _form(value.sources))
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), str(value.device), tree_form(value.numpy()))
    if isinstance(value, dict):
        return ("dict", tuple((k, _form(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_form(v) for v in value))
    return tree_form(value)


def _loader(path, **kw):
    return ImageLoader(path, 8, seed=1, hflip=0.5, fields=("caption", "boxes", "score"), prefetch=0, **kw)


def _check_moved(batch):
    moved = apply_func.move_data_to_device(batch, torch.device("cpu"))
    assert type(moved) is type(batch)
    assert _form(moved) == _form(batch)
    assert _form(pickle.loads(pickle.dumps(batch))) == _form(batch)  # what crosses a DataLoader worker's pipe
    return moved


@pytest.mark.parametrize("crops", [None, [RandomResizedCrop(8), RandomResizedCrop(6, scale=(0.3, 1.0))]])
def test_lightning_moves_an_image_batch_whole(path, crops):
    batch = next(iter(_loader(path, random_resized_crop=crops)))
    assert len(batch.views) == (1 if crops is None else 2) and batch.fields["caption"]
    _check_moved(batch)
    images, labels, indices = batch  # the former tuple's unpacking
    assert images is batch.images and labels is batch.labels and indices is batch.indices and batch[2] is indices
    # Lightning's generic path (no .to()): the dataclass rebuilt field by field, every tensor new.
    doubled = apply_func.apply_to_collection(batch, torch.Tensor, lambda t: t * 2)
    assert isinstance(doubled, Batch) and doubled.keys is batch.keys and doubled.images is doubled.views[0]
    assert torch.equal(doubled.views[-1], batch.views[-1] * 2)
    assert torch.equal(doubled.indices, batch.indices * 2) and doubled.fields["caption"] == batch.fields["caption"]
    assert all(torch.equal(a, b * 2) for a, b in zip(doubled.fields["boxes"], batch.fields["boxes"], strict=True))


def test_to_moves_every_tensor_and_keeps_the_keys(path):
    batch = next(iter(_loader(path, random_resized_crop=[RandomResizedCrop(8), RandomResizedCrop(6)])))
    meta = batch.to("meta")
    tensors = [*meta.views, meta.labels, meta.indices, meta.crop_boxes, meta.flips, meta.fields["score"],
               *meta.fields["boxes"]]
    assert all(t.device.type == "meta" for t in tensors) and meta.images is meta.views[0]
    assert meta.keys is batch.keys and meta.fields["caption"] is not None


def test_mix_batch_keeps_its_sources(path):
    mix = Mix([_loader(path), _loader(path, random_resized_crop=RandomResizedCrop((12, 10), scale=(0.5, 1.0)))],
              batch_size=8, seed=4, prefetch=0, return_sources=True)
    batch, sources = next(iter(mix))
    assert np.array_equal(batch.sources.numpy(), sources) and set(sources.tolist()) == {0, 1}
    moved = _check_moved(batch)
    assert torch.equal(moved.sources, batch.sources)
    mix.close()


def test_pytree_loader_indices(path):
    loader = PyTreeLoader(path, 8, seed=2, return_indices=True, leaves=["label", "score", "boxes"], prefetch=0)
    item = next(iter(loader))
    assert isinstance(item, IndexedBatch)
    tree, indices = item
    assert item.indices is indices and torch.equal(tree["label"], indices % 3)
    moved = apply_func.move_data_to_device(item, torch.device("cpu"))
    assert type(moved) is IndexedBatch and _form(moved) == _form(item)
    collated = torch.utils.data.default_collate([item, item])
    assert type(collated) is IndexedBatch and torch.equal(collated.indices, torch.stack([indices, indices]))


def test_a_pytree_batch_carries_its_rows_through_lightning_pickle_and_pin_memory(path, monkeypatch):
    loader = PyTreeLoader(path, 8, seed=2, fields=["label", "score", "boxes"], prefetch=0)
    batch = next(iter(loader))
    assert isinstance(batch, PyTreeBatch) and isinstance(batch, dict) and batch.sources is None
    assert sorted(batch) == ["boxes", "label", "score"] and batch == batch.tree and type(batch.tree) is dict
    assert torch.equal(batch["label"], batch.indices % 3)
    _check_moved(batch)
    meta = batch.to("meta")
    assert type(meta) is type(batch) and meta.indices.device.type == "meta" and meta["score"].device.type == "meta"
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda tensor, *args: tensor * 1)
    pinned = torch.utils.data._utils.pin_memory.pin_memory(batch)
    assert type(pinned) is type(batch) and _form(pinned) == _form(batch) and pinned.indices is not batch.indices


def test_pytree_batch_roots_of_every_container_kind(tmp_path):
    """A tuple or list root is the batch's own kind; a bare-value root stays bare (rows: return_indices=True)."""
    tuples = tbl_format.write(((i, f"s{i}") for i in range(10)), tmp_path / "tuples.tbl")
    batch = next(iter(PyTreeLoader(tuples, 4, seed=1, backend="numpy", prefetch=0)))
    assert isinstance(batch, tuple) and isinstance(batch, PyTreeBatch) and len(batch) == 2
    numbers, strings = batch
    assert strings == [f"s{i}" for i in batch.indices.tolist()] and np.array_equal(numbers, batch.indices)
    assert _form(pickle.loads(pickle.dumps(batch))) == _form(batch)
    lists = tbl_format.write(([i, 2 * i] for i in range(10)), tmp_path / "lists.tbl")
    batch = PyTreeDataset(lists).get_batch([7, 2])
    assert isinstance(batch, list) and isinstance(batch, PyTreeBatch) and batch.indices.tolist() == [7, 2]
    assert [v.tolist() for v in batch] == [[7, 2], [14, 4]]
    bare = tbl_format.write((i * 3 for i in range(10)), tmp_path / "bare.tbl")
    plain = next(iter(PyTreeLoader(bare, 4, seed=1, backend="numpy", prefetch=0)))
    assert type(plain) is np.ndarray
    tree, indices = next(iter(PyTreeLoader(bare, 4, seed=1, backend="numpy", prefetch=0, return_indices=True)))
    assert np.array_equal(tree, plain) and np.array_equal(tree, indices * 3)


def test_get_batch_indices_are_dataset_rows(path):
    """Through a subset, ``indices`` are the dataset's rows (as a loader's are), and never the caller's array."""
    ds = PyTreeDataset(path, fields=["label", "score"], rows=range(5, 20))
    asked = np.array([0, 3, -1], dtype=np.int64)
    batch = ds.get_batch(asked)
    assert batch.indices.tolist() == [5, 8, 19] and batch["score"].tolist() == [5 / 4, 8 / 4, 19 / 4]
    whole = PyTreeDataset(path, fields=["label"])
    own = whole.get_batch(asked[:2])
    asked[0] = 9
    assert own.indices.tolist() == [0, 3]
    tensors = next(iter(DataLoader(whole, batch_size=6, collate_fn=collate_tensors)))
    assert isinstance(tensors, PyTreeBatch) and torch.equal(tensors.indices, torch.arange(6))
    assert torch.equal(tensors["label"], tensors.indices % 3)


def test_mix_of_pytree_and_of_token_sources_carries_sources_and_rows(path, tmp_path):
    """Every Mix batch names each sample's source and its row there, as the pair form does."""
    def pytree_mix(**kw):
        return Mix([PyTreeDataset(path, fields=["label", "score"]), PyTreeDataset(path, fields=["label", "score"])],
                   weights=(0.5, 0.5), epoch_size=16, batch_size=8, seed=4, prefetch=0, **kw)

    with pytree_mix() as mix, pytree_mix(return_sources=True) as pairs:
        for batch, (tree, sources) in zip(mix, pairs, strict=True):
            assert isinstance(batch, PyTreeBatch) and np.array_equal(batch.sources, sources)
            assert set(sources.tolist()) <= {0, 1} and np.array_equal(batch["score"], batch.indices / 4.0)
            assert _form(batch) == _form(tree)  # the pair form's batch is the same batch
    tokens = [write_tokens([np.arange(k * 100, k * 100 + 60, dtype=np.int32)], tmp_path / f"t{k}") for k in (1, 2)]
    datasets = [TokenDataset(t, 4, backend="numpy") for t in tokens]
    with Mix(datasets, weights=(0.5, 0.5), epoch_size=12, batch_size=6, seed=2, prefetch=0) as mix:
        batch = next(iter(mix))
    assert set(batch.sources.tolist()) == {0, 1}
    for row, source, window in zip(batch.tokens, batch.sources.tolist(), batch.indices.tolist(), strict=True):
        assert row[0] // 100 == source + 1  # from the source it names
        assert np.array_equal(row, datasets[source].get_batch([window]).tokens[0])  # ... its window there


def test_dataloader_collate_identity_and_pin_memory(path, monkeypatch):
    loader = _loader(path)
    ds = ImageDataset.from_loader(loader)
    got = next(iter(DataLoader(ds, batch_size=8, collate_fn=collate_identity)))
    want = ds.get_batch(list(range(8)))
    assert isinstance(got, Batch) and _form(got) == _form(want)
    _check_moved(got)
    # torch's pin-memory step (the DataLoader's pin thread calls it on every batch) calls Batch.pin_memory,
    # which pins every tensor; pinning needs an accelerator, so a clone stands in for it here.
    pinned_ids = []

    def fake_pin(tensor, *args):
        copy = tensor.clone()
        pinned_ids.append(id(copy))
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    pinned = torch.utils.data._utils.pin_memory.pin_memory(got)
    assert type(pinned) is Batch and _form(pinned) == _form(got)
    tensors = [pinned.images, pinned.labels, pinned.indices, pinned.crop_boxes, pinned.flips, pinned.fields["score"],
               *pinned.fields["boxes"]]
    assert sorted(id(t) for t in tensors) == sorted(pinned_ids)


def test_default_collate_keeps_the_fields(path):
    ds = ImageDataset(path, fields=("caption", "score"), seed=1, hflip=0.5)
    images, labels, fields = next(iter(DataLoader(ds, batch_size=6, shuffle=False)))
    want = ds.get_batch(list(range(6)))
    assert torch.equal(images, want.images) and torch.equal(labels, want.labels)
    assert fields["caption"] == want.fields["caption"] and torch.equal(fields["score"], want.fields["score"])
    # A variable-size field (boxes) is in every sample too; stacking rows of different lengths is for a
    # collate_fn that knows them (torch's default refuses), or collate_identity.
    boxed = ImageDataset(path, fields=("caption", "boxes"), seed=1, hflip=0.5)
    image, label, row = boxed[4]
    assert torch.equal(row["boxes"], boxed.get_batch([4]).fields["boxes"][0]) and row["caption"] == "photo 4"
    assert row["boxes"].shape == (1, 4) and torch.equal(image, want.images[4]) and int(label) == 1
    plain = ImageDataset(path, seed=1)
    assert len(plain[3]) == 2  # without fields: (image, label), as before
