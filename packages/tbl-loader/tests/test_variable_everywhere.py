"""Variable-size images (tbl convert --max-size, raw and JPEG storage) on every serving path: the map-style
ImageDataset with EpochBatchSampler and DataLoader workers (fork and spawn), Mix, several crop views.

The datasets are real photographs (scikit-image's samples, cut and resized) converted as a user converts
them. Every path is compared, element by element (np.array_equal), with what the plain local ImageLoader
serves for the same (seed, epoch), or with the numpy reference kernel on boxes drawn from the size columns.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import as_numpy
from convert_images import jpeg_set, write_tree

import tbl_format
import tbl_kernels
from tbl_kernels import reference as kref
from tbl_loader import (
    EpochBatchSampler,
    ImageDataset,
    ImageLoader,
    Mix,
    RandomResizedCrop,
    collate_identity,
    convert,
)
from tbl_loader.errors import MixError
from tbl_loader.image.spec import view_seed
from tbl_loader.stream import order

pytest.importorskip("skimage")  # the sample photographs
if not hasattr(tbl_kernels, "crop_resize_images"):
    pytest.skip("needs tbl-kernels 0.2 (crop_resize_images)", allow_module_level=True)

SEED = 7
CROP = RandomResizedCrop(24, scale=(0.2, 1.0))
LOCAL = RandomResizedCrop(12, scale=(0.05, 0.4))
FIELDS = ("height", "width")
MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
N_PHOTOS = 21


@pytest.fixture(scope="module")
def photos_src(tmp_path_factory):
    """21 JPEG photos of sides 30..90 in three class folders."""
    blobs = jpeg_set(N_PHOTOS, seed=4, lo=30, hi=90)
    files = {f"c{i % 3}/img{i:02d}.jpg": b for i, b in enumerate(blobs)}
    return write_tree(tmp_path_factory.mktemp("photos") / "src", files)


@pytest.fixture(scope="module")
def converted(photos_src, tmp_path_factory):
    """The photos converted with --max-size 64, raw and JPEG storage, in shards of 8 rows."""
    root = tmp_path_factory.mktemp("converted")
    out = {}
    for store in ("raw", "jpeg"):
        if store == "jpeg":
            pytest.importorskip("simplejpeg")  # the serve-time decoder: pip install "tbl-loader[jpeg]"
        out[store] = root / store
        convert(photos_src, out[store], max_size=64, store=store, shard_rows=8, workers=1, progress=False,
                report=False)
    return out


def _loader(path, batch_size=5, **kw):
    opts = {"seed": SEED, "hflip": 0.5, "random_resized_crop": CROP, "mean": MEAN, "std": STD, "prefetch": 0,
            "backend": "numpy", **kw}
    return ImageLoader(path, batch_size, **opts)


def _host(x):
    return None if x is None else as_numpy(x).copy()  # a fresh copy of a numpy array or torch CPU tensor


def _batches(loader):
    """Every batch of the loader's current epoch: views, labels, indices, keys and fields, copied."""
    return [([_host(v) for v in b.views], _host(b.labels), _host(b.indices), np.array(b.keys),
             {k: _host(v) for k, v in b.fields.items()}) for b in loader]


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g_views, w_views = g[0], w[0]
        assert len(g_views) == len(w_views)
        assert all(np.array_equal(a, b) for a, b in zip(g_views, w_views, strict=True))
        for a, b in zip(g[1:4], w[1:4], strict=True):
            assert np.array_equal(a, b)
        assert sorted(g[4]) == sorted(w[4]) and all(np.array_equal(g[4][k], w[4][k]) for k in w[4])


def _as_tuple(batch):
    return ([_host(v) for v in batch.views], _host(batch.labels), _host(batch.indices), np.array(batch.keys),
            {k: _host(v) for k, v in batch.fields.items()})


# ------------------------------------------------------------------- map-style dataset, sampler, workers


@pytest.mark.parametrize("store", ["raw", "jpeg"])
@pytest.mark.parametrize("fields", [(), FIELDS])
def test_dataset_batches_are_the_loaders(converted, store, fields):
    """ImageDataset.from_loader + EpochBatchSampler: every batch of two epochs, a subset, the loader's own."""
    rows = np.arange(N_PHOTOS - 1, 0, -2)
    with _loader(converted[store], fields=fields, rows=rows) as loader:
        ds = ImageDataset.from_loader(loader)
        assert len(ds) == loader.num_samples == rows.shape[0]
        for _ in range(2):
            plans = list(EpochBatchSampler(loader))
            got = [_as_tuple(ds.get_batch(p)) for p in plans]
            _same(got, _batches(loader))
        if fields:  # the field values are the rows' own columns
            batch = ds.get_batch([0, 3])
            with tbl_format.open(converted[store]) as raw:
                for key in FIELDS:
                    assert np.array_equal(batch.fields[key], [raw[int(rows[p])][key] for p in (0, 3)])
        ds.close()


