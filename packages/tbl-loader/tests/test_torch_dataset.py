"""ImageDataset (map-style) against ImageLoader: the same batches, through torch's DataLoader too."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tbl_loader import EpochBatchSampler, ImageDataset, ImageLoader, RandomResizedCrop, collate_identity
from tbl_loader.image import EpochBatch

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

CROP = RandomResizedCrop(8, scale=(0.25, 1.0))
ROWS = np.arange(100, 3, -3)


def _loader(path, **kw):
    kw.setdefault("hflip", 0.5)
    kw.setdefault("random_resized_crop", CROP)
    kw.setdefault("prefetch", 0)
    return ImageLoader(path, **kw)


def _copy(batch):
    return tuple(None if x is None else x.clone() for x in batch)


def _assert_batches_equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("subset", [None, ROWS])
def test_get_batch_is_the_loaders_batch(dataset_path, subset):
    loader = _loader(dataset_path, batch_size=7, seed=4, rows=subset)
    ds = ImageDataset.from_loader(loader)
    assert len(ds) == loader.num_samples
    for epoch in range(2):
        sampler = EpochBatchSampler(loader)
        plans = list(sampler)
        assert len(plans) == len(sampler) == len(loader)
        assert all(isinstance(p, EpochBatch) and p.epoch == epoch for p in plans)
        want = [_copy(b) for b in loader]
        got = [ds.get_batch(p) for p in plans]
        _assert_batches_equal(got, want)
    ds.set_epoch(1)
    image, label = ds[3]  # plain positions use ds.epoch
    ref = ds.get_batch(EpochBatch([3], 1))
    assert torch.equal(image, ref.images[0]) and torch.equal(label, ref.labels[0])
    copy = pickle.loads(pickle.dumps(ds))
    _assert_batches_equal([copy.get_batch(EpochBatch([0, 5], 1))], [ds.get_batch(EpochBatch([0, 5], 1))])
    for x in (loader, ds, copy):
        x.close()


def test_dataloader_with_two_spawn_workers_yields_the_loaders_epoch(dataset_path):
    loader = _loader(dataset_path, batch_size=8, seed=9, rows=ROWS)
    ds = ImageDataset.from_loader(loader)
    sampler = EpochBatchSampler(loader)
    dl = DataLoader(ds, batch_sampler=sampler, collate_fn=collate_identity, num_workers=2,
                    multiprocessing_context="spawn", persistent_workers=True)
    for _ in range(2):  # persistent workers: the epoch travels with each batch of positions
        got = [_copy(b) for b in dl]
        want = [_copy(b) for b in loader]
        _assert_batches_equal(got, want)
    del dl
    loader.close()


def test_default_collate_stacks_the_same_samples(dataset_path):
    loader = _loader(dataset_path, batch_size=8, seed=2)
    ds = ImageDataset.from_loader(loader)
    dl = DataLoader(ds, batch_sampler=EpochBatchSampler(loader))  # torch's default collate
    got = list(dl)  # the sampler plans from the loader's position: before the loader moves on
    want = [_copy(b) for b in loader]
    for (images, labels), w in zip(got, want, strict=True):
        assert torch.equal(images, w[0]) and torch.equal(labels, w[1])
    loader.close()


def test_len_is_the_epoch_and_batches_left_the_rest(dataset_path):
    loader = _loader(dataset_path, batch_size=10, seed=1)
    assert len(loader) == loader.batches_left == 11
    it = iter(loader)
    for _ in range(4):
        next(it)
    del it  # break
    sampler = EpochBatchSampler(loader)
    assert len(loader) == len(sampler) == 11  # the epoch's length does not move with the position
    assert loader.batches_left == sampler.batches_left == 7 == len(list(sampler)) == len(list(loader))
    assert len(loader) == loader.batches_left == 11  # the next epoch is whole again
    state_loader = _loader(dataset_path, batch_size=10, seed=1)
    it = iter(state_loader)
    next(it)
    state = state_loader.state_dict()
    resumed = _loader(dataset_path, batch_size=4, seed=1)
    resumed.load_state_dict(state)
    assert len(resumed) == -(-101 // 4)
    assert resumed.batches_left == len(list(resumed)) == -(-(101 - 10) // 4)
    two = [_loader(dataset_path, batch_size=4, seed=1, rank=r, world_size=2) for r in range(2)]
    for x in two:
        x.load_state_dict(state)
        assert x.batches_left == len(list(x)) == 12  # ceil(ceil(91 / 2) / 4)
        assert len(x) == 13  # ceil(ceil(101 / 2) / 4)
    for x in (loader, state_loader, resumed, *two):
        x.close()


def test_numpy_backend_and_unlabelled(tmp_path, images):
    from conftest import write_dataset

    path = write_dataset(tmp_path / "nolabel.tbl", images[:20])
    ds = ImageDataset(path, backend="numpy", dtype="uint8", hflip=1.0)
    batch = ds.get_batch([0, 19])
    assert batch.labels is None and np.array_equal(batch.images[0], images[0][:, ::-1].transpose(2, 0, 1))
    assert np.array_equal(ds[19], batch.images[1])
    with pytest.raises(IndexError):
        ds.get_batch([20])
    with pytest.raises(TypeError, match="not both"):
        ImageDataset(path, spec=ds.spec, hflip=0.5)
    ds.close()


class _AsIterable(torch.utils.data.IterableDataset):
    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_loader_refuses_to_run_in_several_dataloader_workers(dataset_path, workers):
    """Each of several workers would serve the whole epoch: refused by name. One worker serves it once."""
    from tbl_loader.errors import LoaderInWorkersError

    with _loader(dataset_path, batch_size=10, seed=1) as loader:
        dl = DataLoader(_AsIterable(loader), batch_size=None, num_workers=workers, multiprocessing_context="fork",
                        timeout=120)
        if workers > 1:
            with pytest.raises(LoaderInWorkersError, match="would serve every batch 2 times"):
                list(dl)
        else:
            rows = torch.cat([b[2] for b in dl])  # (images, labels, indices)
            assert sorted(rows.tolist()) == list(range(101))
