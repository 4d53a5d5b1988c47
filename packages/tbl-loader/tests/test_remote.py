"""Remote datasets against a real S3 server on 127.0.0.1 (moto): equality with local, the cache, faults.

Every test talks to the server over HTTP through the storage library, exactly as
a user's S3 would be used. They skip when the remote extra or moto[server] is
missing; CI installs both.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
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
    from tbl_loader.upload import upload_dataset

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


def test_cache_reuses_shards_and_evicts_lru_within_limit(s3_server, local_ds, remote_url, tmp_path):
    from tbl_loader.remote_dataset import RemoteDataset

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


def test_evicted_while_mapped_stays_readable(s3_server, local_ds, remote_url, tmp_path):
    from tbl_loader.remote_dataset import RemoteDataset

    local = tbl_format.open(local_ds)
    shard_size = max(p.stat().st_size for p in local_ds.iterdir() if p.suffix == ".tbl")
    with RemoteDataset(remote_url, cache_dir=tmp_path, cache_limit=shard_size,
                       storage_options=s3_server.storage_options, max_mapped=100) as ds:
        ds.prepare_rows([0])
        view = ds.segments("image")[0]
        path = ds.local_dir / ds.shard_entries[0]["file"]
        assert path.exists()
        ds.prepare_rows([SHARD_ROWS])  # the next shard: the limit holds one, so shard 0 is unlinked
        assert not path.exists()
        assert np.array_equal(view, local.segments("image")[0])  # still mapped, still the same bytes
    local.close()


def test_unreachable_endpoint_is_a_named_error(tmp_path):
    pytest.importorskip("obstore")
    from s3_server import ACCESS, free_port

    from tbl_loader.storage import RemoteUnavailableError

    options = {**ACCESS, "endpoint": f"http://127.0.0.1:{free_port()}", "client_options": {"allow_http": True},
               "retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}}
    with pytest.raises(RemoteUnavailableError, match="127.0.0.1|s3://nowhere"):
        ImageLoader("s3://nowhere/ds/", batch_size=4, cache_dir=tmp_path, storage_options=options)


def test_missing_manifest_and_missing_shard(s3_server, local_ds, tmp_path):
    from tbl_loader.remote_dataset import RemoteDataset
    from tbl_loader.storage import RemoteObjectMissingError
    from tbl_loader.upload import upload_dataset

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
    from tbl_loader.remote_dataset import RemoteDataset
    from tbl_loader.storage import RemoteChecksumError
    from tbl_loader.upload import upload_dataset

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
    from tbl_loader.remote_dataset import RemoteDataset
    from tbl_loader.storage import RemoteChecksumError
    from tbl_loader.upload import upload_dataset

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
        from tbl_loader import storage
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
        from tbl_loader.remote_dataset import RemoteDataset
        ds = RemoteDataset({remote_url!r}, cache_dir={str(cache)!r}, storage_options={s3_server.storage_options!r})
        for k in range(len(ds.segment_rows)):
            ds.prepare_rows([sum(ds.segment_rows[:k])])
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    from tbl_loader.remote_dataset import RemoteDataset

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
