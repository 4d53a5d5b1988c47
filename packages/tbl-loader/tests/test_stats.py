"""loader.stats(): per-stage counters, consistent with what was served (never a timing threshold)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from conftest import N_IMAGES, needs_per_sample

import tbl_format
from tbl_loader import ImageLoader, PyTreeLoader, TokenLoader, write_tokens
from tbl_loader.host.stats import SCHEMA, STAGES

KEYS = {"schema", "rank", "world_size", "batches", "samples", "batches_produced", "seconds", "decoded_rows",
        "queue_depth_mean", "prefetch", "timed", "cache"}


def _check_shape(stats: dict) -> None:
    assert set(stats) == KEYS
    assert stats["schema"] == SCHEMA
    assert set(stats["seconds"]) == set(STAGES)
    assert all(isinstance(v, float) and v >= 0.0 for v in stats["seconds"].values())
    assert set(stats["cache"]) == {"hits", "misses", "bytes_downloaded", "download_seconds"}


@pytest.mark.parametrize("prefetch", [0, 2])
def test_counts_equal_what_was_served(dataset_path, prefetch):
    with ImageLoader(dataset_path, 16, backend="numpy", prefetch=prefetch) as ld:
        assert ld.stats()["batches"] == 0
        served = sum(len(b.indices) for b in ld)
        stats = ld.stats()
    _check_shape(stats)
    assert served == N_IMAGES
    assert stats["batches"] == stats["batches_produced"] == -(-N_IMAGES // 16)
    assert stats["samples"] == N_IMAGES
    assert stats["prefetch"] == prefetch
    assert stats["decoded_rows"] == 0
    assert stats["cache"] == {"hits": 0, "misses": 0, "bytes_downloaded": 0, "download_seconds": 0.0}
    assert stats["seconds"]["transform"] == 0.0 and stats["seconds"]["decode"] == 0.0
    if prefetch == 0:  # no thread: the producer never waits, and nothing is ever queued
        assert stats["seconds"]["producer_wait"] == 0.0 and stats["queue_depth_mean"] == 0.0
    assert 0.0 <= stats["queue_depth_mean"] <= prefetch


def test_counters_accumulate_over_epochs_and_a_break(dataset_path):
    with ImageLoader(dataset_path, 10, backend="numpy") as ld:
        for k, _ in enumerate(ld):
            if k == 2:
                break
        after_break = ld.stats()["batches"]
        ld.set_epoch(1)
        list(ld)
        stats = ld.stats()
    assert after_break == 3
    assert stats["batches"] == 3 + 11 and stats["samples"] == 30 + N_IMAGES
    assert stats["batches_produced"] >= stats["batches"]  # a break may leave prefetched batches unserved


def test_a_sleeping_transform_dominates(dataset_path):
    naps = []

    def slow(batch):
        time.sleep(0.02)
        naps.append(1)
        return batch

    with ImageLoader(dataset_path, 20, backend="numpy", transform=slow) as ld:
        list(ld)
        seconds = ld.stats()["seconds"]
    assert len(naps) == 6
    assert seconds["transform"] >= 6 * 0.02  # each sleep is counted in full (a lower bound, never flaky)
    others = ("read", "decode", "kernel", "device_copy", "device_transform")
    assert seconds["transform"] > sum(seconds[k] for k in others)


def test_a_slow_consumer_shows_as_producer_wait(dataset_path):
    with ImageLoader(dataset_path, 10, backend="numpy", prefetch=1) as ld:
        for _ in ld:
            time.sleep(0.05)  # far longer than making a batch of ten 12 x 10 images, however busy the machine
        stats = ld.stats()
    # While the consumer sleeps the producer has filled the queue and waits for room: at least one whole nap
    # (of 11) is counted there.
    assert stats["seconds"]["producer_wait"] >= 0.05
    assert stats["seconds"]["producer_wait"] > stats["seconds"]["consumer_wait"]


def test_on_stats_hook_every_n_batches(dataset_path):
    seen = []
    with ImageLoader(dataset_path, 10, backend="numpy") as ld:
        ld.on_stats(seen.append, every=4)
        list(ld)
    assert [s["batches"] for s in seen] == [4, 8]
    assert [s["samples"] for s in seen] == [40, 80]
    with pytest.raises(ValueError, match="every must be an int >= 1"):
        ld.on_stats(seen.append, every=0)
    with pytest.raises(TypeError, match="callback must be callable"):
        ld.on_stats("log", every=1)


def test_ranks_count_their_own(dataset_path):
    stats = []
    for rank in range(2):
        with ImageLoader(dataset_path, 8, backend="numpy", rank=rank, world_size=2) as ld:
            list(ld)
            stats.append(ld.stats())
    assert [(s["rank"], s["world_size"]) for s in stats] == [(0, 2), (1, 2)]
    assert [s["samples"] for s in stats] == [51, 51]  # 101 rows padded by wrapping to 102, split in two


@needs_per_sample  # JPEG rows are decoded per sample
def test_jpeg_decode_rows_counted(tmp_path):
    simplejpeg = pytest.importorskip("simplejpeg")
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int")})
    rng = np.random.default_rng(0)
    with tbl_format.Writer(tmp_path / "j.tbl", schema) as w:
        for i in range(9):
            img = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
            w.write({"image": simplejpeg.encode_jpeg(img, quality=90), "height": 20, "width": 24, "label": i})
    with ImageLoader(tmp_path / "j.tbl", 4, backend="numpy", center_crop=16, num_threads=1) as ld:
        list(ld)
        stats = ld.stats()
    assert stats["decoded_rows"] == 9 and stats["batches"] == 3
    assert stats["seconds"]["decode"] > 0.0


def test_a_remote_cache_shows_misses_then_hits(dataset_path, tmp_path):
    pytest.importorskip("obstore", reason="the remote extra (tbl-loader[remote]) is not installed")
    from tbl_loader import upload_dataset

    url = (tmp_path / "store").resolve().as_uri() + "/ds/"
    upload_dataset(dataset_path, url, storage_options={"mkdir": True})
    shard_bytes = sum(p.stat().st_size for p in dataset_path.glob("*.tbl"))
    cache = tmp_path / "cache"
    with ImageLoader(url, 16, backend="numpy", cache_dir=cache, shuffle=False) as cold:
        list(cold)
        first = cold.stats()["cache"]
    with ImageLoader(url, 16, backend="numpy", cache_dir=cache, shuffle=False) as warm:
        list(warm)
        second = warm.stats()["cache"]
    assert first["misses"] == 3 and first["bytes_downloaded"] == shard_bytes  # the three shards, once each
    assert second["misses"] == 0 and second["bytes_downloaded"] == 0 and second["hits"] >= 3


def test_pytree_and_token_loaders_count(tmp_path):
    samples = [{"x": np.int64(i), "name": f"s{i}"} for i in range(13)]
    path = tbl_format.write(samples, tmp_path / "p.tbl")
    with PyTreeLoader(path, 5, backend="numpy") as ld:
        list(ld)
        stats = ld.stats()
    _check_shape(stats)
    assert (stats["batches"], stats["samples"]) == (3, 13)

    write_tokens([np.arange(100, dtype=np.uint16), np.arange(50, dtype=np.uint16)], tmp_path / "t")
    with TokenLoader(tmp_path / "t", 2, seq_len=10, backend="numpy") as tl:
        windows = sum(len(b.tokens) for b in tl)
        stats = tl.stats()
    _check_shape(stats)
    assert stats["samples"] == windows and stats["batches"] == -(-windows // 2)


def test_time_stages_off_keeps_counting(dataset_path):
    with ImageLoader(dataset_path, 10, backend="numpy") as ld:
        ld.time_stages(False)
        list(ld)
        off = ld.stats()
        ld.time_stages(True)
        ld.set_epoch(1)
        list(ld)
        on = ld.stats()
    assert off["timed"] is False and on["timed"] is True
    assert off["batches"] == 11 and off["samples"] == N_IMAGES
    assert all(v == 0.0 for v in off["seconds"].values())  # no clock was read
    assert on["batches"] == 22 and on["seconds"]["consumer_wait"] > 0.0
