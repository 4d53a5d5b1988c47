"""Remote datasets against a real S3 server on 127.0.0.1 (moto): equality with local, the cache, faults.

Every test talks to the server over HTTP through the storage library, exactly as
a user's S3 would be used. They skip when the remote extra or moto[server] is
missing; CI installs both.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from datetime import timedelta

import numpy as np
import pytest
from conftest import make_images, write_dataset

import tbl_format
from tbl_loader import ImageLoader, RandomResizedCrop

N = 160
SHARD_ROWS = 16  # 10 shards


@pytest.fixture(scope="module")
def local_ds(tmp_path_factory):
    images = make_images(N, (16, 12, 3), seed=3)
    labels = np.arange(N, dtype=np.int64) * 3
    return write_dataset(tmp_path_factory.mktemp("remote") / "ds", images, labels, shard_rows=SHARD_ROWS)


@pytest.fixture(scope="module")
def remote_url(s3_server, local_ds):
    from tbl_loader.source.upload import upload_dataset

    url = f"s3://{s3_server.new_bucket()}/datasets/ds/"
    upload_dataset(local_ds, url, storage_options=s3_server.storage_options)
    return url


def _dataset_bytes(path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.name != "manifest.json")


def _stream(loader, epochs=2):
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for b in loader:
            out.append((np.array(b.images), np.array(b.labels), np.array(b.indices)))
    return out


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_remote_equals_local_every_batch(s3_server, local_ds, remote_url, tmp_path, shuffle):
    limit = int(0.3 * _dataset_bytes(local_ds))
    opts = dict(batch_size=12, shuffle=shuffle, seed=5, hflip=0.5, backend="numpy",
                random_resized_crop=RandomResizedCrop(8, scale=(0.3, 1.0)))
    with ImageLoader(local_ds, **opts) as local:
        expected = _stream(local)
    with ImageLoader(remote_url, cache_dir=tmp_path / "cache", cache_limit=limit,
                     storage_options=s3_server.storage_options, **opts) as remote:
        got = _stream(remote)
        assert remote.dataset.cache.size() <= limit
        assert remote.dataset.fingerprint == tbl_format.open(local_ds).fingerprint
    assert len(got) == len(expected)
    for (gi, gl, gx), (ei, el, ex) in zip(got, expected, strict=True):
        assert np.array_equal(gx, ex) and np.array_equal(gl, el) and np.array_equal(gi, ei)


def test_remote_resume_mid_epoch_equals_straight(s3_server, local_ds, remote_url, tmp_path):
    opts = dict(batch_size=10, shuffle="block", seed=1, hflip=0.5, backend="numpy",
                cache_dir=tmp_path / "cache", cache_limit=int(0.3 * _dataset_bytes(local_ds)),
                storage_options=s3_server.storage_options)
    with ImageLoader(remote_url, **opts) as straight:
        full = [np.array(b.images) for b in straight]
    with ImageLoader(remote_url, **opts) as first:
        it = iter(first)
        head = [np.array(next(it).images) for _ in range(7)]
        state = first.state_dict()
    with ImageLoader(remote_url, **opts) as resumed:
        resumed.load_state_dict(state)
        tail = [np.array(b.images) for b in resumed]
    assert len(head) + len(tail) == len(full)
    for a, b in zip(head + tail, full, strict=True):
        assert np.array_equal(a, b)


def test_a_block_shuffle_through_a_cache_holding_the_dataset_reads_every_shard_ahead(s3_server, local_ds, remote_url,
                                                                                      tmp_path):
    """With the dataset's bytes as cache_limit, the first batch's read queues the whole epoch's shard order:
    once the downloads under way end, every shard is cached, each downloaded once, and the epoch equals local."""
    limit = _dataset_bytes(local_ds)
    opts = dict(batch_size=12, shuffle="block", seed=2, hflip=0.5, backend="numpy", prefetch=0)
    with ImageLoader(local_ds, **opts) as local:
        expected = _stream(local, epochs=1)
    with ImageLoader(remote_url, cache_dir=tmp_path, cache_limit=limit, storage_options=s3_server.storage_options,
                     **opts) as remote:
        ds = remote.dataset
        assert ds.fetcher.lookahead == len(ds.shard_entries)
        it = iter(remote)
        got = [next(it)]
        ds.fetcher.wait()
        # A shard the first batch reads is downloaded by the read itself, outside the futures wait() waits for,
        # and counted before it is checked and renamed into place: give such a download time to land (no read
        # happens meanwhile, so whatever lands was queued by the first batch).
        deadline = time.monotonic() + 30
        while len(ds.cache.cached_files()) < len(ds.shard_entries) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ds.cache.downloads == len(ds.shard_entries) == len(ds.cache.cached_files())
        got = [(np.array(b.images), np.array(b.labels), np.array(b.indices)) for b in [*got, *it]]
        assert ds.cache.downloads == len(ds.shard_entries) and ds.cache.size() <= limit
    assert len(got) == len(expected)
    for (gi, gl, gx), (ei, el, ex) in zip(got, expected, strict=True):
        assert np.array_equal(gx, ex) and np.array_equal(gl, el) and np.array_equal(gi, ei)


def test_cache_reuses_shards_and_evicts_lru_within_limit(s3_server, local_ds, remote_url, tmp_path):
    from tbl_loader.source.remote import RemoteDataset

    shard_size = max(p.stat().st_size for p in local_ds.iterdir() if p.suffix == ".tbl")
    limit = 3 * shard_size
    with RemoteDataset(remote_url, cache_dir=tmp_path, cache_limit=limit,
                       storage_options=s3_server.storage_options) as ds:
        for k in range(len(ds.segment_rows)):
            ds.prepare_rows([ds.shard_entries and sum(ds.segment_rows[:k])])
            assert ds.cache.size() <= limit
        downloads = ds.cache.downloads
        cached = {p.name for p in ds.cache.cached_files()}
        assert len(cached) == 3
        # The three most recently used are the last three; asking again downloads nothing.
        last = sorted(e["file"] for e in ds.shard_entries)[-3:]
        assert cached == set(last)
        ds.prepare_rows([N - 1])
        assert ds.cache.downloads == downloads


def test_a_download_ahead_never_takes_the_cache_over_its_limit(s3_server, local_ds, remote_url, tmp_path):
    """Read-ahead is optional: with the limit taken by a shard in use (its lock held) and a download in flight,
    a download ahead fetches nothing; a read's own fetch still gets its shard."""
    from tbl_loader.source.cache import _TMP_MARK
    from tbl_loader.source.remote import RemoteDataset

    shard_size = max(p.stat().st_size for p in local_ds.iterdir() if p.suffix == ".tbl")
    with RemoteDataset(remote_url, cache_dir=tmp_path, cache_limit=2 * shard_size,
                       storage_options=s3_server.storage_options) as ds:
        cache, entries = ds.cache, ds.shard_entries
        # another reader's download of shard 9, in flight: its temporary file names its size
        (ds.local_dir / f".{entries[9]['file']}{_TMP_MARK}feed-{shard_size}").touch()
        with cache.holding(ds.store, ds.local_dir, entries[0]):  # shard 0 in use
            assert cache.fetch_ahead(ds.store, ds.local_dir, entries[1]) is None
            assert not (ds.local_dir / entries[1]["file"]).exists() and cache.downloads == 1
            assert cache.fetch(ds.store, ds.local_dir, entries[1]).exists()  # a read goes over, as documented
        for tmp in ds.local_dir.glob(f"*{_TMP_MARK}*"):
            tmp.unlink()
        # with room, a download ahead evicts the least recently used shard like any other
        assert cache.fetch_ahead(ds.store, ds.local_dir, entries[2]) is not None
        assert cache.size() <= 2 * shard_size


