"""Subsets (rows=, subsample=): what they select, and that order, resume and sharding hold on them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import N_IMAGES, reference_images

import tbl_format
from tbl_loader import ImageLoader, PyTreeDataset, PyTreeLoader, RandomResizedCrop
from tbl_loader.errors import StateMismatchError, SubsetError
from tbl_loader.stream import order
from tbl_loader.stream.subset import resolve_rows

SUBSET = np.array([97, 3, 55, 10, 11, 12, 60, 61, 0, 100, 42, 41, 40, 39, 7, 8, 9, 70, 71, 72, 73, 5, 50], np.int64)


def _loader(path, **kw):
    kw.setdefault("backend", "numpy")
    kw.setdefault("prefetch", 0)
    kw.setdefault("hflip", 0.5)
    kw.setdefault("random_resized_crop", RandomResizedCrop(8, scale=(0.3, 1.0)))
    return ImageLoader(path, **kw)


def _epoch(loader):
    images, labels, indices = [], [], []
    for b in loader:
        images.append(np.array(b.images))
        labels.append(np.array(b.labels))
        indices.append(np.array(b.indices))
    return np.concatenate(images), np.concatenate(labels), np.concatenate(indices)


# ---- resolve_rows ---------------------------------------------------------------------------------

def test_resolve_rows_forms():
    assert resolve_rows(10) is None
    assert np.array_equal(resolve_rows(10, range(2, 8, 2)), [2, 4, 6])
    assert np.array_equal(resolve_rows(10, [-1, 0]), [9, 0])
    assert np.array_equal(resolve_rows(10, np.array([5, 1], np.uint8)), [5, 1])
    with pytest.raises(SubsetError, match="out of range"):
        resolve_rows(10, [10])
    with pytest.raises(SubsetError, match="more than once"):
        resolve_rows(10, [1, 2, 1])
    with pytest.raises(SubsetError, match="no row"):
        resolve_rows(10, [])
    with pytest.raises(SubsetError, match="integers"):
        resolve_rows(10, [0.5])
    for bad in (0.0, 1.5, -0.1, float("nan"), True, "0.5"):
        with pytest.raises(SubsetError, match="fraction"):
            resolve_rows(10, subsample=bad)
    with pytest.raises(SubsetError, match="selects no row"):
        resolve_rows(10, subsample=0.01)


def test_subsample_is_deterministic_nested_and_ordered():
    n = 10_000
    small, large = resolve_rows(n, subsample=0.01), resolve_rows(n, subsample=0.1)
    assert small.shape[0] == 100 and large.shape[0] == 1000
    assert np.all(np.diff(small) > 0)  # original order
    assert set(small.tolist()) <= set(large.tolist())  # a smaller fraction is inside a larger one
    assert np.array_equal(small, resolve_rows(n, subsample=0.01))
    # of explicit rows: chosen among them, in their order
    rows = np.arange(n - 1, -1, -1)
    sub = resolve_rows(n, rows, subsample=0.01)
    assert np.array_equal(np.sort(sub), small) and np.all(np.diff(sub) < 0)
    assert np.array_equal(resolve_rows(n, subsample=1.0), np.arange(n))


# ---- loaders --------------------------------------------------------------------------------------

@pytest.mark.parametrize("shuffle", [True, False])
def test_image_loader_serves_exactly_the_subset(dataset_path, images, labels, shuffle):
    loader = _loader(dataset_path, batch_size=5, rows=SUBSET, shuffle=shuffle, seed=3)
    assert loader.num_samples == len(SUBSET) and len(loader) == 5
    got_images, got_labels, got_rows = _epoch(loader)
    assert sorted(got_rows.tolist()) == sorted(SUBSET.tolist())
    if not shuffle:
        assert np.array_equal(got_rows, SUBSET)
    else:
        expected_positions = order.epoch_permutation(len(SUBSET), 3, 0)
        assert np.array_equal(got_rows, SUBSET[expected_positions])
    assert np.array_equal(got_labels, labels[got_rows])
    # augmentation is drawn from the dataset row: the same as the whole dataset's loader for that row
    expected = reference_images(images, got_rows, seed=3, epoch=0, hflip=0.5, dtype="float32", layout="CHW",
                                crop=RandomResizedCrop(8, scale=(0.3, 1.0)))
    assert np.array_equal(got_images, expected)
    loader.close()


def test_subset_resume_equals_straight_and_prefetch_equals_sync(dataset_path):
    straight = _loader(dataset_path, batch_size=4, rows=SUBSET, seed=1, prefetch=2)
    full = [_epoch(straight) for _ in range(2)]
    for stop_after in (1, 3, 5):
        first = _loader(dataset_path, batch_size=4, rows=SUBSET, seed=1)
        it = iter(first)
        head = [next(it) for _ in range(stop_after)]
        head_rows = np.concatenate([np.array(b.indices) for b in head])
        head_images = np.concatenate([np.array(b.images) for b in head])
        state = first.state_dict()
        first.close()
        resumed = _loader(dataset_path, batch_size=3, rows=SUBSET, seed=1)  # another batch size too
        resumed.load_state_dict(state)
        assert resumed.batches_left == -(-(len(SUBSET) - 4 * stop_after) // 3)
        tail_images, _, tail_rows = _epoch(resumed)
        assert np.array_equal(np.concatenate([head_rows, tail_rows]), full[0][2])
        assert np.array_equal(np.concatenate([head_images, tail_images]), full[0][0])
        nxt = _epoch(resumed)
        assert all(np.array_equal(a, b) for a, b in zip(nxt, full[1], strict=True))
        resumed.close()
    straight.close()


def test_subset_two_ranks_cover_one_rank(dataset_path):
    one = _loader(dataset_path, batch_size=4, subsample=0.5, seed=7, padding="drop")
    whole_images, _, whole_rows = _epoch(one)
    ranks = [_loader(dataset_path, batch_size=2, subsample=0.5, seed=7, rank=r, world_size=2, padding="drop")
             for r in range(2)]
    parts = [_epoch(r) for r in ranks]
    n = len(parts[0][2])
    interleaved_rows = np.empty(2 * n, np.int64)
    interleaved_rows[0::2], interleaved_rows[1::2] = parts[0][2], parts[1][2]
    m = (one.num_samples // 2) * 2
    assert np.array_equal(interleaved_rows, whole_rows[:m])
    interleaved = np.empty((2 * n, *parts[0][0].shape[1:]), parts[0][0].dtype)
    interleaved[0::2], interleaved[1::2] = parts[0][0], parts[1][0]
    assert np.array_equal(interleaved, whole_images[:m])
    for x in (one, *ranks):
        x.close()


def test_subset_elastic_resume_two_to_three_ranks(dataset_path):
    """2 ranks stop mid-epoch; 3 ranks take over: nothing lost, nothing repeated."""
    kw = dict(batch_size=3, rows=range(0, N_IMAGES, 2), seed=5, padding="drop")
    straight = _epoch(_loader(dataset_path, **kw))[2]
    two = [_loader(dataset_path, rank=r, world_size=2, **kw) for r in range(2)]
    its = [iter(x) for x in two]
    seen = []
    for _ in range(2):
        for it in its:
            seen.extend(np.array(next(it).indices).tolist())
    state = two[0].state_dict()
    assert state == two[1].state_dict()
    three = [_loader(dataset_path, rank=r, world_size=3, **kw) for r in range(3)]
    for x in three:
        x.load_state_dict(state)
    tails = [_epoch(x)[2] for x in three]
    rest = np.empty(sum(len(t) for t in tails), np.int64)
    for r in range(3):
        rest[r::3] = tails[r]
    consumed = state["consumed"]
    assert sorted(seen) == sorted(straight[:consumed].tolist())
    left = len(straight) - consumed
    assert np.array_equal(rest, straight[consumed : consumed + (left // 3) * 3])
    for x in (*two, *three):
        x.close()


def test_state_of_another_subset_is_refused(dataset_path):
    a = _loader(dataset_path, batch_size=4, rows=SUBSET)
    next(iter(a))
    state = a.state_dict()
    b = _loader(dataset_path, batch_size=4, rows=SUBSET[::-1])
    with pytest.raises(StateMismatchError):
        b.load_state_dict(state)
    c = _loader(dataset_path, batch_size=4)
    with pytest.raises(StateMismatchError):
        c.load_state_dict(state)
    d = _loader(dataset_path, batch_size=4, rows=SUBSET.copy())
    d.load_state_dict(state)
    for x in (a, b, c, d):
        x.close()


def test_bad_subset_leaves_nothing_open(dataset_path):
    with pytest.raises(SubsetError):
        _loader(dataset_path, batch_size=4, rows=[N_IMAGES])
    with pytest.raises(SubsetError):
        PyTreeLoader(dataset_path, 4, subsample=2.0)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_pytree_loader_subset_and_resume(dataset_path, labels, prefetch):
    kw = dict(backend="numpy", return_indices=True, rows=SUBSET, seed=2, prefetch=prefetch)
    straight = [(b["label"].copy(), i.copy()) for b, i in PyTreeLoader(dataset_path, 4, **kw)]
    rows = np.concatenate([i for _, i in straight])
    assert sorted(rows.tolist()) == sorted(SUBSET.tolist())
    assert np.array_equal(np.concatenate([lab for lab, _ in straight]), labels[rows])
    first = PyTreeLoader(dataset_path, 4, **kw)
    it = iter(first)
    head = [next(it)[1].copy() for _ in range(2)]
    state = first.state_dict()
    first.close()
    resumed = PyTreeLoader(dataset_path, 4, **kw)
    resumed.load_state_dict(state)
    tail = [i.copy() for _, i in resumed]
    assert np.array_equal(np.concatenate(head + tail), rows)
    resumed.close()


def test_pytree_dataset_subset(dataset_path, images, labels):
    ds = PyTreeDataset(dataset_path, rows=SUBSET)
    assert len(ds) == len(SUBSET)
    for i in (0, 5, -1):
        assert ds[i]["label"] == labels[SUBSET[i]]
        assert np.array_equal(ds[i]["image"], images[SUBSET[i]])
    with pytest.raises(IndexError):
        ds[len(SUBSET)]
    batch = ds.get_batch([1, 2, -1])
    assert np.array_equal(batch["label"], labels[SUBSET[[1, 2, -1]]])
    assert np.array_equal(ds[2:5]["image"], images[SUBSET[2:5]])
    assert [s["label"] for s in ds] == labels[SUBSET].tolist()
    import pickle

    copy = pickle.loads(pickle.dumps(ds))
    assert np.array_equal(copy.get_batch(range(len(SUBSET)))["label"], labels[SUBSET])
    half = PyTreeDataset(dataset_path, subsample=0.5)
    assert len(half) == round(N_IMAGES * 0.5)
    assert np.array_equal(half.get_batch(range(len(half)))["label"],
                          labels[resolve_rows(N_IMAGES, subsample=0.5)])
    for x in (ds, copy, half):
        x.close()


def test_tbl_format_dataset_slices_like_pytree_dataset(dataset_path, labels):
    with tbl_format.open(dataset_path) as ds:
        ref = PyTreeDataset(dataset_path)
        for sl in (slice(2, 7), slice(None, None, 9), slice(-5, None), slice(38, 43), slice(50, 10, -7), slice(3, 3)):
            rows = ds[sl]
            assert isinstance(rows, list)
            expected = ref[sl]
            assert [r["label"] for r in rows] == expected["label"].tolist()
            for r, img in zip(rows, expected["image"], strict=True):
                assert np.array_equal(r["image"], img)
        ref.close()
