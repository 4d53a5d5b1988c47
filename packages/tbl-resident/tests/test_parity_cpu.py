"""device="cpu": the resident loader equals tbl_loader.ImageLoader element for element."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import N_IMAGES, bits, collect, make_images, write_dataset

from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_loader.stream import order
from tbl_resident import ResidentImageLoader


def both(path, batch_size, **kwargs):
    cpu = ImageLoader(path, batch_size, backend="torch", prefetch=0, **kwargs)
    res = ResidentImageLoader(path, batch_size, device="cpu", **kwargs)
    return cpu, res


def assert_same_epoch(cpu, res, limit=None):
    a = collect(cpu, limit)
    b = collect(res, limit)
    assert a[0].shape == b[0].shape
    assert a[0].dtype == b[0].dtype
    assert np.array_equal(a[0], b[0])
    assert np.array_equal(a[1], b[1])
    assert np.array_equal(a[2], b[2])
    return a


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("hflip", [0.0, 0.5])
def test_no_crop_parity(dataset_path, dtype, layout, hflip):
    cpu, res = both(dataset_path, 16, seed=3, hflip=hflip, dtype=dtype, layout=layout, shuffle=True)
    with cpu, res:
        got = assert_same_epoch(cpu, res)
        assert np.array_equal(got[2], order.epoch_permutation(N_IMAGES, 3, 0))
        assert cpu.state_dict() == res.state_dict()  # both moved to the start of epoch 1
        assert_same_epoch(cpu, res)  # epoch 1: a new permutation and new flips, still equal


def test_output_types_and_devices(dataset_path, labels):
    with ResidentImageLoader(dataset_path, 32, device="cpu", dtype="bfloat16", seed=1) as res:
        b = next(iter(res))
        assert b.images.dtype == torch.bfloat16 and b.images.shape == (32, 3, 12, 10)
        assert b.labels.dtype == torch.int64 and b.indices.dtype == torch.int64
        assert b.images.device.type == "cpu" and b.indices.device.type == "cpu"
        assert np.array_equal(b.labels.numpy(), labels[b.indices.numpy()])


def test_channels_last_equals_chw(dataset_path):
    with (ResidentImageLoader(dataset_path, 20, device="cpu", hflip=0.5, channels_last=True) as cl,
          ResidentImageLoader(dataset_path, 20, device="cpu", hflip=0.5) as plain):
        for a, b in zip(cl, plain, strict=True):
            assert a.images.shape == b.images.shape
            assert a.images.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(a.images, b.images)


def test_unshuffled_single_file_and_custom_table(single_file_path):
    kwargs = dict(shuffle=False, mean=(0.5, 0.25, 0.125), std=(0.1, 0.2, 0.3), dtype="float16")
    cpu, res = both(single_file_path, 64, **kwargs)
    with cpu, res:
        _, _, idx = assert_same_epoch(cpu, res)
    assert np.array_equal(idx, np.arange(N_IMAGES))


@pytest.mark.parametrize("drop_last", [False, True])
def test_center_crop_parity(dataset_path, drop_last):
    cpu, res = both(dataset_path, 25, seed=2, center_crop=(9, 7), hflip=0.5, drop_last=drop_last)
    with cpu, res:
        imgs, _, _ = assert_same_epoch(cpu, res)
    assert imgs.shape[1:] == (3, 9, 7)


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("dtype", ["float32", "uint8", "bfloat16"])
def test_random_resized_crop_is_exact(dataset_path, layout, dtype):
    """The integer separable filter reproduces the CPU kernel's fixed-point rule bit for bit."""
    crop = RandomResizedCrop((8, 6), scale=(0.2, 1.0))
    cpu, res = both(dataset_path, 20, seed=4, hflip=0.5, random_resized_crop=crop, dtype=dtype, layout=layout)
    with cpu, res:
        cpu.set_epoch(2)
        res.set_epoch(2)
        imgs, _, _ = assert_same_epoch(cpu, res)
    assert imgs.shape[1:] == ((3, 8, 6) if layout == "CHW" else (8, 6, 3))


