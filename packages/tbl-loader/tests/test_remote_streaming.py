"""Pytree datasets stream from a URL through the shard cache: only the shards a read needs, within cache_limit.

Against a real S3 server on 127.0.0.1 (moto). The remote stream is compared with
the local one element for element, with a cache a quarter of the dataset, and
the downloads are counted.
"""

from __future__ import annotations

import pickle
import time

import numpy as np
import pytest
from conftest import assert_tree_equal

import tbl_format
from tbl_loader import PyTreeDataset, PyTreeLoader

ROWS = 640
SHARD_ROWS = 10  # 64 shards


def _rows():
    rng = np.random.default_rng(11)
    for i in range(ROWS):
        n = int(rng.integers(0, 40))
        yield {"id": i, "text": f"row {i} " + "x" * int(rng.integers(0, 30)),
               "tokens": rng.integers(0, 50_000, n, dtype=np.int32), "x": rng.random(4, dtype=np.float32)}


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory):
    return tbl_format.write(_rows(), tmp_path_factory.mktemp("rows") / "rows", shard_rows=SHARD_ROWS)


@pytest.fixture(scope="module")
def rows_url(s3_server, local_rows):
    from tbl_loader import upload_dataset

    url = f"s3://{s3_server.new_bucket()}/rows/"
    upload_dataset(local_rows, url, storage_options=s3_server.storage_options)
    return url


def _shard_bytes(path) -> list[int]:
    return [(path / e["file"]).stat().st_size for e in tbl_format.open(path).shard_entries]


def _hook(ds: PyTreeDataset):
    return ds._source.dataset._fetch_shard  # the RemoteShards hook of the open dataset (test introspection)


