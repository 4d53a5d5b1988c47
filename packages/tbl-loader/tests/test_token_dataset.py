"""TokenDataset, the map-style twin of TokenLoader: the same windows (and packed rows, and boundary fields)
by number, in torch DataLoader workers and in Mix."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import tbl_format
from tbl_loader import (
    EpochBatchSampler,
    Mix,
    PyTreeDataset,
    TokenDataset,
    TokenLoader,
    collate_identity,
    write_tokens,
)
from tbl_loader.errors import MixError

FIELDS = ("tokens", "indices", "position_ids", "document_ids", "cu_seqlens", "loss_mask")
SETTINGS = [{}, {"boundaries": True}, {"pack": "first_fit"}, {"pack": "best_fit", "shuffle": False},
            {"boundaries": True, "rows": list(range(3, 300, 7))}, {"dtype": "int64", "boundaries": True}]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    rng = np.random.default_rng(3)
    docs = [(rng.integers(1, 60_000, n), rng.integers(0, 2, n)) for n in rng.integers(5, 150, 200).tolist()]
    return write_tokens(docs, tmp_path_factory.mktemp("tok") / "t", eos=0, chunk=128, shard_tokens=1024)


def _same(got, want, where):
    for name in FIELDS:
        a, b = getattr(got, name), getattr(want, name)
        assert (a is None) == (b is None), (where, name)
        if a is not None:
            assert np.asarray(a).dtype == np.asarray(b).dtype, (where, name)
            assert np.array_equal(np.asarray(a), np.asarray(b)), (where, name)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items())[:40] or "plain")
def test_get_batch_is_the_loaders_batch(corpus, settings):
    kw = dict(settings)
    with TokenLoader(corpus, 6, 20, seed=9, prefetch=0, backend="numpy", **kw) as loader:
        built = TokenDataset(corpus, 20, seed=9, backend="numpy", **kw)
        twin = TokenDataset.from_loader(loader)
        assert len(built) == len(twin) == loader.num_samples
        for epoch in range(2):  # the window offset changes with the epoch
            plans = list(EpochBatchSampler(loader))
            for k, batch in enumerate(loader):
                for ds in (built, twin):
                    _same(ds.get_batch(plans[k]), batch, f"epoch {epoch} batch {k}")
                built.set_epoch(epoch)  # a plain list of positions takes the dataset's epoch
                _same(built[list(plans[k])], batch, f"epoch {epoch} batch {k} as a list")
        built.close()
        twin.close()


def test_item_is_one_window_and_epochs_cut_elsewhere(corpus):
    with TokenDataset(corpus, 20, seed=9, backend="numpy", boundaries=True) as ds:
        batch = ds.get_batch([4, 0])
        row = ds[4]
        assert set(row) == {"tokens", "position_ids", "document_ids", "cu_seqlens", "loss_mask"}
        assert np.array_equal(row["tokens"], batch.tokens[0]) and np.array_equal(row["loss_mask"], batch.loss_mask[0])
        ds.set_epoch(1)
        assert not np.array_equal(ds[4]["tokens"], row["tokens"])  # another offset
    with TokenDataset(corpus, 20, seed=9, backend="numpy") as plain:
        assert np.array_equal(plain[4], batch.tokens[0])
        with pytest.raises(IndexError):
            plain.get_batch([len(plain)])


def test_pickled_copy_serves_the_same_and_notices_a_changed_dataset(corpus, tmp_path):
    with TokenDataset(corpus, 20, seed=9, backend="numpy", pack="best_fit") as ds:
        copy = pickle.loads(pickle.dumps(ds))
        _same(copy.get_batch([0, 5, 9]), ds.get_batch([0, 5, 9]), "pickled")
        copy.close()
    path = write_tokens([np.arange(1, 400)], tmp_path / "x", chunk=64)
    ds = TokenDataset(path, 20)
    blob = pickle.dumps(ds)
    ds.close()
    write_tokens([np.arange(2, 401)], path, chunk=64, overwrite=True)
    with pytest.raises(tbl_format.DatasetChangedError):
        pickle.loads(blob).get_batch([0])


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_dataloader_workers_yield_the_loaders_batches(corpus, context):
    torch = pytest.importorskip("torch")
    with TokenLoader(corpus, 6, 20, seed=2, prefetch=0, pack="best_fit") as loader:
        dl = torch.utils.data.DataLoader(TokenDataset.from_loader(loader), batch_sampler=EpochBatchSampler(loader),
                                         collate_fn=collate_identity, num_workers=2,
                                         multiprocessing_context=context, timeout=120)
        got = list(dl)  # the sampler does not move the loader
        want = list(loader)  # torch tensors
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g, w, f"{context} batch {k}")


def test_default_collate_stacks_the_same_values(corpus):
    torch = pytest.importorskip("torch")
    with TokenLoader(corpus, 6, 20, seed=2, prefetch=0, boundaries=True) as loader:
        plans = list(EpochBatchSampler(loader))  # the epoch's batches, taken before the loader moves
        dl = torch.utils.data.DataLoader(TokenDataset.from_loader(loader), batch_sampler=plans)
        got = next(iter(dl))
        want = next(iter(loader))
    assert torch.equal(got["tokens"], want.tokens) and torch.equal(got["cu_seqlens"], want.cu_seqlens)


def test_url_workers_under_fork(corpus, s3_server, tmp_path):
    torch = pytest.importorskip("torch")
    from tbl_loader import upload_dataset

    url = f"s3://{s3_server.new_bucket()}/tok/"
    upload_dataset(corpus, url, storage_options=s3_server.storage_options)
    with TokenLoader(corpus, 6, 20, seed=4, prefetch=0, boundaries=True, backend="numpy") as local:
        want = list(local)
    with TokenLoader(url, 6, 20, seed=4, prefetch=0, boundaries=True, backend="numpy", cache_dir=tmp_path,
                     storage_options=s3_server.storage_options) as remote:
        dl = torch.utils.data.DataLoader(TokenDataset.from_loader(remote), batch_sampler=EpochBatchSampler(remote),
                                         collate_fn=collate_identity, num_workers=2, multiprocessing_context="fork",
                                         timeout=120)
        got = list(dl)
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        _same(g, w, f"url batch {k}")


def test_mix_of_token_sources_serves_each_sources_windows(corpus, tmp_path):
    rng = np.random.default_rng(1)
    other = write_tokens([rng.integers(1, 999, 60) for _ in range(50)], tmp_path / "b", eos=0, chunk=64)
    a = TokenLoader(corpus, 4, 20, seed=1, prefetch=0, backend="numpy", boundaries=True)
    b = TokenDataset(other, 20, seed=1, backend="numpy", boundaries=True)
    mix = Mix([a, b], weights=(0.7, 0.3), epoch_size=200, batch_size=16, seed=3, prefetch=1, return_sources=True)
    src, pos, ep = mix.schedule(0)
    twins = mix.sources
    seen = 0
    for k, (batch, sources) in enumerate(mix):
        ids = np.arange(k * 16, min(k * 16 + 16, 200))
        assert np.array_equal(sources, src[ids])
        for row, p in enumerate(ids.tolist()):
            want = twins[src[p]].get_batch([pos[p]], epoch=int(ep[p]))
            assert int(batch.indices[row]) == int(want.indices[0])
            for name in ("tokens", "position_ids", "document_ids", "cu_seqlens", "loss_mask"):
                assert np.array_equal(getattr(batch, name)[row], getattr(want, name)[0]), (k, row, name)
            seen += 1
    assert seen == 200
    mix.close()
    a.close()
    b.close()


def test_mix_refuses_token_sources_that_cannot_be_joined(corpus, tmp_path):
    rows = tbl_format.write(({"x": i} for i in range(10)), tmp_path / "p")
    with TokenDataset(corpus, 20) as t20, TokenDataset(corpus, 24) as t24, PyTreeDataset(rows) as tree:
        with pytest.raises(MixError, match="seq_len"):
            Mix([t20, t24], batch_size=4)
        with pytest.raises(MixError, match="other structures"):
            Mix([t20, tree], batch_size=4)
        with TokenDataset(corpus, 20, boundaries=True) as fields:
            with pytest.raises(MixError, match="boundaries"):
                Mix([t20, fields], batch_size=4)