def test_crop_upscale_and_downscale_match_reference(tmp_path):
    """Boxes both larger and smaller than the output (wide and narrow filters), against the numpy reference."""
    import tbl_kernels.reference as kref

    imgs = make_images(24, (40, 33, 3), seed=5)
    path = write_dataset(tmp_path / "big.tbl", imgs, np.arange(24))
    crop = RandomResizedCrop((11, 17), scale=(0.01, 1.0), ratio=(0.3, 3.0))
    with ResidentImageLoader(path, 24, device="cpu", seed=9, hflip=0.5, random_resized_crop=crop,
                             dtype="uint8", layout="HWC") as res:
        got, _, idx = collect(res)
    boxes = order.random_resized_crop_boxes(9, 0, idx, 40, 33, crop.scale, crop.ratio)
    assert (boxes[:, 2] > 11).any() and (boxes[:, 2] < 11).any()  # both filter regimes are exercised
    flip = order.flip_draws(9, 0, idx, 0.5)
    want = np.empty((24, 11, 17, 3), np.uint8)
    kref.gather_crop_resize([imgs], idx, boxes, want, None, flip, "HWC")
    assert np.array_equal(got, want)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("padding", ["wrap", "drop"])
def test_sharding_parity(dataset_path, world_size, padding):
    seen = []
    for rank in range(world_size):
        cpu, res = both(dataset_path, 8, seed=7, hflip=0.5, rank=rank, world_size=world_size, padding=padding)
        with cpu, res:
            assert len(cpu) == len(res)
            _, _, idx = assert_same_epoch(cpu, res)
        seen.append(idx)
    assert len({len(s) for s in seen}) == 1
    if padding == "drop":
        assert len(np.unique(np.concatenate(seen))) == sum(len(s) for s in seen)


def test_dataset_without_labels(tmp_path):
    imgs = make_images(9, (4, 4, 1))
    path = write_dataset(tmp_path / "nolabel.tbl", imgs)
    cpu, res = both(path, 4, mean=(0.5,), std=(0.5,), hflip=0.5)
    with cpu, res:
        got, lab, _ = assert_same_epoch(cpu, res)
    assert lab is None and got.shape == (9, 1, 4, 4)


def test_already_open_dataset_is_left_open(dataset_path, images):
    import tbl_format

    ds = tbl_format.open(dataset_path)
    with ResidentImageLoader(ds, 50, device="cpu", dtype="uint8", layout="HWC", shuffle=False) as res:
        got, _, _ = collect(res)
    assert np.array_equal(got, images)
    assert np.array_equal(ds.segments("image")[0], images[:40])  # still mapped
    ds.close()


def test_batches_are_new_tensors(dataset_path):
    """A kept batch is never overwritten by later ones (no ring slot is reused under the user)."""
    with ResidentImageLoader(dataset_path, 10, device="cpu", dtype="uint8") as res:
        it = iter(res)
        first = next(it)
        copy = first.images.clone()
        for _ in it:
            pass
        assert torch.equal(first.images, copy)
        assert bits(first.images).shape == (10, 3, 12, 10)


@pytest.mark.parametrize("aug", [{"hflip": 0.5}, {"hflip": 0.5, "random_resized_crop": RandomResizedCrop(8)}])
def test_subset_parity_and_resume(dataset_path, aug):
    """rows= / subsample=: the resident loader serves the subset ImageLoader serves, and resumes its states."""
    rows = np.arange(N_IMAGES - 1, 0, -3)
    for subset in ({"rows": rows}, {"subsample": 0.4}):
        cpu, res = both(dataset_path, 6, seed=5, **subset, **aug)
        with cpu, res:
            assert cpu.num_samples == res.num_samples < N_IMAGES
            assert_same_epoch(cpu, res)
            assert_same_epoch(cpu, res)  # epoch 1 too
        with ImageLoader(dataset_path, 6, backend="torch", prefetch=0, seed=5, **subset, **aug) as first:
            it = iter(first)
            head = [next(it).indices.clone() for _ in range(2)]
            state = first.state_dict()
            want = collect(first)
        with ResidentImageLoader(dataset_path, 4, device="cpu", seed=5, **subset, **aug) as second:
            second.load_state_dict(state)
            got = collect(second)
        assert len(head) == 2 and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