def test_random_access_downloads_only_the_shards_it_touches(s3_server, local_rows, rows_url, tmp_path):
    local = PyTreeDataset(local_rows)
    remote = PyTreeDataset(rows_url, cache_dir=tmp_path, storage_options=s3_server.storage_options)
    assert len(remote) == ROWS and remote.fingerprint == local.fingerprint
    hook = _hook(remote)
    assert hook.cache.downloads == 0  # opening reads the manifest only
    rng = np.random.default_rng(0)
    picked = rng.integers(0, ROWS // 2, 1000)  # rows of the first 32 shards only
    for i in picked.tolist():
        assert_tree_equal(remote[i], local[i], f"row {i}")
    touched = set((picked // SHARD_ROWS).tolist())
    assert hook.cache.downloads == len(touched) == 32  # each touched shard once, none of the others
    cached = {p.name for p in hook.local_dir.iterdir() if p.suffix == ".tbl"}
    files = [e["file"] for e in tbl_format.open(local_rows).shard_entries]
    assert cached == {files[k] for k in touched}
    remote.close()
    local.close()


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_pytree_loader_streams_within_a_quarter_cache(s3_server, local_rows, rows_url, tmp_path, shuffle):
    sizes = _shard_bytes(local_rows)
    limit = sum(sizes) // 4
    opts = dict(batch_size=32, shuffle=shuffle, seed=4, backend="numpy", var="list", return_indices=True)
    with PyTreeLoader(local_rows, **opts) as a:
        want = [list(a) for _ in range(1)][0]
    import warnings

    from tbl_loader.errors import CacheThrashWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b = PyTreeLoader(rows_url, cache_dir=tmp_path, cache_limit=limit, storage_options=s3_server.storage_options,
                         **opts)
    thrash = [w for w in caught if issubclass(w.category, CacheThrashWarning)]
    # A global shuffle through a quarter cache is told it downloads shards many times; a block shuffle is not.
    assert len(thrash) == (1 if shuffle is True else 0)
    if thrash:
        assert "shuffle='block'" in str(thrash[0].message)
    with b:
        got = list(b)
        hook = b._pipeline.source.source.dataset._fetch_shard
        assert hook.cache.size() <= limit
        downloaded = hook.cache.downloads
    assert len(got) == len(want)
    for (gb, gi), (wb, wi) in zip(got, want, strict=True):
        assert np.array_equal(gi, wi)
        assert_tree_equal(gb, wb)
    if shuffle == "block":  # shards in order within a window: each downloaded about once per epoch
        assert downloaded <= 1.2 * len(sizes), downloaded


def test_pytree_loader_resumes_mid_epoch_from_a_url(s3_server, rows_url, tmp_path):
    opts = dict(batch_size=24, shuffle="block", seed=2, backend="numpy", return_indices=True, cache_dir=tmp_path,
                storage_options=s3_server.storage_options)
    with PyTreeLoader(rows_url, **opts) as straight:
        full = [idx for _, idx in straight]
    with PyTreeLoader(rows_url, **opts) as first:
        it = iter(first)
        head = [next(it)[1] for _ in range(5)]
        state = first.state_dict()
    with PyTreeLoader(rows_url, **opts) as resumed:
        resumed.load_state_dict(state)
        tail = [idx for _, idx in resumed]
    for a, b in zip(head + tail, full, strict=True):
        assert np.array_equal(a, b)


def test_a_pickled_url_dataset_opens_its_own_client(s3_server, local_rows, rows_url, tmp_path):
    # What a DataLoader worker gets (spawn pickles the dataset; fork copies it): the storage
    # client is made again in the process that reads, never carried over.
    remote = PyTreeDataset(rows_url, cache_dir=tmp_path, storage_options=s3_server.storage_options)
    remote[3]
    copy = pickle.loads(pickle.dumps(remote))
    local = PyTreeDataset(local_rows)
    assert_tree_equal(copy[ROWS - 1], local[ROWS - 1])
    assert_tree_equal(copy.get_batch([5, 600, 7]), local.get_batch([5, 600, 7]))
    remote.close()
    copy.close()
    local.close()


# ---- variable-size JPEG images with fields ---------------------------------------------------------

JPEG_ROWS = 160
JPEG_SHARD_ROWS = 10  # 16 shards


@pytest.fixture(scope="module")
def local_jpeg(tmp_path_factory):
    simplejpeg = pytest.importorskip("simplejpeg")
    import tbl_kernels

    if not hasattr(tbl_kernels, "crop_resize_images"):
        pytest.skip("variable-size images need tbl-kernels 0.2 (crop_resize_images)")
    rng = np.random.default_rng(5)
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int"), "caption": tbl_format.Leaf("str"),
                                "boxes": tbl_format.Leaf("var_array", dtype="float32", ndim=2)})
    path = tmp_path_factory.mktemp("jpeg") / "jpeg"
    with tbl_format.Writer(path, schema, shard_rows=JPEG_SHARD_ROWS) as w:
        for i in range(JPEG_ROWS):
            h, wd = (int(v) for v in rng.integers(24, 90, 2))
            y, x = np.mgrid[0:h, 0:wd]
            img = ((rng.integers(0, 256, 3) + 3 * y[..., None] + 2 * x[..., None]) % 256).astype(np.uint8)
            w.write({"image": simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=90, colorspace="RGB"),
                     "height": h, "width": wd, "label": i, "caption": f"photo {i}",
                     "boxes": rng.random((int(rng.integers(0, 4)), 4), dtype=np.float32)})
    return path


@pytest.fixture(scope="module")
def jpeg_url(s3_server, local_jpeg):
    from tbl_loader import upload_dataset

    url = f"s3://{s3_server.new_bucket()}/jpeg/"
    upload_dataset(local_jpeg, url, storage_options=s3_server.storage_options)
    return url


def _image_stream(loader, batches=None):
    out = []
    it = iter(loader)
    for b in (it if batches is None else (next(it) for _ in range(batches))):
        out.append((np.array(b.images), np.array(b.labels), np.array(b.indices), b.fields["caption"],
                    [np.array(x) for x in b.fields["boxes"]]))
    return out


