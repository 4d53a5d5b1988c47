"""2 ranks x 2 torch DataLoader workers over one shard cache, against a real S3 server on 127.0.0.1 (moto).

Two spawned rank processes (world_size=2) each serve an s3:// dataset through ImageDataset +
EpochBatchSampler + ``DataLoader(num_workers=2, multiprocessing_context="spawn")``; the six processes of the
node (two ranks, four workers) share one ``cache_dir``. Every sample comes exactly once per epoch, each rank's
batches are the local ImageLoader's for that rank, the images are the local rows, and each shard is
downloaded once on the node.
"""

from __future__ import annotations

import json
import multiprocessing

import numpy as np
import pytest
from conftest import make_images, write_dataset

from tbl_loader import ImageLoader

N = 96
SHARD_ROWS = 12  # 8 shards
EPOCHS = 2


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    images = make_images(N, (10, 8, 3), seed=7)
    labels = np.arange(N, dtype=np.int64) * 5
    return write_dataset(tmp_path_factory.mktemp("ranks") / "ds", images, labels, shard_rows=SHARD_ROWS), images


def test_two_ranks_two_dataloader_workers_share_one_cache(s3_server, local_ds, tmp_path):
    pytest.importorskip("torch")
    import remote_ranks

    from tbl_loader.source.upload import upload_dataset

    path, rows = local_ds
    url = f"s3://{s3_server.new_bucket()}/ds/"
    upload_dataset(path, url, storage_options=s3_server.storage_options)
    cache = tmp_path / "cache"
    spawn = multiprocessing.get_context("spawn")
    outs = [str(tmp_path / f"rank{rank}") for rank in range(2)]
    ranks = [spawn.Process(target=remote_ranks.run_rank,
                           args=(rank, url, str(cache), s3_server.storage_options, EPOCHS, outs[rank]))
             for rank in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(timeout=600)
        assert p.exitcode == 0
    got = [dict(np.load(out + ".npz")) for out in outs]
    info = [json.loads(open(out + ".json").read()) for out in outs]
    per_epoch = N // 2 // 8  # batches per rank per epoch
    for epoch in range(EPOCHS):
        seen = np.concatenate([g["indices"][epoch * per_epoch:(epoch + 1) * per_epoch].reshape(-1) for g in got])
        assert np.array_equal(np.sort(seen), np.arange(N))  # every sample exactly once in the epoch
    for rank, g in enumerate(got):
        with ImageLoader(path, batch_size=8, shuffle="block", seed=3, rank=rank, world_size=2, padding="drop",
                         backend="numpy", dtype="uint8", layout="HWC") as local:
            expected = []
            for epoch in range(EPOCHS):
                local.set_epoch(epoch)
                expected += [(np.asarray(b.indices), np.asarray(b.images), np.asarray(b.labels)) for b in local]
        assert len(expected) == g["indices"].shape[0]
        for k, (ids, images, labels) in enumerate(expected):
            assert np.array_equal(g["indices"][k], ids)  # the loader's own epoch order, batch for batch
            assert np.array_equal(g["images"][k], images) and np.array_equal(g["labels"][k], labels)
            assert np.array_equal(g["images"][k], rows[ids])  # the local dataset's rows, bit for bit
            assert np.array_equal(g["labels"][k], ids * 5)
    assert all(i["workers"] == [0, 1] for i in info)  # both workers of each rank served batches
    # Each shard was downloaded once on the node: over the two ranks' processes and their four workers.
    assert sum(sum(i["downloads"].values()) for i in info) == N // SHARD_ROWS


def test_pass_plan_hands_each_worker_its_batches_in_order():
    from tbl_loader.image import PassPlan
    from tbl_loader.stream import EpochOrder

    order = EpochOrder(50, seed=4, epoch=2, shuffle="block", shard_rows=(12, 12, 12, 14))
    described = {k: v for k, v in order.__dict__.items() if k in EpochOrder.__dataclass_fields__ and k != "shard_rows"}
    ids = order.indices
    for number in (0, 1, 5):
        plan = PassPlan(described, 4, False, number)
        parts = [plan.batches_of_worker((12, 12, 12, 14), w, 3) for w in range(3)]
        batches = [ids[k * 4:(k + 1) * 4] for k in range(number, 13)]
        for w in range(3):  # torch's rule: batch k goes to worker k % 3
            assert np.array_equal(parts[w], np.concatenate([b for k, b in enumerate(batches, number) if k % 3 == w]))
        assert np.array_equal(plan.batches_of_worker((12, 12, 12, 14), 0, 1), ids[number * 4:])


@pytest.mark.parametrize("slot", [(0, 1), (1, 2)])
def test_a_worker_downloads_ahead_the_shards_of_its_own_batches(s3_server, local_ds, tmp_path, monkeypatch, slot):
    """ImageDataset on a URL, fed EpochBatchSampler's batches: the first batch of a pass hands the fetcher
    the shards of the batches this process will read (as DataLoader worker ``slot``), in order; the batches
    are the loader's."""
    from tbl_loader import EpochBatchSampler, ImageDataset
    from tbl_loader.image import torch_dataset
    from tbl_loader.source.upload import upload_dataset

    path, _ = local_ds
    url = f"s3://{s3_server.new_bucket()}/ds/"
    upload_dataset(path, url, storage_options=s3_server.storage_options)
    monkeypatch.setattr(torch_dataset, "_worker_slot", lambda: slot)
    worker, workers = slot
    opts = dict(batch_size=8, shuffle="block", seed=3, backend="numpy")
    with ImageLoader(path, **opts) as loader:
        loader.set_epoch(1)
        mine = [b for k, b in enumerate(EpochBatchSampler(loader)) if k % workers == worker]
        expected = [(np.array(b.images), np.array(b.indices)) for b in loader]
        ds = ImageDataset(url, seed=3, backend="numpy", epoch=1, cache_dir=tmp_path / "cache",
                          storage_options=s3_server.storage_options)
        got = []
        for n, positions in enumerate(mine):
            batch = ds.get_batch(positions)
            if n == 0:  # the fetcher's sequence: the shards of this worker's batches, in the order first read
                ids = np.concatenate([np.asarray(b) for b in mine])
                shard = ids // SHARD_ROWS
                _, first = np.unique(shard, return_index=True)
                assert ds.dataset.fetcher._sequence == [int(shard[i]) for i in np.sort(first)]
            got.append((np.array(batch.images), np.array(batch.indices)))
        ds.dataset.fetcher.wait()
        assert ds.dataset.cache.downloads == len(set((np.concatenate([np.asarray(b) for b in mine]) // SHARD_ROWS).tolist()))
        ds.close()
    for (gi, gx), (ei, ex) in zip(got, expected[worker::workers], strict=True):
        assert np.array_equal(gx, ex) and np.array_equal(gi, ei)
