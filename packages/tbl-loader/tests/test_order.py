"""The counter-based generator, permutations, augmentation draws and sharding of tbl_loader.stream.order."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tbl_loader.stream import order

MASK = (1 << 64) - 1
G = 0x9E3779B97F4A7C15


def _mix_py(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _hash_py(seed: int, epoch: int, tag: int, i: int) -> int:
    """The generator exactly as the module docstring specifies it, on Python integers."""
    key = _mix_py(_mix_py(_mix_py((seed + G) & MASK) ^ ((epoch + G) & MASK)) ^ ((tag + G) & MASK))
    return _mix_py(_mix_py((i + G) & MASK) ^ key)


def test_hash_matches_the_documented_definition():
    for seed, epoch, tag in [(0, 0, 1), (12345, 7, 2), (MASK, MASK, 49), (2**63, 1, 16)]:
        ids = np.array([0, 1, 2, 1000, 2**40, MASK], dtype=np.uint64)
        got = order.hash_u64(seed, epoch, tag, ids)
        assert [int(v) for v in got] == [_hash_py(seed, epoch, tag, int(i)) for i in ids]


def test_hash_known_answers_pin_the_stream():
    # Changing these values breaks every saved state: bump ORDER_VERSION if you must.
    assert _mix_py((0 + G) & MASK) == 0xE220A8397B1DCDAF  # first SplitMix64 output for seed 0
    got = order.hash_u64(0, 0, order.TAG_PERMUTATION, np.arange(3))
    assert [int(v) for v in got] == [_hash_py(0, 0, 1, i) for i in range(3)]
    assert hex(int(got[0])) == "0x2283b90e77646cb9"


def test_hash_broadcasts_tags_against_counters():
    tags = np.arange(3)[:, None]
    ids = np.arange(5)
    grid = order.hash_u64(9, 2, tags, ids)
    assert grid.shape == (3, 5)
    for t in range(3):
        assert np.array_equal(grid[t], order.hash_u64(9, 2, t, ids))


def test_uniform_range_and_bits():
    u = order.uniform(1, 2, 3, np.arange(20000))
    assert u.dtype == np.float64
    assert u.min() >= 0.0 and u.max() < 1.0
    h = order.hash_u64(1, 2, 3, np.arange(20000))
    assert np.array_equal(u, (h >> np.uint64(11)).astype(np.float64) / 2.0**53)
    # Loose sanity of the distribution (a broken mix would fail by far).
    assert abs(u.mean() - 0.5) < 0.01
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert counts.min() > 1800


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, True, "0"])
def test_bad_seed_is_rejected(bad):
    with pytest.raises((ValueError, TypeError), match="seed"):
        order.hash_u64(bad, 0, 1, np.arange(3))


def test_negative_or_float_counters_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        order.hash_u64(0, 0, 1, np.array([-1]))
    with pytest.raises(TypeError, match="integer"):
        order.hash_u64(0, 0, 1, np.array([0.5]))


def test_permutation_is_a_deterministic_permutation():
    p = order.epoch_permutation(1000, seed=5, epoch=3)
    assert p.dtype == np.int64
    assert np.array_equal(np.sort(p), np.arange(1000))
    assert np.array_equal(p, order.epoch_permutation(1000, seed=5, epoch=3))
    assert not np.array_equal(p, order.epoch_permutation(1000, seed=5, epoch=4))
    assert not np.array_equal(p, order.epoch_permutation(1000, seed=6, epoch=3))
    keys = [_hash_py(5, 3, order.TAG_PERMUTATION, i) for i in range(1000)]
    assert list(p) == sorted(range(1000), key=lambda i: (keys[i], i))


def test_permutation_without_shuffle_is_identity():
    assert np.array_equal(order.epoch_permutation(10, 1, 1, shuffle=False), np.arange(10))
    assert order.epoch_permutation(0, 1, 1).shape == (0,)


def test_flip_draws_are_per_sample():
    ids = np.arange(5000)
    f = order.flip_draws(4, 1, ids, 0.5)
    assert f.dtype == bool
    assert 0.45 < f.mean() < 0.55
    sub = np.array([4999, 3, 17, 3])
    assert np.array_equal(order.flip_draws(4, 1, sub, 0.5), f[sub])
    assert not order.flip_draws(4, 1, ids, 0.0).any()
    assert order.flip_draws(4, 1, ids, 1.0).all()
    assert np.array_equal(f, order.uniform(4, 1, order.TAG_FLIP, ids) < 0.5)
    with pytest.raises(ValueError, match="probability"):
        order.flip_draws(4, 1, ids, 1.5)


def test_deterministic_exp_and_log_are_accurate():
    x = np.linspace(-6.0, 6.0, 20001)
    assert np.max(np.abs(order._exp(x) / np.exp(x) - 1.0)) < 4e-15
    for v in [0.75, 4.0 / 3.0, 0.5, 2.0, 1.0, 1e-6, 1234.5]:
        assert abs(order._log(v) - math.log(v)) <= 4e-16 * max(1.0, abs(math.log(v)))
    with pytest.raises(ValueError, match="positive"):
        order._log(0.0)


def _torchvision_params(u_scale, u_ratio, u_top, u_left, height, width, scale, ratio):
    """RandomResizedCrop.get_params transcribed with the same uniform draws (libm exp/log)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for a in range(10):
        target_area = area * (scale[0] + u_scale[a] * (scale[1] - scale[0]))
        aspect = math.exp(log_ratio[0] + u_ratio[a] * (log_ratio[1] - log_ratio[0]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            return [int(u_top * (height - h + 1)), int(u_left * (width - w + 1)), h, w]
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return [(height - h) // 2, (width - w) // 2, h, w]


@pytest.mark.parametrize(
    "height,width,scale,ratio",
    [(100, 160, (0.08, 1.0), (3 / 4, 4 / 3)), (64, 64, (0.5, 1.0), (0.5, 2.0)), (50, 30, (0.9, 1.0), (1.0, 1.0))],
)
def test_crop_boxes_follow_torchvision_algorithm(height, width, scale, ratio):
    ids = np.arange(3000) * 7 + 11
    boxes = order.random_resized_crop_boxes(3, 2, ids, height, width, scale, ratio)
    assert boxes.dtype == np.int32 and boxes.shape == (3000, 4)
    a = np.arange(10)[:, None]
    us = order.uniform(3, 2, order.TAG_CROP_SCALE + a, ids)
    ur = order.uniform(3, 2, order.TAG_CROP_RATIO + a, ids)
    ut = order.uniform(3, 2, order.TAG_CROP_TOP, ids)
    ul = order.uniform(3, 2, order.TAG_CROP_LEFT, ids)
    expected = [
        _torchvision_params(us[:, i], ur[:, i], ut[i], ul[i], height, width, scale, ratio)
        for i in range(len(ids))
    ]
    assert boxes.tolist() == expected
    top, left, h, w = boxes.T
    assert (h > 0).all() and (w > 0).all()
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= height).all() and (left + w <= width).all()


def test_crop_fallback_when_no_attempt_fits():
    # Scale above 1 can never fit: every sample takes the central fallback box.
    boxes = order.random_resized_crop_boxes(0, 0, np.arange(50), 100, 160, scale=(2.0, 3.0), ratio=(1.0, 1.0))
    assert (boxes == np.array([0, 30, 100, 100])).all()


def test_crop_boxes_are_per_sample_and_validated():
    ids = np.arange(200)
    full = order.random_resized_crop_boxes(1, 1, ids, 80, 80)
    assert np.array_equal(order.random_resized_crop_boxes(1, 1, ids[50:60], 80, 80), full[50:60])
    assert order.random_resized_crop_boxes(1, 1, ids[:0], 80, 80).shape == (0, 4)
    with pytest.raises(ValueError, match="ratio"):
        order.random_resized_crop_boxes(1, 1, ids, 80, 80, ratio=(0.0, 1.0))
    with pytest.raises(ValueError, match="scale"):
        order.random_resized_crop_boxes(1, 1, ids, 80, 80, scale=(1.0, 0.5))


def test_center_crop_box():
    assert order.center_crop_box(160, 160, 128, 128).tolist() == [16, 16, 128, 128]
    assert order.center_crop_box(101, 100, 50, 51).tolist() == [26, 24, 50, 51]  # round half to even
    with pytest.raises(ValueError, match="fit"):
        order.center_crop_box(100, 100, 101, 10)


@pytest.mark.parametrize("n,world", [(100, 1), (100, 4), (103, 4), (5, 8), (1, 3)])
def test_rank_shards_cover_the_permutation(n, world):
    orders = [order.EpochOrder(n, seed=3, epoch=1, world_size=world, rank=r) for r in range(world)]
    perm = orders[0].permutation
    counts = {len(o.indices) for o in orders}
    assert counts == {-(-n // world)}
    joined = np.stack([o.indices for o in orders], axis=1).reshape(-1)  # interleave back
    pad = (-n) % world
    assert np.array_equal(joined, np.concatenate([perm, np.resize(perm, pad)]))


def test_drop_padding_truncates_to_equal_disjoint_shards():
    orders = [order.EpochOrder(103, 3, 1, world_size=4, rank=r, padding="drop") for r in range(4)]
    all_ids = np.concatenate([o.indices for o in orders])
    assert {len(o.indices) for o in orders} == {25}
    assert len(np.unique(all_ids)) == 100
    assert np.array_equal(np.sort(all_ids), np.sort(orders[0].permutation[:100]))


def test_start_resumes_the_rest_with_any_world_size():
    perm = order.EpochOrder(60, 9, 0).permutation
    for world in (1, 2, 3, 5):
        orders = [order.EpochOrder(60, 9, 0, world_size=world, rank=r, start=20) for r in range(world)]
        joined = np.stack([o.indices for o in orders], axis=1).reshape(-1)
        assert np.array_equal(joined[:40], perm[20:])


def test_batches_and_consumed_counts():
    o = order.EpochOrder(50, 1, 2, world_size=2, rank=1, start=10)
    plans = list(o.batches(7, drop_last=False))
    assert [len(p.sample_ids) for p in plans] == [7, 7, 6]
    assert [p.consumed for p in plans] == [24, 38, 50]
    assert [p.last for p in plans] == [False, False, True]
    assert np.array_equal(np.concatenate([p.sample_ids for p in plans]), o.indices)
    assert all(p.sample_ids.flags.c_contiguous and p.epoch == 2 for p in plans)
    dropped = list(o.batches(7, drop_last=True))
    assert len(dropped) == 2 and dropped[-1].last
    assert o.num_batches(7, False) == 3 and o.num_batches(7, True) == 2


def test_batch_size_does_not_change_the_stream():
    o = order.EpochOrder(300, 4, 5, world_size=3, rank=2)
    a = np.concatenate([p.sample_ids for p in o.batches(7, False)])
    b = np.concatenate([p.sample_ids for p in o.batches(64, False)])
    assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"world_size": 0}, "world_size"),
        ({"world_size": 2, "rank": 2}, "rank"),
        ({"padding": "pad"}, "padding"),
        ({"start": 11}, "start"),
        ({"seed": -3}, "seed"),
    ],
)
def test_epoch_order_validation(kwargs, match):
    args = {"num_samples": 10, "seed": 0, "epoch": 0, **kwargs}
    with pytest.raises(ValueError, match=match):
        order.EpochOrder(**args)