def _assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g[:3], w[:3], strict=True):
            assert np.array_equal(a, b)
        assert g[3] == w[3]
        assert all(np.array_equal(a, b) for a, b in zip(g[4], w[4], strict=True))


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_variable_jpeg_loader_with_fields_streams_within_a_quarter_cache(s3_server, local_jpeg, jpeg_url, tmp_path,
                                                                           shuffle):
    from tbl_loader import ImageLoader, RandomResizedCrop

    sizes = _shard_bytes(local_jpeg)
    limit = sum(sizes) // 4
    opts = dict(batch_size=16, shuffle=shuffle, seed=3, hflip=0.5, backend="numpy", fields=("caption", "boxes"),
                random_resized_crop=RandomResizedCrop(20, scale=(0.3, 1.0)))
    with ImageLoader(local_jpeg, **opts) as a:
        want = _image_stream(a)
    with ImageLoader(jpeg_url, cache_dir=tmp_path, cache_limit=limit, storage_options=s3_server.storage_options,
                     **opts) as b:
        got = _image_stream(b)
        hook = b.dataset._fetch_shard
        assert hook.cache.size() <= limit
    _assert_same(got, want)
    # Resumed mid-epoch from the URL: the rest of the same stream.
    with ImageLoader(jpeg_url, cache_dir=tmp_path, cache_limit=limit, storage_options=s3_server.storage_options,
                     **opts) as first:
        head = _image_stream(first, batches=3)
        state = first.state_dict()
    with ImageLoader(jpeg_url, cache_dir=tmp_path, cache_limit=limit, storage_options=s3_server.storage_options,
                     **opts) as resumed:
        resumed.load_state_dict(state)
        tail = _image_stream(resumed)
    _assert_same(head + tail, want)


# ---- token streams --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_tokens(tmp_path_factory):
    from tbl_loader import write_tokens

    rng = np.random.default_rng(9)
    docs = [rng.integers(0, 60_000, int(rng.integers(50, 400)), dtype=np.int64) for _ in range(300)]
    return write_tokens(docs, tmp_path_factory.mktemp("tok") / "tok", eos=0, chunk=256, shard_tokens=4096)


@pytest.fixture(scope="module")
def tokens_url(s3_server, local_tokens):
    from tbl_loader import upload_dataset

    url = f"s3://{s3_server.new_bucket()}/tok/"
    upload_dataset(local_tokens, url, storage_options=s3_server.storage_options)
    return url


