"""User transforms, per-sample keys, multi-crop and the Batch type."""

from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest
from conftest import reference_images

from tbl_loader import Batch, ImageLoader, RandomResizedCrop
from tbl_loader.image.spec import view_seed
from tbl_loader.stream import keys_uniform, numpy_generator, sample_keys

CROPS = [RandomResizedCrop(8, scale=(0.4, 1.0)), RandomResizedCrop(4, scale=(0.05, 0.4)),
         RandomResizedCrop((4, 6), scale=(0.05, 0.4))]


def _np(x):
    """A host tensor or array as numpy (no copy)."""
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def jitter(batch):
    """A random per-sample transform drawn only from the sample keys (batch-size independent)."""
    brightness = 0.5 + keys_uniform(batch.keys, draw=0)  # (B,) vectorized, one draw per sample
    views = []
    for view in batch.views:
        out = _np(view).astype(np.float32, copy=True)
        out *= brightness.astype(np.float32)[:, None, None, None]
        for k, key in enumerate(batch.keys):  # and a per-sample generator
            out[k] += numpy_generator(key).standard_normal(out.shape[1:], dtype=np.float32) * 0.1
        views.append(out)
    return batch._replace(views=tuple(views))


def _loader(path, **kw):
    kw.setdefault("backend", "numpy")
    kw.setdefault("hflip", 0.5)
    kw.setdefault("random_resized_crop", CROPS)
    kw.setdefault("seed", 11)
    return ImageLoader(path, **kw)


def _collect(loader, batches=None):
    """Every element of every batch: per view images, labels, indices, keys."""
    out = {"views": [[] for _ in range(3)], "labels": [], "indices": [], "keys": []}
    # zip asks the range first: the loader hands out exactly `batches` batches
    for _, b in zip(range(batches if batches is not None else 1 << 60), loader, strict=False):
        for v, img in enumerate(b.views):
            out["views"][v].append(_np(img).copy())
        out["labels"].append(_np(b.labels).copy())
        out["indices"].append(_np(b.indices).copy())
        out["keys"].append(b.keys.copy())
    return out


def _cat(parts):
    return {"views": [np.concatenate(v) for v in parts["views"]],
            **{k: np.concatenate(parts[k]) for k in ("labels", "indices", "keys")}}


def _assert_equal(a, b):
    for va, vb in zip(a["views"], b["views"], strict=True):
        assert np.array_equal(va, vb)
    for k in ("labels", "indices", "keys"):
        assert np.array_equal(a[k], b[k])


def test_batch_unpacks_as_before_and_carries_more():
    b = Batch(1, 2, 3, keys=np.array([5], np.uint64))
    images, labels, indices = b
    assert (images, labels, indices) == (1, 2, 3) and len(b) == 3 and b.views == (1,)
    r = b._replace(images=9)
    assert tuple(r) == (9, 2, 3) and r.views == (9,) and r.keys[0] == 5
    p = pickle.loads(pickle.dumps(Batch(1, 2, 3, views=(1, 4), fields={"x": 1})))
    assert tuple(p) == (1, 2, 3) and p.views == (1, 4) and p.fields == {"x": 1}
    with pytest.raises(TypeError, match="no fields"):
        b._replace(nope=1)


def test_keys_are_the_generator_stream_of_each_row(dataset_path):
    loader = _loader(dataset_path, batch_size=9, random_resized_crop=None)
    for epoch in range(2):
        for b in loader:
            assert b.keys.dtype == np.uint64
            assert np.array_equal(b.keys, sample_keys(11, epoch, b.indices))
    loader.close()
    u = keys_uniform(np.array([1, 2, 3], np.uint64), draw=4)
    assert np.all((u >= 0) & (u < 1)) and np.array_equal(u, keys_uniform([1, 2, 3], 4))
    assert not np.array_equal(u, keys_uniform([1, 2, 3], 5))


def test_multi_crop_views_are_the_reference_crops(dataset_path, images):
    loader = _loader(dataset_path, batch_size=16, prefetch=0)
    single = _loader(dataset_path, batch_size=16, prefetch=0, random_resized_crop=CROPS[0])
    for b, s in zip(loader, single, strict=True):
        assert len(b.views) == 3 and b.views[0] is b.images
        assert [tuple(v.shape[1:]) for v in b.views] == [(3, 8, 8), (3, 4, 4), (3, 4, 6)]
        assert np.array_equal(b.images, s.images)  # view 0 is the single-crop stream
        for v in range(3):
            want = reference_images(images, b.indices, seed=view_seed(11, v), epoch=0, hflip=0.5, dtype="float32",
                                    layout="CHW", crop=CROPS[v])
            assert np.array_equal(b.views[v], want)
    assert single.state_dict()["settings"] != loader.state_dict()["settings"]
    for x in (loader, single):
        x.close()


