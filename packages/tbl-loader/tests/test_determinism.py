"""The same stream, produced different ways, is identical element for element."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import N_IMAGES, collect

from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_loader.stream import order

AUG = {"seed": 7, "hflip": 0.5, "random_resized_crop": RandomResizedCrop(8, scale=(0.3, 1.0))}


def _stream(path, **kwargs):
    args = {"backend": "numpy", **AUG, **kwargs}
    with ImageLoader(path, **args) as loader:
        loader.set_epoch(3)
        return collect(loader)


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)


@pytest.fixture(scope="module")
def straight(dataset_path):
    return _stream(dataset_path, batch_size=16, prefetch=2)


def test_reference_stream_is_the_epoch_permutation(straight):
    _, _, idx = straight
    assert np.array_equal(idx, order.epoch_permutation(N_IMAGES, 7, 3))


def test_prefetch_does_not_change_the_stream(dataset_path, straight):
    _same(_stream(dataset_path, batch_size=16, prefetch=0), straight)
    _same(_stream(dataset_path, batch_size=16, prefetch=5), straight)


def test_thread_count_does_not_change_the_stream(dataset_path, straight):
    import tbl_kernels

    before = tbl_kernels.get_num_threads()
    try:
        _same(_stream(dataset_path, batch_size=16, num_threads=1), straight)
        _same(_stream(dataset_path, batch_size=16, num_threads=2), straight)
    finally:
        tbl_kernels.set_num_threads(before)


def test_batch_size_does_not_change_the_stream(dataset_path, straight):
    _same(_stream(dataset_path, batch_size=7), straight)
    _same(_stream(dataset_path, batch_size=64), straight)


def test_torch_backend_gives_the_same_stream(dataset_path, straight):
    pytest.importorskip("torch")
    _same(_stream(dataset_path, batch_size=16, backend="torch"), straight)


def test_single_file_and_sharded_directory_agree(single_file_path, straight):
    _same(_stream(single_file_path, batch_size=16), straight)


def test_two_ranks_interleave_back_into_the_single_rank_stream(dataset_path, straight):
    parts = [_stream(dataset_path, batch_size=8, world_size=2, rank=r) for r in range(2)]
    assert len(parts[0][2]) == len(parts[1][2]) == 51  # 101 padded to 102
    for field in range(3):
        joined = np.stack([parts[0][field], parts[1][field]], axis=1).reshape(-1, *parts[0][field].shape[1:])
        assert np.array_equal(joined[:N_IMAGES], straight[field])
    # The one padded sample wraps around to the start of the permutation, augmentations included.
    assert parts[1][2][-1] == straight[2][0]
    assert np.array_equal(parts[1][0][-1], straight[0][0])


def test_epochs_differ_and_auto_advance(dataset_path):
    loader = ImageLoader(dataset_path, 50, backend="numpy", seed=1)
    assert loader.epoch == 0
    e0 = collect(loader)[2]
    assert loader.epoch == 1 and loader.consumed == 0
    e1 = collect(loader)[2]
    assert loader.epoch == 2
    assert np.array_equal(e0, order.epoch_permutation(N_IMAGES, 1, 0))
    assert np.array_equal(e1, order.epoch_permutation(N_IMAGES, 1, 1))
    loader.set_epoch(0)
    assert np.array_equal(collect(loader)[2], e0)
    loader.close()


def test_shuffle_off_is_in_order(dataset_path):
    with ImageLoader(dataset_path, 30, shuffle=False, backend="numpy") as loader:
        assert np.array_equal(collect(loader)[2], np.arange(N_IMAGES))
        assert np.array_equal(collect(loader)[2], np.arange(N_IMAGES))