def test_token_loader_streams_from_a_url(s3_server, local_tokens, tokens_url, tmp_path):
    from tbl_loader import TokenLoader

    sizes = _shard_bytes(local_tokens)
    assert len(sizes) >= 12
    remote_opts = dict(cache_dir=tmp_path, cache_limit=sum(sizes) // 4, storage_options=s3_server.storage_options)
    opts = dict(batch_size=8, seq_len=100, seed=6, backend="numpy")
    with TokenLoader(local_tokens, **opts) as a, TokenLoader(tokens_url, **opts, **remote_opts) as b:
        for epoch in range(2):
            a.set_epoch(epoch)
            b.set_epoch(epoch)
            for x, y in zip(a, b, strict=True):
                assert np.array_equal(x.tokens, y.tokens) and np.array_equal(x.indices, y.indices)
        assert b.dataset._fetch_shard.cache.size() <= remote_opts["cache_limit"]
    # Windows of the first shards only (rows=): only those shards are downloaded.
    first = 4096 // 100 - 2  # windows that end inside the first shard, whatever the epoch's offset
    with TokenLoader(tokens_url, **opts, rows=range(first), cache_dir=tmp_path / "fresh",
                     storage_options=s3_server.storage_options) as c:
        list(c)
        hook = c.dataset._fetch_shard
        assert hook.cache.downloads == 1 + 1  # the window shard, and the last shard (the stream's length)
    # Resumed mid-epoch from the URL: the rest of the same stream.
    with TokenLoader(local_tokens, **opts) as straight:
        want = [np.array(x.tokens) for x in straight]
    with TokenLoader(tokens_url, **opts, **remote_opts) as first_run:
        it = iter(first_run)
        head = [np.array(next(it).tokens) for _ in range(3)]
        state = first_run.state_dict()
    with TokenLoader(tokens_url, **opts, **remote_opts) as resumed:
        resumed.load_state_dict(state)
        tail = [np.array(x.tokens) for x in resumed]
    assert len(head + tail) == len(want)
    assert all(np.array_equal(x, y) for x, y in zip(head + tail, want, strict=True))


def test_token_documents_stream_from_a_url(s3_server, local_tokens, tokens_url, tmp_path):
    """Packed rows and their boundary fields from a URL through a quarter-size shard cache equal the local ones,
    also resumed mid-epoch (the document index of every shard is read through the cache at construction)."""
    from tbl_loader import TokenLoader

    cache_limit = sum(_shard_bytes(local_tokens)) // 4
    remote_opts = dict(cache_dir=tmp_path, cache_limit=cache_limit, storage_options=s3_server.storage_options)
    opts = dict(batch_size=8, seq_len=100, seed=6, backend="numpy", pack="best_fit")
    fields = ("tokens", "indices", "position_ids", "document_ids", "cu_seqlens", "loss_mask")
    with TokenLoader(local_tokens, **opts) as local:
        want = [{f: np.array(getattr(b, f)) for f in fields} for b in local]
    with TokenLoader(tokens_url, **opts, **remote_opts) as first:
        it = iter(first)
        got = [next(it) for _ in range(2)]
        got = [{f: np.array(getattr(b, f)) for f in fields} for b in got]
        state = first.state_dict()
    with TokenLoader(tokens_url, **opts, **remote_opts) as resumed:
        resumed.load_state_dict(state)
        got += [{f: np.array(getattr(b, f)) for f in fields} for b in resumed]
        assert resumed.dataset._fetch_shard.cache.size() <= cache_limit
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert all(np.array_equal(a[f], b[f]) for f in fields)



@pytest.mark.parametrize("pack", [None, "first_fit"])
def test_token_loader_downloads_ahead_in_window_order_and_warns_of_a_thrashing_shuffle(s3_server, local_tokens,
                                                                                      tokens_url, tmp_path, pack):
    """A pass tells the fetcher its shards in the order its windows (or packed rows) reach them: before the
    first batch is read, the shards of that order are in the cache (all of them: no cache limit), and the stream equals
    the local one (packed rows too: their pieces' shards are scheduled the same way); shuffle=True over a cache smaller than the dataset warns (CacheThrashWarning)."""
    from tbl_loader import TokenLoader
    from tbl_loader.errors import CacheThrashWarning

    sizes = _shard_bytes(local_tokens)
    opts = dict(batch_size=8, seq_len=100, seed=4, backend="numpy", shuffle=False, pack=pack)
    with TokenLoader(local_tokens, **opts) as local:
        want = [np.array(b.tokens) for b in local]
    with TokenLoader(tokens_url, **opts, cache_dir=tmp_path / "a", storage_options=s3_server.storage_options,
                     prefetch=0) as loader:
        hook = loader.dataset._fetch_shard
        before = hook.cache.downloads  # the last shard (the stream's length), and every index with pack=
        it = iter(loader)
        got = [np.array(next(it).tokens)]
        hook._clients()[2].wait()
        if pack is None:  # no cache limit: the whole order is read ahead (the first batch itself reads only shard 0)
            assert hook.lookahead == len(sizes) and hook.cache.downloads == len(sizes) > before
        else:  # packing reads every shard's document index at construction: all were downloaded then
            assert hook.cache.downloads == before == len(sizes)
        got += [np.array(b.tokens) for b in it]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    with pytest.warns(CacheThrashWarning, match="shuffle=True over a shard cache"):
        TokenLoader(tokens_url, **{**opts, "shuffle": True}, cache_dir=tmp_path / "b",
                    cache_limit=sum(sizes) // 4, storage_options=s3_server.storage_options).close()

# ---- DataLoader workers over a URL: fork, spawn, forkserver ----------------------------------------


def _dataloader_rows(dataset, context, batch_size=16):
    import torch.utils.data as tud

    from tbl_loader import collate_identity

    # timeout: a worker that hangs (a storage client or fetcher thread inherited through fork) fails the test
    # with a named error instead of blocking the suite.
    loader = tud.DataLoader(dataset, batch_size=batch_size, num_workers=2, multiprocessing_context=context,
                            collate_fn=collate_identity, timeout=120)
    return list(loader)


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_read_a_url_under_every_start_method(s3_server, local_rows, rows_url, local_ds_images,
                                                                images_url, tmp_path, context):
    pytest.importorskip("torch")
    from tbl_loader import ImageDataset

    # Opened (and read) in the parent first, as training scripts do: a forked worker must not use the
    # parent's storage client or fetcher thread.
    remote_rows = PyTreeDataset(rows_url, cache_dir=tmp_path, storage_options=s3_server.storage_options)
    remote_rows[0]
    got = _dataloader_rows(remote_rows, context)
    want = _dataloader_rows(PyTreeDataset(local_rows), context)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert_tree_equal(g, w)
    remote_images = ImageDataset(images_url, cache_dir=tmp_path, cache_limit=None, hflip=0.5, seed=1,
                                 backend="numpy", storage_options=s3_server.storage_options)
    remote_images[0]
    got = _dataloader_rows(remote_images, context)
    want = _dataloader_rows(ImageDataset(local_ds_images, hflip=0.5, seed=1, backend="numpy"), context)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            assert np.array_equal(np.asarray(a), np.asarray(b))


@pytest.fixture(scope="module")
def local_ds_images(tmp_path_factory):
    rng = np.random.default_rng(2)
    images = rng.integers(0, 256, (96, 12, 10, 3), dtype=np.uint8)
    return tbl_format.write(({"image": im, "label": np.int64(i)} for i, im in enumerate(images)),
                            tmp_path_factory.mktemp("img") / "img", shard_rows=16)


@pytest.fixture(scope="module")
def images_url(s3_server, local_ds_images):
    from tbl_loader import upload_dataset

    url = f"s3://{s3_server.new_bucket()}/img/"
    upload_dataset(local_ds_images, url, storage_options=s3_server.storage_options)
    return url


def test_a_forked_process_reaches_the_store_through_its_helper(s3_server, rows_url):
    """After the parent used the storage library, a forked child's calls (and their named errors) go
    through the child's own helper process, never through the runtime that did not survive the fork."""
    import os

    from tbl_loader.errors import RemoteObjectMissingError
    from tbl_loader.source.storage import open_store

    store = open_store(rows_url, s3_server.storage_options)
    manifest = store.read_bytes("manifest.json")  # the parent's runtime starts here
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, exit without running pytest's teardown
        code = 1
        try:
            same = store.read_bytes("manifest.json") == manifest
            try:
                store.size("no-such-object")
                named = False
            except RemoteObjectMissingError as e:
                named = "no-such-object" in str(e)
            code = 0 if same and named else 2
        finally:
            os.write(write, bytes([code]))
            os._exit(0)
    os.close(write)
    import select
    import signal

    ready, _, _ = select.select([read], [], [], 120)
    if not ready:  # the child hangs: what a storage call on the dead runtime does
        os.kill(pid, signal.SIGKILL)
    got = os.read(read, 1) if ready else b"hung"
    os.waitpid(pid, 0)
    assert got == b"\x00"


@pytest.mark.parametrize(("kind", "scheduled"), [("pytree", False), ("pytree", True), ("tokens", False)])
def test_a_mix_downloads_its_streamed_sources_shards_ahead_of_its_reads(s3_server, local_rows, rows_url,
                                                                       local_tokens, tokens_url, tmp_path,
                                                                       monkeypatch, kind, scheduled):
    """A Mix hands the next batches' samples to its sources at URLs: their shards download on the shared download
    threads ahead of the reads, not in the thread that makes the batch (where every download would be a wait),
    and the batches are the local Mix's (plain weights, and a schedule in smooth mode)."""
    import threading

    from tbl_loader import Mix, Schedule, TokenDataset
    from tbl_loader.source.cache import ShardCache

    where = []
    download = ShardCache._download

    def recording(self, *args, **kwargs):
        where.append(threading.current_thread().name)
        return download(self, *args, **kwargs)

    monkeypatch.setattr(ShardCache, "_download", recording)
    local, url = (local_rows, rows_url) if kind == "pytree" else (local_tokens, tokens_url)
    # Rows are drawn shard by shard enough for a third of the dataset to serve them; token windows are drawn
    # from anywhere in the stream, so their cache holds it all (a smaller one thrashes whatever comes ahead).
    limit = sum(_shard_bytes(local)) // 3 if kind == "pytree" else sum(_shard_bytes(local))
    remote = dict(cache_dir=tmp_path, cache_limit=limit, storage_options=s3_server.storage_options)

    def open_(path, **kw):
        return PyTreeDataset(path, **kw) if kind == "pytree" else TokenDataset(path, 100, seed=2, backend="numpy", **kw)

    weights = Schedule.linear([(0, [0.9, 0.1]), (30, [0.2, 0.8])]) if scheduled else (0.7, 0.3)

    def stream(first):
        with Mix([first, open_(local)], weights=weights, epoch_size=300, batch_size=8, seed=3,
                 prefetch=0, return_sources=True) as mix:
            return list(mix)

    got, want = stream(open_(url, **remote)), stream(open_(local))
    assert len(got) == len(want)
    for (gb, gs), (wb, ws) in zip(got, want, strict=True):
        assert np.array_equal(gs, ws)
        assert_tree_equal(gb, wb) if kind == "pytree" else assert_tree_equal(vars(gb), vars(wb))
    ahead = sum(name.startswith("tbl-download") for name in where)
    assert len(where) >= 6 and ahead >= 0.75 * len(where), where


def test_a_mix_reading_a_url_ahead_resumes_and_splits_over_two_ranks_as_the_local_mix(s3_server, local_rows, rows_url,
                                                                                        tmp_path):
    """The Mix's read-ahead of a URL source (through a quarter cache) under resume mid-epoch and two ranks: the
    same batches as the Mix of the local dataset, resumed or split the same way."""
    from tbl_loader import Mix

    remote = dict(cache_dir=tmp_path, cache_limit=sum(_shard_bytes(local_rows)) // 4,
                  storage_options=s3_server.storage_options)

    def mix(first, **kw):
        return Mix([first, PyTreeDataset(local_rows)], weights=(0.6, 0.4), epoch_size=240, batch_size=8, seed=5,
                   prefetch=2, return_sources=True, **kw)

    def same(got, want):
        assert len(got) == len(want)
        for (gb, gs), (wb, ws) in zip(got, want, strict=True):
            assert np.array_equal(gs, ws)
            assert_tree_equal(gb, wb)

    with mix(PyTreeDataset(local_rows)) as m:
        want = list(m)
    with mix(PyTreeDataset(rows_url, **remote)) as m:
        it = iter(m)
        head = [next(it) for _ in range(11)]
        state = m.state_dict()
    with mix(PyTreeDataset(rows_url, **remote)) as m:
        m.load_state_dict(state)
        same(head + list(m), want)
    for rank in range(2):
        with mix(PyTreeDataset(local_rows), rank=rank, world_size=2) as a, \
                mix(PyTreeDataset(rows_url, **remote), rank=rank, world_size=2) as b:
            same(list(b), list(a))


def test_mix_of_a_remote_and_a_local_dataset_equals_the_local_mix(s3_server, local_rows, rows_url, tmp_path):
    from tbl_loader import Mix

    def stream(first):
        with Mix([first, PyTreeDataset(local_rows)], weights=(0.6, 0.4), epoch_size=200, batch_size=16, seed=3,
                 prefetch=0, return_sources=True) as mix:
            return list(mix)

    sizes = _shard_bytes(local_rows)
    remote = PyTreeDataset(rows_url, cache_dir=tmp_path, cache_limit=sum(sizes) // 4,
                           storage_options=s3_server.storage_options)
    got, want = stream(remote), stream(PyTreeDataset(local_rows))
    assert len(got) == len(want)
    for (gb, gs), (wb, ws) in zip(got, want, strict=True):
        assert np.array_equal(gs, ws)
        assert_tree_equal(gb, wb)


def test_two_ranks_over_a_url_split_the_one_rank_stream(s3_server, local_rows, rows_url, tmp_path):
    opts = dict(batch_size=8, shuffle="block", seed=5, backend="numpy", return_indices=True, padding="drop")
    with PyTreeLoader(local_rows, **opts) as one:
        whole = np.sort(np.concatenate([idx for _, idx in one]))
    seen = []
    for rank in range(2):
        with PyTreeLoader(rows_url, rank=rank, world_size=2, cache_dir=tmp_path,
                          storage_options=s3_server.storage_options, **opts) as part, \
                PyTreeLoader(local_rows, rank=rank, world_size=2, **opts) as local_part:
            for (gb, gi), (wb, wi) in zip(part, local_part, strict=True):
                assert np.array_equal(gi, wi)
                assert_tree_equal(gb, wb)
                seen.append(gi)
    seen = np.concatenate(seen)
    assert len(np.unique(seen)) == len(seen)  # disjoint ranks
    assert set(seen.tolist()) <= set(whole.tolist())


def test_a_streamed_dataset_downloads_ahead_of_its_reads(s3_server, local_rows, rows_url, tmp_path):
    """Dataset.read_ahead hands the fetcher a pass's shard order: it downloads ahead, within the cache."""
    from tbl_loader.source.remote import open_streaming

    sizes = _shard_bytes(local_rows)
    ds = open_streaming(rows_url, cache_dir=tmp_path, cache_limit=6 * max(sizes),  # six shards: 4 ahead
                        storage_options=s3_server.storage_options)
    try:
        hook = ds._fetch_shard
        assert hook.lookahead == 4 and hook.cache.downloads == 0
        ds.read_ahead([9, 3, 40, 7, 12, 50])
        hook._clients()[2].wait()
        assert hook.cache.downloads == 4  # the first `lookahead` shards of the order, before any read
        assert ds[9 * SHARD_ROWS]["id"] == 9 * SHARD_ROWS  # from the cache; the reads reached the order's first
        hook._clients()[2].wait()
        assert hook.cache.downloads == 5  # ... so the window moved by one: shard 12 came
        ds[3 * SHARD_ROWS]
        hook._clients()[2].wait()
        assert hook.cache.downloads == 6  # and again: shard 50
        ds.read_ahead(range(len(sizes)))
        fetcher = hook._clients()[2]
        downloads = fetcher._pending.values
    finally:
        ds.close()
    # Closing the dataset stops its downloads ahead: none outlives it, reading a cache the caller may change.
    assert list(downloads()) and all(f.done() for f in downloads())
    downloaded = hook.counters.misses
    time.sleep(0.3)
    assert hook.counters.misses == downloaded  # and nothing queued runs later


def test_a_local_dataset_ignores_read_ahead(local_rows):
    ds = tbl_format.open(local_rows)
    ds.read_ahead([1, 2])  # every shard is on disk: nothing to do
    assert ds.open_shards == 0
    with pytest.raises(ValueError, match="read_ahead goes with a fetch_shard"):
        tbl_format.open(local_rows, read_ahead=lambda shards: None)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_open_the_dataset_their_parent_opened_without_asking_the_store(s3_server, local_jpeg, local_rows,
                                                                                tmp_path, context):
    """A DataLoader worker opens the dataset its parent opened with the parent's manifest: on a warm cache it
    reads nothing from the store (here the manifest is deleted from the store after the parent opened it)."""
    pytest.importorskip("torch")
    from tbl_loader import ImageDataset, RandomResizedCrop, upload_dataset

    bucket = s3_server.new_bucket()
    cases = []
    for name, local in (("jpeg", local_jpeg), ("rows", local_rows)):
        url = f"s3://{bucket}/{name}/"
        upload_dataset(local, url, storage_options=s3_server.storage_options)
        cases.append((name, local, url))
    for name, local, url in cases:
        remote_opts = dict(cache_dir=tmp_path, storage_options=s3_server.storage_options)
        if name == "jpeg":
            opts = dict(seed=2, backend="numpy", fields=("caption",), random_resized_crop=RandomResizedCrop(16))
            remote, plain = ImageDataset(url, **opts, **remote_opts), ImageDataset(local, **opts)
        else:
            remote, plain = PyTreeDataset(url, **remote_opts), PyTreeDataset(local)
        remote.get_batch(list(range(len(remote))))  # the parent reads everything: the cache is warm
        s3_server.boto().delete_object(Bucket=bucket, Key=f"{name}/manifest.json")
        got = _dataloader_rows(remote, context)
        want = _dataloader_rows(plain, context)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            if name == "jpeg":
                assert np.array_equal(g.images, w.images) and g.fields["caption"] == w.fields["caption"]
            else:
                assert_tree_equal(g, w)
        remote.close()
        plain.close()


def test_pytree_batch_rows_over_a_url_with_fields_resumed_and_in_spawn_workers(s3_server, local_rows, rows_url,
                                                                               tmp_path):
    """The batch object's ``.indices`` through the cells users combine: a URL within a quarter cache, ``fields=``,
    a mid-epoch resume and DataLoader workers under spawn, each against the plain local loader."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    from tbl_loader import PyTreeBatch, collate_tensors

    fields = ["id", "x"]
    opts = dict(batch_size=24, shuffle="block", seed=3, backend="numpy", fields=fields)
    remote = dict(cache_dir=tmp_path / "loader", cache_limit=sum(_shard_bytes(local_rows)) // 4,
                  storage_options=s3_server.storage_options)
    with PyTreeLoader(local_rows, **opts) as plain:
        want = list(plain)
    with PyTreeLoader(rows_url, **opts, **remote) as first:
        it = iter(first)
        head = [next(it) for _ in range(7)]
        state = first.state_dict()
    with PyTreeLoader(rows_url, **opts, **remote) as resumed:
        resumed.load_state_dict(state)
        got = head + list(resumed)
    assert len(got) == len(want) == -(-ROWS // 24)
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, PyTreeBatch) and sorted(g) == sorted(fields)
        assert np.array_equal(g.indices, w.indices) and np.array_equal(g["id"], g.indices)  # the rows they hold
        assert np.array_equal(g["x"], w["x"])

    ds = PyTreeDataset(rows_url, fields=fields, cache_dir=tmp_path / "workers", storage_options=s3_server.storage_options)
    loader = DataLoader(ds, batch_size=32, shuffle=False, num_workers=2, collate_fn=collate_tensors,
                        multiprocessing_context="spawn")
    local = PyTreeDataset(local_rows, fields=fields)
    seen = []
    for start, batch in zip(range(0, ROWS, 32), loader, strict=True):
        rows = np.arange(start, min(start + 32, ROWS))
        assert isinstance(batch, PyTreeBatch) and torch.equal(batch.indices, torch.from_numpy(rows))
        assert torch.equal(batch["x"], torch.from_numpy(local.get_batch(rows)["x"]))
        seen.append(batch.indices)
    assert torch.equal(torch.cat(seen), torch.arange(ROWS))
    ds.close()
    local.close()