def test_transform_runs_on_the_producer_thread_and_errors_reach_the_loop(dataset_path):
    threads = []

    def spy(batch):
        threads.append(threading.current_thread().name)
        return batch

    loader = _loader(dataset_path, batch_size=32, transform=spy, prefetch=2)
    assert len(list(loader)) == 4
    assert threads and all(name.startswith("tbl-loader-producer") for name in threads)
    loader.close()

    class Boom(Exception):
        pass

    def fail(batch):
        raise Boom("bad batch")

    broken = _loader(dataset_path, batch_size=32, transform=fail)
    with pytest.raises(Boom, match="bad batch"):
        next(iter(broken))
    broken.close()
    with pytest.raises(TypeError, match="transform must be a callable"):
        _loader(dataset_path, batch_size=4, transform=3)


def test_device_transform_runs_on_the_batch_handed_out(dataset_path):
    seen = []

    def count(batch):
        seen.append(threading.current_thread() is threading.main_thread())
        return batch._replace(labels=batch.labels + 1000)

    loader = _loader(dataset_path, batch_size=50, device_transform=count, transform=jitter)
    plain = _loader(dataset_path, batch_size=50, transform=jitter)
    for a, b in zip(loader, plain, strict=True):
        assert np.array_equal(a.labels, b.labels + 1000)
        assert np.array_equal(a.views[2], b.views[2])
    assert seen == [True, True, True]
    for x in (loader, plain):
        x.close()


def test_transform_in_place_on_the_ring_buffers(dataset_path):
    def negate(batch):
        np.negative(batch.images, out=batch.images)
        return batch

    loader = _loader(dataset_path, batch_size=16, transform=negate, random_resized_crop=None)
    plain = _loader(dataset_path, batch_size=16, random_resized_crop=None)
    kept = []
    for a, b in zip(loader, plain, strict=True):
        kept.append((a, np.array(b.images)))  # held batches: the ring must not reuse their buffers
    for a, b in kept:
        assert np.array_equal(a.images, -b)
    for x in (loader, plain):
        x.close()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_transformed_stream_equal_across_prefetch_batch_size_ranks_and_resume(dataset_path, backend):
    if backend == "torch":
        pytest.importorskip("torch")
    kw = dict(transform=jitter, backend=backend, padding="drop")
    straight = _cat(_collect(_loader(dataset_path, batch_size=7, prefetch=0, **kw)))
    _assert_equal(_cat(_collect(_loader(dataset_path, batch_size=64, prefetch=2, **kw))), straight)
    # two ranks, interleaved step by step
    ranks = [_cat(_collect(_loader(dataset_path, batch_size=7, rank=r, world_size=2, **kw))) for r in range(2)]
    n = len(ranks[0]["indices"])
    m = 2 * n
    for key in ("labels", "indices", "keys"):
        both = np.empty((m, *ranks[0][key].shape[1:]), ranks[0][key].dtype)
        both[0::2], both[1::2] = ranks[0][key], ranks[1][key]
        assert np.array_equal(both, straight[key][:m])
    for v in range(3):
        both = np.empty((m, *ranks[0]["views"][v].shape[1:]), np.float32)
        both[0::2], both[1::2] = ranks[0]["views"][v], ranks[1]["views"][v]
        assert np.array_equal(both, straight["views"][v][:m])
    # resumed mid-epoch, with another batch size and prefetch
    first = _loader(dataset_path, batch_size=7, prefetch=2, **kw)
    head = _collect(first, batches=5)
    state = first.state_dict()
    first.close()
    resumed = _loader(dataset_path, batch_size=64, prefetch=0, **kw)
    resumed.load_state_dict(state)
    tail = _collect(resumed)
    joined = {k: head[k] + tail[k] for k in ("labels", "indices", "keys")}
    joined["views"] = [head["views"][v] + tail["views"][v] for v in range(3)]
    _assert_equal(_cat(joined), straight)