def test_a_download_renamed_into_place_counts_once(s3_server, local_ds, remote_url, tmp_path):
    """A download published between the eviction's two scans is seen both in flight and in place: it counts once,
    so under a limit the shards fit exactly, a download ahead still fits (it used to look one shard over and
    fetch nothing)."""
    from tbl_loader.source.cache import _TMP_MARK
    from tbl_loader.source.remote import RemoteDataset

    shard_size = max(p.stat().st_size for p in local_ds.iterdir() if p.suffix == ".tbl")
    with RemoteDataset(remote_url, cache_dir=tmp_path, cache_limit=2 * shard_size,
                       storage_options=s3_server.storage_options) as ds:
        cache, entries = ds.cache, ds.shard_entries
        assert cache.fetch(ds.store, ds.local_dir, entries[0]).exists()
        # shard 0 as the scans see it in the rename window: its temporary file beside the published file
        (ds.local_dir / f".{entries[0]['file']}{_TMP_MARK}feed-{shard_size}").touch()
        assert cache.fetch_ahead(ds.store, ds.local_dir, entries[1]) == ds.local_dir / entries[1]["file"]
        assert (ds.local_dir / entries[0]["file"]).exists() and cache.downloads == 2


def test_parallel_downloads_stay_within_the_limit(s3_server, local_ds, remote_url, tmp_path):
    """Eight threads each fetching shards ahead through a two-shard cache: the bytes on disk, shards and
    downloads in flight, never pass the limit (room is made and the download's file made under one lock)."""
    import threading

    from tbl_loader.source.cache import _TMP_MARK
    from tbl_loader.source.remote import RemoteDataset

    shard_size = max(p.stat().st_size for p in local_ds.iterdir() if p.suffix == ".tbl")
    limit = 2 * shard_size
    with RemoteDataset(remote_url, cache_dir=tmp_path, cache_limit=limit,
                       storage_options=s3_server.storage_options) as ds:
        cache, entries = ds.cache, ds.shard_entries
        seen, done = [], threading.Event()

        sizes = {e["file"]: e["size"] for e in entries}

        def on_disk():  # shards published or downloading, by name: a rename seen twice in one listing counts once
            names = {p.name.partition(_TMP_MARK)[0].removeprefix(".") for p in ds.local_dir.iterdir()}
            return sum(sizes.get(name, 0) for name in names)

        def watch():
            while not done.is_set():
                seen.append(on_disk())

        def fetch_ahead(start):
            for k in range(start, start + 20):
                cache.fetch_ahead(ds.store, ds.local_dir, entries[k % len(entries)])

        watcher = threading.Thread(target=watch)
        watcher.start()
        threads = [threading.Thread(target=fetch_ahead, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        watcher.join()
        assert cache.size() <= limit and max(seen) <= limit
        assert cache.downloads >= 2


def test_evicted_while_mapped_stays_readable(s3_server, local_ds, remote_url, tmp_path):
    from tbl_loader.source.remote import RemoteDataset

    local = tbl_format.open(local_ds)
    shard_size = max(p.stat().st_size for p in local_ds.iterdir() if p.suffix == ".tbl")
    with RemoteDataset(remote_url, cache_dir=tmp_path, cache_limit=shard_size,
                       storage_options=s3_server.storage_options, max_mapped=100) as ds:
        ds.prepare_rows([0])
        view = ds.segment("image", 0)
        path = ds.local_dir / ds.shard_entries[0]["file"]
        assert path.exists()
        ds.prepare_rows([SHARD_ROWS])  # the next shard: the limit holds one, so shard 0 is unlinked
        assert not path.exists()
        assert np.array_equal(view, local.segments("image")[0])  # still mapped, still the same bytes
    local.close()


def test_a_shard_not_mapped_is_never_read(s3_server, local_ds, remote_url, tmp_path):
    """Rows of a shard that is not mapped raise ShardNotMappedError naming it; they are never served as zeros."""
    from tbl_loader.errors import ShardNotMappedError
    from tbl_loader.source.remote import RemoteDataset

    local = tbl_format.open(local_ds)
    shard_size = max(p.stat().st_size for p in local_ds.iterdir() if p.suffix == ".tbl")
    with RemoteDataset(remote_url, cache_dir=tmp_path, cache_limit=2 * shard_size, max_mapped=1,
                       storage_options=s3_server.storage_options) as ds:
        rows = np.array([3 * SHARD_ROWS + 5, SHARD_ROWS + 1, 3 * SHARD_ROWS], dtype=np.int64)
        victim = ds.shard_entries[1]["file"]
        with pytest.raises(ShardNotMappedError, match=f"{remote_url}{victim}"):
            ds.columns(["image"], rows)  # nothing prepared: shard 1 (and 3) not mapped
        ds.prepare_rows(rows)
        found, local_rows = ds.columns(["image", "label"], rows)
        column = np.concatenate(found["image"])
        assert np.array_equal(column[local_rows], np.concatenate(local.segments("image"))[rows])
        assert np.array_equal(np.concatenate(found["label"])[local_rows], rows * 3)
        ds.prepare_rows([5 * SHARD_ROWS])  # max_mapped=1: shards 1 and 3 are unmapped now
        assert 1 not in ds.mapped_shards
        with pytest.raises(ShardNotMappedError, match=victim):
            ds.columns(["image"], rows)
        with pytest.raises(ShardNotMappedError, match=victim):
            ds.segment("image", 1)
        with pytest.raises(ShardNotMappedError):
            ds.segments("image")
        # The loader's own reads map first: a batch whose shards were unmapped in between is still exact.
        with ImageLoader(remote_url, batch_size=12, shuffle=True, seed=2, backend="numpy", cache_dir=tmp_path,
                         cache_limit=2 * shard_size, storage_options=s3_server.storage_options) as remote, \
                ImageLoader(local_ds, batch_size=12, shuffle=True, seed=2, backend="numpy") as straight:
            for a, b in zip(remote, straight, strict=True):
                assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    local.close()


def test_unreachable_endpoint_is_a_named_error(tmp_path):
    pytest.importorskip("obstore")
    from s3_server import ACCESS, free_port

    from tbl_loader.errors import RemoteUnavailableError

    options = {**ACCESS, "endpoint": f"http://127.0.0.1:{free_port()}", "client_options": {"allow_http": True},
               "retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}}
    with pytest.raises(RemoteUnavailableError, match="127.0.0.1|s3://nowhere"):
        ImageLoader("s3://nowhere/ds/", batch_size=4, cache_dir=tmp_path, storage_options=options)


def test_missing_manifest_and_missing_shard(s3_server, local_ds, tmp_path):
    from tbl_loader.errors import RemoteObjectMissingError
    from tbl_loader.source.remote import RemoteDataset
    from tbl_loader.source.upload import upload_dataset

    bucket = s3_server.new_bucket()
    with pytest.raises(RemoteObjectMissingError, match=f"s3://{bucket}/nothing/manifest.json"):
        RemoteDataset(f"s3://{bucket}/nothing/", cache_dir=tmp_path, storage_options=s3_server.storage_options)
    url = f"s3://{bucket}/ds/"
    upload_dataset(local_ds, url, storage_options=s3_server.storage_options)
    victim = tbl_format.open(local_ds).shard_entries[2]["file"]
    s3_server.boto().delete_object(Bucket=bucket, Key=f"ds/{victim}")
    with RemoteDataset(url, cache_dir=tmp_path, storage_options=s3_server.storage_options) as ds:
        ds.prepare_rows([0])
        with pytest.raises(RemoteObjectMissingError, match=victim):
            ds.prepare_rows([2 * SHARD_ROWS])
        assert not any(p.name.startswith(f".{victim}") or p.name == victim for p in ds.local_dir.iterdir())


def test_checksum_mismatch_downloads_again_once_then_names_the_url(s3_server, local_ds, tmp_path):
    from tbl_loader.errors import RemoteChecksumError
    from tbl_loader.source.remote import RemoteDataset
    from tbl_loader.source.upload import upload_dataset

    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds/"
    upload_dataset(local_ds, url, storage_options=s3_server.storage_options)
    victim = tbl_format.open(local_ds).shard_entries[1]["file"]
    data = bytearray((local_ds / victim).read_bytes())
    data[100] ^= 0xFF  # inside the header: its CRC no longer matches
    s3_server.boto().put_object(Bucket=bucket, Key=f"ds/{victim}", Body=bytes(data))
    with RemoteDataset(url, cache_dir=tmp_path, storage_options=s3_server.storage_options) as ds:
        before = ds.cache.downloads
        with pytest.raises(RemoteChecksumError, match=f"{url}{victim}"):
            ds.prepare_rows([SHARD_ROWS])
        assert ds.cache.downloads - before == 2  # the first download and exactly one more
        assert not any(victim in p.name for p in ds.local_dir.iterdir())


def test_data_checksums_checked_when_asked(s3_server, local_ds, tmp_path):
    from tbl_loader.errors import RemoteChecksumError
    from tbl_loader.source.remote import RemoteDataset
    from tbl_loader.source.upload import upload_dataset

    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds/"
    upload_dataset(local_ds, url, storage_options=s3_server.storage_options)
    victim = tbl_format.open(local_ds).shard_entries[0]["file"]
    data = bytearray((local_ds / victim).read_bytes())
    data[4096 + 100] ^= 0xFF  # in the image column (aligned at 4096): only the block CRCs see it
    s3_server.boto().put_object(Bucket=bucket, Key=f"ds/{victim}", Body=bytes(data))
    with RemoteDataset(url, cache_dir=tmp_path / "a", storage_options=s3_server.storage_options) as ds:
        ds.prepare_rows([0])  # header intact: accepted without verify_data
    with RemoteDataset(url, cache_dir=tmp_path / "b", storage_options=s3_server.storage_options,
                       verify_data=True) as ds:
        with pytest.raises(RemoteChecksumError, match="DataChecksumError"):
            ds.prepare_rows([0])


def test_download_killed_midway_leaves_no_torn_file(s3_server, local_ds, remote_url, tmp_path):
    """SIGKILL of a process in the middle of downloads: the rerun completes, no file is torn."""
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import datetime, os, signal, sys
        from tbl_loader.source import storage
        real = storage.Store.download
        calls = []
        def killed_on_the_fourth(self, name, out):
            calls.append(name)
            if len(calls) == 4:  # part of the shard written, then the process dies
                out.write(b"TBL partial bytes")
                out.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return real(self, name, out)
        storage.Store.download = killed_on_the_fourth
        from tbl_loader.source.remote import RemoteDataset
        ds = RemoteDataset({remote_url!r}, cache_dir={str(cache)!r}, storage_options={s3_server.storage_options!r})
        for k in range(len(ds.segment_rows)):
            ds.prepare_rows([sum(ds.segment_rows[:k])])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    from tbl_loader.source.remote import RemoteDataset

    local = tbl_format.open(local_ds)
    with RemoteDataset(remote_url, cache_dir=cache, storage_options=s3_server.storage_options,
                       max_mapped=100) as ds:
        ds_dir = ds.local_dir
        leftovers = [p.name for p in ds_dir.iterdir() if ".tbl-cache-tmp-" in p.name]
        assert leftovers  # the killed download's temporary file, never under a final name
        for k in range(len(ds.segment_rows)):
            ds.prepare_rows([sum(ds.segment_rows[:k])])
        for got, want in zip(ds.segments("image"), local.segments("image"), strict=True):
            assert np.array_equal(got, want)
        assert not [p.name for p in ds_dir.iterdir() if ".tbl-cache-tmp-" in p.name]
        for entry in ds.shard_entries:  # every cached file passes the full check
            tbl_format.open(ds_dir / entry["file"], verify=True).close()
    local.close()


def test_pytree_dataset_reads_a_url(s3_server, local_ds, remote_url, tmp_path):
    from tbl_loader import PyTreeDataset

    local = PyTreeDataset(local_ds)
    remote = PyTreeDataset(remote_url, cache_dir=tmp_path, storage_options=s3_server.storage_options)
    assert len(remote) == len(local) and remote.fingerprint == local.fingerprint
    idx = np.arange(N)[::-1].copy()
    a, b = local.get_batch(idx), remote.get_batch(idx)
    assert np.array_equal(a["image"], b["image"]) and np.array_equal(a["label"], b["label"])


def _s3_env(server, cache_home):
    """A user's S3 settings in the standard environment variables; the default cache under ``cache_home``."""
    return {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": server.endpoint, "AWS_ALLOW_HTTP": "true",
            "XDG_CACHE_HOME": str(cache_home)}


def test_tbl_inspect_and_verify_a_url(s3_server, local_ds, tmp_path):
    from tbl_loader.source.upload import upload_dataset

    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds/"
    upload_dataset(local_ds, url, storage_options=s3_server.storage_options)
    env = _s3_env(s3_server, tmp_path / 'xdg')
    out = subprocess.run([sys.executable, "-m", "tbl_format.cli", "inspect", url], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"rows:      {N:,} in {N // SHARD_ROWS} file(s)" in out.stdout
    out = subprocess.run([sys.executable, "-m", "tbl_format.cli", "verify", url], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "every checksum verified" in out.stdout
    out = subprocess.run([sys.executable, "-m", "tbl_format.cli", "verify", f"s3://{bucket}/missing/"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "manifest.json" in out.stderr and "Traceback" not in out.stderr


def test_tbl_convert_to_a_url_publishes_the_manifest_last(s3_server, tmp_path):
    from PIL import Image

    src = tmp_path / "src"
    for label in ("cat", "dog"):
        (src / label).mkdir(parents=True)
        for i in range(6):
            rgb = np.random.default_rng(i).integers(0, 256, (20, 24, 3), dtype=np.uint8)
            Image.fromarray(rgb).save(src / label / f"{i}.png")
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/imgs/"
    env = _s3_env(s3_server, tmp_path / 'xdg')
    out = subprocess.run([sys.executable, "-m", "tbl_format.cli", "convert", str(src), url, "--size", "16",
                          "--shard-rows", "5", "--workers", "1", "--quiet"], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    keys = [o["Key"] for o in s3_server.boto().list_objects_v2(Bucket=bucket)["Contents"]]
    assert "imgs/manifest.json" in keys and sum(k.endswith(".tbl") for k in keys) == 3
    # The manifest was the last object written.
    times = {o["Key"]: o["LastModified"] for o in s3_server.boto().list_objects_v2(Bucket=bucket)["Contents"]}
    assert times["imgs/manifest.json"] == max(times.values())
    local = tmp_path / "local"
    subprocess.run([sys.executable, "-m", "tbl_format.cli", "convert", str(src), str(local), "--size", "16",
                    "--shard-rows", "5", "--workers", "1", "--quiet"], check=True, capture_output=True, timeout=300)
    with ImageLoader(local, batch_size=4, backend="numpy", seed=1) as a, \
            ImageLoader(url, batch_size=4, backend="numpy", seed=1, cache_dir=tmp_path / "c",
                        storage_options=s3_server.storage_options) as b:
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x.images, y.images) and np.array_equal(x.labels, y.labels)


_NODE_WORKER = textwrap.dedent("""
    import json, sys
    import numpy as np
    from tbl_loader import ImageLoader
    url, cache, options, rank, worker = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    from datetime import timedelta
    options["retry_config"] = {"max_retries": 1, "retry_timeout": timedelta(seconds=5)}
    seen = []
    with ImageLoader(url, batch_size=8, shuffle="block", seed=3, rank=rank, world_size=2, padding="drop",
                     backend="numpy", cache_dir=cache, storage_options=options) as loader:
        for number, batch in enumerate(loader):
            if number % 2 == worker:  # this rank's batches are split between its two workers
                seen.extend(np.asarray(batch.indices).tolist())
        downloads = loader.dataset.cache.downloads
    print(json.dumps({"seen": seen, "downloads": downloads}))
""")


def test_two_ranks_two_workers_share_one_cache(s3_server, local_ds, remote_url, tmp_path):
    """4 processes on one node, one cache: every sample exactly once, every shard downloaded once."""
    import json

    options = {k: v for k, v in s3_server.storage_options.items() if k != "retry_config"}
    procs = [subprocess.Popen([sys.executable, "-c", _NODE_WORKER, remote_url, str(tmp_path), json.dumps(options),
                               str(rank), str(worker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2) for worker in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    seen = sorted(i for r in results for i in r["seen"])
    assert seen == list(range(N))
    assert sum(r["downloads"] for r in results) == N // SHARD_ROWS


@pytest.fixture
def tiny_disk(tmp_path):
    """A 96 KiB tmpfs: a real file system that fills up (skips where mounting is not permitted)."""
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount_point)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


def test_full_cache_disk_is_a_named_error_and_leaves_nothing(s3_server, local_ds, remote_url, tiny_disk):
    from tbl_loader.errors import CacheFullError
    from tbl_loader.source.remote import RemoteDataset

    local = tbl_format.open(local_ds)
    with RemoteDataset(remote_url, cache_dir=tiny_disk, storage_options=s3_server.storage_options,
                       max_mapped=100) as ds:
        with pytest.raises(CacheFullError, match=str(tiny_disk)):
            for k in range(len(ds.segment_rows)):
                ds.prepare_rows([sum(ds.segment_rows[:k])])
        files = list(ds.local_dir.iterdir())
        assert not [p.name for p in files if ".tbl-cache-tmp-" in p.name]
        assert len([p for p in files if p.suffix == ".tbl"]) < len(ds.segment_rows)
        for p in files:  # whatever is under a final name is whole
            if p.suffix == ".tbl":
                tbl_format.open(p, verify=True).close()
        for k in ds.mapped_shards:
            assert np.array_equal(ds.segment("image", k), local.segments("image")[k])
    local.close()


def test_a_url_without_the_remote_extra_names_the_pip_command(tmp_path):
    script = textwrap.dedent("""
        import sys
        sys.modules["obstore"] = None  # as if the remote extra were not installed
        from tbl_loader import ImageLoader
        from tbl_loader.errors import RemoteSupportMissingError
        try:
            ImageLoader("s3://bucket/ds/", batch_size=4, cache_dir=sys.argv[1])
        except RemoteSupportMissingError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'pip install "tbl-loader[remote]"' in out.stdout


def test_a_dataset_over_plain_http_equals_local(local_ds, tmp_path):
    """A dataset directory served by an ordinary HTTP file server (http.server on 127.0.0.1)."""
    pytest.importorskip("obstore", reason='the remote extra is not installed (pip install "tbl-loader[remote]")')
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(local_ds.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{local_ds.name}/"
        opts = dict(batch_size=16, shuffle="block", seed=4, hflip=0.5, backend="numpy")
        with ImageLoader(local_ds, **opts) as a, ImageLoader(url, cache_dir=tmp_path, **opts,
                                                             storage_options={"client_options": {"allow_http": True}}) as b:
            pairs = list(zip(a, b, strict=True))
        assert len(pairs) == N // 16
        for x, y in pairs:
            assert np.array_equal(x.images, y.images) and np.array_equal(x.indices, y.indices)
    finally:
        server.shutdown()
        server.server_close()


def test_pytree_loader_reads_a_url_with_block_shuffle(s3_server, local_ds, remote_url, tmp_path):
    from tbl_loader import PyTreeLoader

    opts = dict(batch_size=16, shuffle="block", seed=8, backend="numpy", return_indices=True)
    with PyTreeLoader(local_ds, **opts) as a, PyTreeLoader(remote_url, cache_dir=tmp_path,
                                                           storage_options=s3_server.storage_options, **opts) as b:
        pairs = list(zip(a, b, strict=True))
    seen = np.concatenate([ia for (_, ia), _ in pairs])
    assert np.array_equal(np.sort(seen), np.arange(N))
    for (ba, ia), (bb, ib) in pairs:
        assert np.array_equal(ia, ib) and np.array_equal(ba["image"], bb["image"])
        assert np.array_equal(ba["label"], bb["label"])


@pytest.mark.parametrize("shuffle", [True, "block"])
def test_a_warm_cache_holding_every_shard_reads_as_local(s3_server, local_ds, remote_url, tmp_path, shuffle):
    """With every shard cached and mapped, a batch reads the dataset's whole columns at its own rows (no
    per-batch locating): the stream stays the local one, element for element."""
    opts = dict(batch_size=12, shuffle=shuffle, seed=7, hflip=0.5, backend="numpy")
    with ImageLoader(local_ds, **opts) as local:
        expected = _stream(local, epochs=3)
    with ImageLoader(remote_url, cache_dir=tmp_path / "cache", storage_options=s3_server.storage_options,
                     **opts) as remote:
        got = _stream(remote, epochs=3)
        ds = remote.dataset
        assert sorted(ds.mapped_shards) == list(range(N // SHARD_ROWS))
        rows = np.array([N - 1, 0, 5 * SHARD_ROWS + 3], dtype=np.int64)
        first, at = ds.batch_columns(["image", "label"], rows)
        again, _ = ds.batch_columns(["image", "label"], rows[::-1])
        assert np.array_equal(at, rows) and again["image"] is first["image"]  # the whole columns, kept
        column = np.concatenate(first["image"])
        assert np.array_equal(column[at], np.concatenate(tbl_format.open(local_ds).segments("image"))[rows])
    for (gi, gl, gx), (ei, el, ex) in zip(got, expected, strict=True):
        assert np.array_equal(gx, ex) and np.array_equal(gl, el) and np.array_equal(gi, ei)


def test_the_reader_waits_for_the_fetchers_own_download():
    """A shard the fetcher is downloading is waited for (not fetched a second time behind its lock)."""
    import threading

    from tbl_loader.source.fetcher import Fetcher

    release, started, calls = threading.Event(), threading.Event(), []

    def fetch(k, wanted):
        calls.append(k)
        started.set()
        release.wait(5)

    fetcher = Fetcher(fetch, lookahead=1, concurrency=1)
    try:
        fetcher.schedule([5, 6])  # a lookahead of 1: the fetcher takes the first shard of the order only
        assert started.wait(5)
        done = threading.Event()
        waiter = threading.Thread(target=lambda: (fetcher.join(5), done.set()))
        waiter.start()
        assert not done.wait(0.2)  # still downloading: join waits
        release.set()
        assert done.wait(5)
        waiter.join()
        fetcher.join(6)  # not the fetcher's (yet): returns at once
        assert calls == [5]
    finally:
        release.set()
        fetcher.close()


def test_a_batch_downloads_its_shards_side_by_side():
    """fetch_now runs a batch's downloads concurrently (a global shuffle touches many shards at once)."""
    import threading

    from tbl_loader.source.fetcher import Fetcher

    lock, active, most, calls = threading.Lock(), [0], [0], []
    everyone = threading.Barrier(3, timeout=10)  # passes only if the three downloads run at the same time

    def fetch(k, wanted):
        assert wanted == []  # a batch's own downloads keep nothing back
        with lock:
            calls.append(k)
            active[0] += 1
            most[0] = max(most[0], active[0])
        everyone.wait()
        with lock:
            active[0] -= 1

    fetcher = Fetcher(fetch, lookahead=0, concurrency=4)
    try:
        fetcher.fetch_now([7, 3, 9])
        assert sorted(calls) == [3, 7, 9] and most[0] == 3 and not everyone.broken
    finally:
        fetcher.close()


def test_read_ahead_depth_follows_what_the_cache_holds():
    """A cache that holds the dataset reads the whole order ahead; a smaller one 4 shards, within what it holds."""
    from tbl_loader.source.fetcher import read_ahead_depth

    entries = [{"file": f"{k}.tbl", "size": 100} for k in range(40)]
    for local in (False, True):
        assert read_ahead_depth(entries, None, 40, shard_local=local) == 40  # no limit
        assert read_ahead_depth(entries, 4000, 40, shard_local=local) == 40  # exactly the dataset
    # one byte short, evictions begin: two thirds of the cache ahead of a block order, 4 ahead of a global one
    assert read_ahead_depth(entries, 3999, 39, shard_local=True) == 26
    assert read_ahead_depth(entries, 3999, 39) == 4
    assert read_ahead_depth(entries, 1200, 12, shard_local=True) == 8
    assert read_ahead_depth(entries, 600, 6, shard_local=True) == 4  # at least 4 ahead ...
    assert read_ahead_depth(entries, 300, 3, shard_local=True) == 2  # ... within what the cache holds beside
    assert read_ahead_depth(entries, 300, 3) == 2                    # the shard being read
    assert read_ahead_depth(entries, 100, 1, shard_local=True) == 0


def test_a_download_ahead_never_evicts_a_shard_the_reads_want_first(s3_server, local_ds, remote_url, tmp_path):
    """Room for a download ahead is made from the shards the reads no longer want, least recently used
    first: never from `wanted` (shards downloaded ahead and not read yet); with nothing else to evict it
    downloads nothing. Without `wanted`, plain LRU."""
    import os

    from tbl_loader.source.remote import RemoteDataset

    shard_size = max(p.stat().st_size for p in local_ds.iterdir() if p.suffix == ".tbl")
    with RemoteDataset(remote_url, cache_dir=tmp_path, cache_limit=2 * shard_size,
                       storage_options=s3_server.storage_options) as ds:
        cache, entries, where = ds.cache, ds.shard_entries, ds.local_dir
        path = [where / e["file"] for e in entries]
        for k in (0, 1):
            cache.fetch(ds.store, where, entries[k])
            os.utime(path[k], ns=(k * 10**9, k * 10**9))  # shard 0 least recently used
        assert cache.fetch_ahead(ds.store, where, entries[2], wanted=[path[0]]) == path[2]
        assert path[0].exists() and not path[1].exists()  # shard 1 went, although used more recently
        assert cache.fetch_ahead(ds.store, where, entries[3], wanted=[path[0], path[2]]) is None
        assert not path[3].exists() and cache.downloads == 3  # nothing evictable: nothing downloaded
        assert cache.fetch_ahead(ds.store, where, entries[3]) == path[3]
        assert cache.size() <= 2 * shard_size


def test_the_fetcher_wants_the_shards_from_the_reads_to_its_last_download():
    """A download ahead is told the window of the order the reads want (from the shard read last to the last
    one submitted) at the time it runs; a batch's own download (fetch_now) keeps nothing back."""
    import threading

    from tbl_loader.source.fetcher import Fetcher

    asked, started = [], threading.Event()

    def fetch(k, wanted):
        asked.append((k, wanted))
        started.set()

    fetcher = Fetcher(fetch, lookahead=2, concurrency=1)
    try:
        fetcher.schedule([5, 6, 7, 8, 9])
        assert started.wait(5)
        assert asked[0] == (5, [5, 6])  # submitted, none read yet: the window is the first two
        fetcher.wait()
        fetcher.reached([6])
        assert fetcher.wanted() == [6, 7, 8]  # the shard read now and the two ahead of it
        fetcher.wait()
        assert [k for k, _ in asked] == [5, 6, 7, 8] and asked[-1] == (8, [6, 7, 8])
        fetcher.fetch_now([3])
        assert asked[-1] == (3, [])
        fetcher.schedule([1, 2])
        assert fetcher.wanted() == [1, 2]
    finally:
        fetcher.close()


def test_fetchers_share_one_download_pool_and_reads_go_first():
    """Twenty fetchers (a Mix of twenty URL sources) download on the pool's 4 threads, not 80; a read queued
    behind their downloads ahead runs before them, and the threads end when the last fetcher closes."""
    import threading

    from tbl_loader.source.fetcher import READ, Fetcher, download_pool

    def names() -> set[threading.Thread]:
        return {t for t in threading.enumerate() if t.name == "tbl-download"}

    end = time.monotonic() + 10
    while names() and download_pool().size == 0 and time.monotonic() < end:
        time.sleep(0.01)  # threads of an earlier test's fetchers, ending now that none holds the pool
    before, held = names(), download_pool().size
    gate, order, lock = threading.Event(), [], threading.Lock()

    def fetch(k, wanted):
        gate.wait(10)
        with lock:
            order.append(k)

    fetchers = [Fetcher(fetch, lookahead=3, concurrency=4) for _ in range(20)]
    try:
        for i, f in enumerate(fetchers):
            f.schedule([100 * i + j for j in range(3)])  # 60 downloads ahead queued, 4 of them running
        reader = threading.Thread(target=fetchers[-1].fetch_now, args=([7],))
        reader.start()
        pool, end = download_pool(), time.monotonic() + 10
        # The read is queued before the gate opens (a loaded machine may start the reader thread late)
        while not any(entry[0] == READ for entry in pool._queue) and time.monotonic() < end:
            time.sleep(0.01)
        assert len(names()) == 4  # the pool's threads, whichever were there before
        gate.set()
        reader.join(10)
        for f in fetchers:
            f.wait()
        assert len(order) == 61 and order.index(7) < 12  # not behind the 56 ahead still queued when it came
        queued = fetchers[0]
        queued.lookahead = 5
        gate.clear()
        queued.schedule([900, 901, 902, 903, 904])  # 4 block on the gate, 904 waits in the queue
        time.sleep(0.2)
        queued.join(904)  # still queued: taken back at once, for the reader to download itself
        assert 904 not in queued._pending
        gate.set()
    finally:
        gate.set()
        for f in fetchers:
            f.close()
    end = time.monotonic() + 10
    while names() - before and time.monotonic() < end:
        time.sleep(0.01)
    assert download_pool().size == held  # these fetchers no longer hold it ...
    if held == 0:
        assert not names() - before  # ... and with no other holder, its threads are gone
