"""shuffle="block": shards, then samples within a window of shards; same rank split and elastic resume."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_images, write_dataset

import tbl_format
from tbl_loader import ImageLoader
from tbl_loader.stream import EpochOrder, order

SHARDS = [40, 0, 17, 40, 33, 40, 1, 25]


def _blocks_of(perm, shard_rows, window, seed, epoch):
    starts = np.concatenate([[0], np.cumsum(shard_rows)])
    shard_of = np.searchsorted(starts, perm, side="right") - 1
    return shard_of, order.block_shards(shard_rows, seed, epoch, window)


@pytest.mark.parametrize("window", [1, 2, 3, 8])
def test_every_sample_once_and_only_window_shards_per_block(window):
    total = sum(SHARDS)
    for epoch in range(3):
        perm = order.block_permutation(SHARDS, 7, epoch, window)
        assert np.array_equal(np.sort(perm), np.arange(total))
        shard_of, blocks = _blocks_of(perm, SHARDS, window, 7, epoch)
        pos = 0
        for block in blocks:
            size = sum(SHARDS[k] for k in block)
            assert set(shard_of[pos : pos + size].tolist()) <= set(block)
            pos += size
        assert pos == total


def test_pure_function_of_seed_and_epoch():
    a = order.block_permutation(SHARDS, 3, 1, 2)
    assert np.array_equal(a, order.block_permutation(SHARDS, 3, 1, 2))
    assert not np.array_equal(a, order.block_permutation(SHARDS, 3, 2, 2))
    assert not np.array_equal(a, order.block_permutation(SHARDS, 4, 1, 2))
    # The shard order itself changes with the epoch, and samples within a block are shuffled.
    assert order.block_shards(SHARDS, 3, 1, 2) != order.block_shards(SHARDS, 3, 2, 2)
    assert not np.array_equal(a, np.sort(a))


def test_rank_split_and_world_size_change_lose_and_repeat_nothing():
    n = sum(SHARDS)
    rows = tuple(SHARDS)
    full = EpochOrder(n, 9, 2, shuffle="block", shard_rows=rows, padding="drop").indices
    # 2 ranks interleave to exactly the 1-rank order.
    two = [EpochOrder(n, 9, 2, shuffle="block", shard_rows=rows, world_size=2, rank=r, padding="drop").indices
           for r in range(2)]
    merged = np.empty(two[0].size * 2, dtype=np.int64)
    merged[0::2], merged[1::2] = two
    assert np.array_equal(merged, full[: merged.size])
    # 3 ranks take 60 positions, then 2 ranks resume: every sample exactly once.
    three = [EpochOrder(n, 9, 2, shuffle="block", shard_rows=rows, world_size=3, rank=r).indices[:20]
             for r in range(3)]
    rest = [EpochOrder(n, 9, 2, shuffle="block", shard_rows=rows, world_size=2, rank=r, start=60).indices
            for r in range(2)]
    seen = np.concatenate(three + rest)
    assert np.array_equal(np.sort(seen), np.arange(n))


def test_shuffle_true_is_unchanged():
    # The global permutation stays exactly what it was (saved states depend on it).
    assert np.array_equal(EpochOrder(50, 1, 0, shuffle=True).permutation, order.epoch_permutation(50, 1, 0))
    with pytest.raises(ValueError, match="block"):
        EpochOrder(50, 1, 0, shuffle="block")
    with pytest.raises(ValueError, match="shuffle"):
        EpochOrder(50, 1, 0, shuffle="blocks")


@pytest.fixture(scope="module")
def block_ds(tmp_path_factory):
    images = make_images(130, (8, 6, 3), seed=4)
    return write_dataset(tmp_path_factory.mktemp("blk") / "ds", images, np.arange(130), shard_rows=20), images


def _run(path, **kw):
    with ImageLoader(path, backend="numpy", dtype="uint8", **kw) as loader:
        return [(np.array(b.images), np.array(b.indices)) for b in loader]


def test_loader_block_resumed_equals_straight_and_ranks(block_ds):
    path, images = block_ds
    opts = dict(batch_size=8, shuffle="block", seed=2, hflip=0.5, padding="drop")
    straight = _run(path, **opts)
    ids = np.concatenate([i for _, i in straight])
    assert np.array_equal(np.sort(ids), np.arange(130))
    for imgs, idx in straight:  # the right images (flip drawn per sample id)
        flips = order.flip_draws(2, 0, idx, 0.5)
        want = np.where(flips[:, None, None, None], images[idx][:, :, ::-1], images[idx]).transpose(0, 3, 1, 2)
        assert np.array_equal(imgs, want)
    with ImageLoader(path, backend="numpy", dtype="uint8", **opts) as first:
        it = iter(first)
        head = [np.array(next(it).indices) for _ in range(5)]
        state = first.state_dict()
    # Resume on 2 ranks: together they serve exactly the rest.
    tails = []
    for r in range(2):
        with ImageLoader(path, backend="numpy", dtype="uint8", rank=r, world_size=2, **opts) as ld:
            ld.load_state_dict(state)
            tails.append(np.concatenate([np.array(b.indices) for b in ld]))
    rest = ids[40:]
    merged = np.empty(tails[0].size * 2, dtype=np.int64)
    merged[0::2], merged[1::2] = tails
    assert np.array_equal(np.concatenate(head), ids[:40])
    assert np.array_equal(merged, rest[: merged.size])
    # Resumed on one rank: every element of every batch equals the straight run's.
    with ImageLoader(path, backend="numpy", dtype="uint8", **opts) as ld:
        ld.load_state_dict(state)
        resumed = [(np.array(b.images), np.array(b.indices)) for b in ld]
    for (a, ai), (b, bi) in zip(resumed, straight[5:], strict=True):
        assert np.array_equal(a, b) and np.array_equal(ai, bi)


def test_block_state_refused_by_a_global_shuffle_loader(block_ds):
    from tbl_loader.errors import StateMismatchError

    path, _ = block_ds
    with ImageLoader(path, batch_size=8, shuffle="block", backend="numpy") as a:
        next(iter(a))
        state = a.state_dict()
    with ImageLoader(path, batch_size=8, shuffle=True, backend="numpy") as b, pytest.raises(StateMismatchError):
        b.load_state_dict(state)


def test_page_release_follows_the_block_order(block_ds, monkeypatch):
    """Each shard leaves the mapping and the page cache right after its last batch; the batches are unchanged."""
    import mmap
    import os

    from tbl_loader.source import advice
    from tbl_loader.source import local as local_shards

    if not hasattr(mmap.mmap, "madvise") or advice._DONTNEED is None or advice._FADV_DONTNEED is None:
        pytest.skip("no madvise / posix_fadvise on this platform")
    path, _ = block_ds
    calls, fadvised = [], []
    real_release, real_fadvise = advice.PageAdvisor._release, os.posix_fadvise

    def release(self, k):
        assert self.maps[k] is not None  # the column's mmap was found: the advice reaches the kernel
        calls.append((self.current, k))
        return real_release(self, k)

    def batch(self, number, _orig=advice.PageAdvisor.batch):
        self.current = number
        return _orig(self, number)

    def fadvise(fd, offset, length, option):
        fadvised.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, option))
        return real_fadvise(fd, offset, length, option)

    monkeypatch.setattr(local_shards, "fits_in_memory", lambda nbytes: False)  # as if it were several times the RAM
    monkeypatch.setattr(advice.PageAdvisor, "_release", release)
    monkeypatch.setattr(advice.PageAdvisor, "batch", batch)
    monkeypatch.setattr(advice.os, "posix_fadvise", fadvise)
    opts = dict(batch_size=8, shuffle="block", seed=2, hflip=0.5)
    got = _run(path, **opts)
    monkeypatch.undo()
    assert got and all(np.array_equal(a[0], b[0]) for a, b in zip(got, _run(path, **opts), strict=True))
    starts = np.arange(0, 140, 20)
    ids = np.concatenate([i for _, i in got])
    shard_of = np.searchsorted(starts, ids, side="right") - 1
    batch_of = np.arange(ids.size) // 8
    files = [str(f) for f in tbl_format.open(path).files]
    for k in range(7):
        last = batch_of[shard_of == k].max()
        done = [n for n, s in calls if s == k]
        assert done == ([] if last == batch_of.max() else [last + 1])
        dropped = [c for c in fadvised if c[0] == files[k] and c[3] != os.POSIX_FADV_WILLNEED]  # not read-ahead
        assert len(dropped) == len(done)
        for _, offset, length, option in dropped:  # the page-aligned image column of that file
            assert option == os.POSIX_FADV_DONTNEED and offset % mmap.PAGESIZE == 0
            assert length >= int((shard_of == k).sum()) * 8 * 6 * 3


def test_a_dataset_that_fits_in_memory_keeps_its_page_cache(block_ds, monkeypatch):
    """No release when the image column fits the memory available: the next epoch reads it from memory."""
    from tbl_loader.source import advice
    from tbl_loader.source import local as local_shards

    path, _ = block_ds
    assert advice.fits_in_memory(1 << 20) and not advice.fits_in_memory(1 << 62)
    dropped = []
    monkeypatch.setattr(advice.os, "posix_fadvise",  # releases only: the read-ahead's WILLNEED is not one
                        lambda *a: None if a[3] == advice._FADV_WILLNEED else dropped.append(a))
    monkeypatch.setattr(advice.PageAdvisor, "_release", lambda self, k: dropped.append(k))
    with ImageLoader(path, batch_size=8, shuffle="block", backend="numpy") as loader:
        assert len(list(loader)) == 17
        assert loader.shards._advisor is None
    assert dropped == []
    monkeypatch.setattr(local_shards, "fits_in_memory", lambda nbytes: False)
    with ImageLoader(path, batch_size=8, shuffle="block", backend="numpy") as loader:
        list(loader)
        assert loader.shards._advisor is not None
    assert dropped and len(set(dropped)) == len(dropped)  # released: each finished shard once


def test_block_window_reaches_the_order(block_ds):
    path, _ = block_ds
    with ImageLoader(path, batch_size=8, shuffle="block", block_window=2, seed=6, backend="numpy") as loader:
        ids = np.concatenate([np.array(b.indices) for b in loader])
    assert np.array_equal(ids, order.block_permutation([20] * 6 + [10], 6, 0, 2))


def _read_ahead_run(path, monkeypatch, available, **opts):
    """The stream with the advisor on (memory_available() reporting ``available``), and every read ahead as
    (batch number when asked, file, offset, length)."""
    from tbl_loader.source import advice
    from tbl_loader.source import local as local_shards

    reads, current = [], [None]

    def batch(self, number, _orig=advice.PageAdvisor.batch):
        current[0] = number
        return _orig(self, number)

    def read(self, path, offset, length, _orig=advice._ShardReader.read):
        reads.append((current[0], str(path), offset, length))
        return _orig(self, path, offset, length)

    monkeypatch.setattr(local_shards, "fits_in_memory", lambda nbytes: False)
    monkeypatch.setattr(advice, "memory_available", lambda: available)
    monkeypatch.setattr(advice.PageAdvisor, "batch", batch)
    monkeypatch.setattr(advice._ShardReader, "read", read)
    got = _run(path, **opts)
    monkeypatch.undo()
    return got, reads


def test_read_ahead_reads_the_next_shards_before_their_first_batch_within_the_budget(block_ds, monkeypatch):
    """Shards are read ahead once each, strictly before the batch that first reads them, never before the
    budget is first measured, with the shards being read and those read ahead within half the memory
    available; the batches are those of a run without any advice."""
    path, _ = block_ds
    shard_bytes = 20 * 8 * 6 * 3
    opts = dict(batch_size=8, shuffle="block", seed=2, hflip=0.5, block_window=2)
    got, reads = _read_ahead_run(path, monkeypatch, 2 * 4 * shard_bytes, **opts)  # half: 4 shards
    assert all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(got, _run(path, **opts), strict=True))
    ids = np.concatenate([i for _, i in got])
    shard_of = np.searchsorted(np.arange(0, 140, 20), ids, side="right") - 1
    batch_of = np.arange(ids.size) // 8
    first = {k: int(batch_of[shard_of == k].min()) for k in range(7)}
    last = {k: int(batch_of[shard_of == k].max()) for k in range(7)}
    files = [str(f) for f in tbl_format.open(path).files]
    read_shards = [files.index(f) for _, f, _, _ in reads]
    assert reads and len(read_shards) == len(set(read_shards))  # each shard at most once
    for (number, _, offset, length), k in zip(reads, read_shards, strict=True):
        assert number >= 8 and number < first[k]  # ahead of its first batch; none before the first measure
        assert length == 20 * 8 * 6 * 3 if k < 6 else length == 10 * 8 * 6 * 3
        assert offset > 0
        reading = {j for j in range(7) if first[j] <= number <= last[j]}
        ahead = {files.index(f) for n, f, _, _ in reads if n <= number and first[files.index(f)] > number}
        assert (len(reading) + len(ahead)) * shard_bytes <= 4 * shard_bytes
    assert len(read_shards) >= 2  # the budget leaves room for the next window's 2 shards: they were read


def test_no_read_ahead_when_the_shards_being_read_fill_the_budget(block_ds, monkeypatch):
    path, _ = block_ds
    opts = dict(batch_size=8, shuffle="block", seed=2, block_window=2)
    got, reads = _read_ahead_run(path, monkeypatch, 2 * 2 * 20 * 8 * 6 * 3, **opts)  # half: the 2 being read
    assert reads == [] and len(got) == 17