def test_dataset_made_directly_equals_the_loaders(converted):
    """ImageDataset(path, **image options) on JPEG storage, with jpeg_dct="fast": the loader's batches."""
    opts = {"seed": SEED, "hflip": 0.5, "random_resized_crop": CROP, "mean": MEAN, "std": STD, "backend": "numpy"}
    ds = ImageDataset(converted["jpeg"], jpeg_dct="fast", **opts)
    with ImageLoader(converted["jpeg"], 6, jpeg_dct="fast", prefetch=0, **opts) as loader:
        loader.set_epoch(2)
        ds.set_epoch(2)
        for b in loader:
            got = ds.get_batch(_host(b.indices).tolist())
            assert np.array_equal(got.images, b.images) and np.array_equal(got.labels, b.labels)
    ds.close()


WORKER_CASES = [("raw", "fork", FIELDS), ("raw", "spawn", ()), ("jpeg", "fork", ()), ("jpeg", "spawn", FIELDS),
                ("jpeg", "forkserver", FIELDS)]


@pytest.mark.parametrize(("store", "method", "fields"), WORKER_CASES,
                         ids=[f"{s}-{m}-{'fields' if f else 'plain'}" for s, m, f in WORKER_CASES])
def test_dataloader_workers_yield_the_loaders_epoch(converted, store, method, fields):
    """torch's DataLoader, two workers (fork, spawn or forkserver), EpochBatchSampler: the loader's batches of two
    epochs, each store with and without fields, fork and spawn each with and without fields."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    with _loader(converted[store], batch_size=4, fields=fields, backend="torch") as loader:
        ds = ImageDataset.from_loader(loader)
        dl = DataLoader(ds, batch_sampler=EpochBatchSampler(loader), collate_fn=collate_identity, num_workers=2,
                        multiprocessing_context=method, persistent_workers=True)
        for _ in range(2):  # persistent workers: the epoch travels with each batch of positions
            got = [_as_tuple(b) for b in dl]
            want = _batches(loader)
            _same(got, want)
            assert isinstance(want[0][0][0], np.ndarray) and torch.is_tensor(next(iter(dl)).images)
        del dl
        ds.close()


def test_dataset_of_a_variable_jpeg_dataset_at_a_url_equals_local(converted, tmp_path):
    """A URL (a file:// store) of JPEG storage: the map-style twin of the URL loader, read through the shard
    cache, gives the local loader's batches."""
    pytest.importorskip("obstore", reason="the remote extra (tbl-loader[remote]) is not installed")
    from tbl_loader import upload_dataset

    url = (tmp_path / "store").resolve().as_uri() + "/jpeg/"
    upload_dataset(converted["jpeg"], url, storage_options={"mkdir": True})
    with _loader(converted["jpeg"], fields=FIELDS) as local:
        want = _batches(local)
    with _loader(url, fields=FIELDS, cache_dir=tmp_path / "cache") as remote:
        ds = ImageDataset.from_loader(remote)
        _same([_as_tuple(ds.get_batch(p)) for p in EpochBatchSampler(remote)], want)
        ds.close()


# ----------------------------------------------------------------------------------------------- Mix


def _by_row(path, epochs, **kw):
    """{epoch: {dataset row: image}} as the plain local loader serves them (shuffle off: the rows in order)."""
    out = {}
    with _loader(path, batch_size=7, shuffle=False, **kw) as loader:
        for e in epochs:
            loader.set_epoch(e)
            out[e] = {int(i): im for b in loader for i, im in zip(_host(b.indices), _host(b.images), strict=True)}
    return out


def _check_mix(mix, paths, per_source_kw):
    src_all, pos_all, ep_all = mix.schedule(0)
    plain = [_by_row(p, sorted(set(ep_all[src_all == s].tolist())), **kw)
             for s, (p, kw) in enumerate(zip(paths, per_source_kw, strict=True))]
    at = 0
    for batch, src in mix:
        for j, s in enumerate(src.tolist()):
            pos, e = int(pos_all[at + j]), int(ep_all[at + j])
            assert s == src_all[at + j] and int(batch.indices[j]) == pos
            assert np.array_equal(batch.images[j], plain[s][e][pos])
        at += len(src)
    assert at == mix.epoch_size


def test_mix_of_variable_raw_and_jpeg_equals_each_plain_loader(converted):
    paths = [converted["raw"], converted["jpeg"]]
    loaders = [_loader(p) for p in paths]
    with Mix(loaders, weights=(0.5, 0.5), epoch_size=30, batch_size=8, seed=3, return_sources=True,
             prefetch=1) as mix:
        _check_mix(mix, paths, [{}, {}])
    for x in loaders:
        x.close()


def test_mix_of_fixed_and_variable_images_equals_each_plain_loader(converted, photos_src, tmp_path):
    fixed = tmp_path / "fixed"
    convert(photos_src, fixed, 40, shard_rows=8, workers=1, progress=False, report=False)
    paths = [fixed, converted["jpeg"]]
    loaders = [_loader(p) for p in paths]
    with Mix(loaders, weights=(0.4, 0.6), epoch_size=25, batch_size=6, seed=8, return_sources=True,
             prefetch=0) as mix:
        _check_mix(mix, paths, [{}, {}])
    for x in loaders:
        x.close()


def test_mix_sources_that_disagree_are_refused_at_construction(converted, photos_src, tmp_path):
    fixed = tmp_path / "fixed"
    convert(photos_src, fixed, 40, shard_rows=8, workers=1, progress=False, report=False)
    cases = [
        ({}, {"random_resized_crop": None}, "views"),  # the fixed images at their stored 40 x 40, crops of 24
        ({}, {"dtype": "uint8"}, "dtype"),
        ({"fields": FIELDS}, {}, "fields"),
        ({}, {"random_resized_crop": [CROP, LOCAL]}, "views"),
    ]
    for var_kw, fixed_kw, what in cases:
        a, b = _loader(converted["raw"], **var_kw), _loader(fixed, **fixed_kw)
        with pytest.raises(MixError, match=f"serves {what}"):
            Mix([a, b], batch_size=4)
        a.close()
        b.close()


# ---------------------------------------------------------------------------------------- multi-crop


def _reference_view(path, ids, *, epoch, seed, crop, hflip):
    """View images of raw variable-size rows ``ids``: boxes and flips drawn with ``seed`` from the stored sizes,
    the numpy reference crop-resize (tbl_kernels.reference), the normalization table."""
    with tbl_format.open(path) as ds:
        sources = [np.array(ds[int(i)]["image"]) for i in ids]
    hs = np.array([s.shape[0] for s in sources], np.int64)
    ws = np.array([s.shape[1] for s in sources], np.int64)
    boxes = order.random_resized_crop_boxes(seed, epoch, ids, hs, ws, crop.scale, crop.ratio)
    flip = order.flip_draws(seed, epoch, ids, hflip).astype(np.uint8)
    out = np.empty((len(ids), 3, *crop.output_size), np.float32)
    kref.crop_resize_images(sources, boxes, out, kref.normalization_table(MEAN, STD, "float32"), flip, "CHW")
    return out


def test_several_crop_views_of_raw_variable_images_are_exact(converted):
    with _loader(converted["raw"], random_resized_crop=[CROP, LOCAL, LOCAL]) as loader:
        loader.set_epoch(1)
        batches = _batches(loader)
    ids = np.concatenate([b[2] for b in batches])
    assert sorted(ids.tolist()) == list(range(N_PHOTOS))
    for v, crop in enumerate([CROP, LOCAL, LOCAL]):
        got = np.concatenate([b[0][v] for b in batches])
        want = _reference_view(converted["raw"], ids, epoch=1, seed=view_seed(SEED, v), crop=crop, hflip=0.5)
        assert np.array_equal(got, want)
    assert not np.array_equal(np.concatenate([b[0][1] for b in batches]), np.concatenate([b[0][2] for b in batches]))


def test_several_crop_views_of_jpeg_images_are_each_views_single_stream(converted):
    """On JPEG storage each view is decoded at the DCT scale its own box allows: view v is exactly the single
    view a plain loader of seed view_seed(seed, v) serves, however many views share a decode."""
    with _loader(converted["jpeg"], random_resized_crop=[CROP, LOCAL]) as loader:
        loader.set_epoch(2)
        batches = _batches(loader)
    ids = np.concatenate([b[2] for b in batches])
    for v, crop in enumerate([CROP, LOCAL]):
        single = _by_row(converted["jpeg"], [2], seed=view_seed(SEED, v), random_resized_crop=crop)[2]
        got = np.concatenate([b[0][v] for b in batches])
        assert np.array_equal(got, np.stack([single[int(i)] for i in ids]))


def test_several_crop_views_reach_the_dataset_and_workers(converted):
    with _loader(converted["jpeg"], random_resized_crop=[CROP, LOCAL], fields=FIELDS) as loader:
        ds = ImageDataset.from_loader(loader)
        _same([_as_tuple(ds.get_batch(p)) for p in EpochBatchSampler(loader)], _batches(loader))
        ds.close()
