"""URLs as an adversary or a typo writes them: unknown schemes, credentials in URLs, bad storage options.

Each case asserts the named error (and, for credentials, that no message or CLI line shows them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tbl_format
from tbl_loader import ImageLoader, PyTreeDataset, TokenLoader, convert
from tbl_loader.source.storage import is_url, open_store, redact

SECRET = "hunter2-SECRET"


@pytest.mark.parametrize("path", ["s4://bucket/x/", "S3x://b/k", "hdfs://cluster/data/"])
def test_a_scheme_tbl_does_not_read_is_refused_everywhere(tmp_path, path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="unknown URL scheme"):
        is_url(path)
    for make in (lambda: ImageLoader(path, 4), lambda: PyTreeDataset(path), lambda: TokenLoader(path, 2, 3)):
        with pytest.raises(ValueError, match="unknown URL scheme"):
            make()
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(images / "a" / "x.png")
    with pytest.raises(ValueError, match="unknown URL scheme"):
        convert(images, path, size=8, workers=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]  # no local folder named after the scheme


def test_credentials_are_redacted_from_text():
    assert redact("s3://user:" + SECRET + "@host/b/k") == "s3://***@host/b/k"
    url = f"https://h.example/b/k.tbl?X-Amz-Signature={SECRET}&X-Amz-Credential={SECRET}&other=1"
    assert SECRET not in redact(url) and "other=1" in redact(url)
    assert SECRET not in redact(f"https://acct.blob.core.windows.net/c/k?sv=2024&sig={SECRET}")
    quoted = f"m.json%3FX-Amz-Signature%3D{SECRET}%26part%3D1 failed"  # as a library's message may quote it
    assert SECRET not in redact(quoted) and redact(quoted).endswith("%26part%3D1 failed")


def test_credentials_in_urls_reach_no_error_message(s3_server):
    url = f"{s3_server.endpoint}/nobucket/x.tbl?X-Amz-Signature={SECRET}".replace("http://", f"http://u:{SECRET}@")
    with pytest.raises(Exception) as info:
        open_store("s3://nobucket/data/", s3_server.storage_options).read_bytes(f"m.json?X-Amz-Signature={SECRET}")
    assert SECRET not in str(info.value)
    with pytest.raises(Exception) as info:
        PyTreeDataset(url, storage_options={"allow_http": "true"})
    assert SECRET not in str(info.value)


def test_the_cli_prints_no_credentials(s3_server, tmp_path):
    images = tmp_path / "images"
    (images / "a").mkdir(parents=True)
    from PIL import Image

    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(images / "a" / "x.png")
    dst = f"https://u:{SECRET}@127.0.0.1:9/b/ds.tbl?sig={SECRET}"
    run = subprocess.run([sys.executable, "-m", "tbl_format.cli", "convert", str(images), dst, "--size", "8",
                          "--workers", "1", "--quiet"], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert SECRET not in run.stderr and SECRET not in run.stdout
    assert "***" in run.stderr


@pytest.mark.parametrize("options", [{"region": 5}, {"client_options": 5}, {"not_an_option": "x"}])
def test_bad_storage_options_are_a_named_value_error(options):
    with pytest.raises(ValueError, match="storage_options"):
        open_store("s3://bucket/prefix/", options)


def test_a_local_file_is_never_mistaken_for_a_url(tmp_path):
    path = tbl_format.write(({"x": i} for i in range(3)), tmp_path / "plain.tbl")
    assert not is_url(str(path)) and PyTreeDataset(str(path))[2] == {"x": 2}


# ---- the shard cache trusts only the shard the manifest names -------------------------------------------

SHARD_ROWS = 8


def _write(path, seed):
    from conftest import make_images, write_dataset

    images = make_images(32, (8, 6, 3), seed=seed)
    return write_dataset(path, images, np.arange(32, dtype=np.int64) * seed, shard_rows=SHARD_ROWS)


def _as_named(src, names, dst):
    """Dataset ``src`` with its shard files renamed to ``names`` (those of another dataset): a republication
    under the same URL whose shards keep their names (and, here, their sizes)."""
    import json
    import shutil

    dst.mkdir()
    manifest = json.loads((src / "manifest.json").read_text())
    for shard, name in zip(manifest["shards"], names, strict=True):
        shutil.copyfile(src / shard["file"], dst / name)
        shard["file"] = name
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def _rows(url, cache, options, verify="never"):
    """Every (image, label) of the dataset at ``url`` in order, through the image loader."""
    with ImageLoader(url, 32, shuffle=False, backend="numpy", dtype="uint8", layout="HWC",
                     cache_dir=cache, storage_options=options, verify=verify) as ld:
        (batch,) = list(ld)
        return np.array(batch.images), np.array(batch.labels)


@pytest.fixture
def two_datasets(tmp_path):
    """Datasets A and B: same schema, rows, shard names and sizes; other pixels and labels."""
    a = _write(tmp_path / "a", 3)
    entries = tbl_format.open(a).shard_entries
    b = _as_named(_write(tmp_path / "b_src", 5), [e["file"] for e in entries], tmp_path / "b")
    assert [e["size"] for e in tbl_format.open(b).shard_entries] == [e["size"] for e in entries]
    return a, b


def _local_rows(path):
    with ImageLoader(path, 32, shuffle=False, backend="numpy", dtype="uint8", layout="HWC") as ld:
        (batch,) = list(ld)
        return np.array(batch.images), np.array(batch.labels)


def _shard_files(cache):
    return sorted(p for p in (cache / "tbl-cache-v1").glob("*/*.tbl"))


def test_a_dataset_republished_with_same_size_shards_is_not_served_stale(s3_server, two_datasets, tmp_path):
    from tbl_loader.source.upload import upload_dataset

    a, b = two_datasets
    url = f"s3://{s3_server.new_bucket()}/ds/"
    opts = s3_server.storage_options
    upload_dataset(a, url, storage_options=opts)
    got_a = _rows(url, tmp_path / "cache", opts, verify="open")
    assert all(np.array_equal(x, y) for x, y in zip(got_a, _local_rows(a), strict=True))
    upload_dataset(b, url, storage_options=opts)  # the same URL, the same shard names and sizes
    for verify in ("never", "open", "lazy"):
        got_b = _rows(url, tmp_path / "cache", opts, verify=verify)
        want_b = _local_rows(b)
        assert all(np.array_equal(x, y) for x, y in zip(got_b, want_b, strict=True)), verify
        assert not np.array_equal(got_b[0], got_a[0])


def test_a_file_planted_in_the_cache_is_replaced_not_served(s3_server, two_datasets, tmp_path):
    from tbl_loader.source.upload import upload_dataset

    a, b = two_datasets
    url = f"s3://{s3_server.new_bucket()}/ds/"
    opts = s3_server.storage_options
    upload_dataset(a, url, storage_options=opts)
    cache = tmp_path / "cache"
    want = _local_rows(a)
    _rows(url, cache, opts)
    victim = _shard_files(cache)[1]
    victim.write_bytes((b / victim.name).read_bytes())  # same name and size, another dataset's shard
    got = _rows(url, cache, opts)
    assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
    assert victim.read_bytes() == (a / victim.name).read_bytes()  # downloaded again in its place


def test_a_symlink_planted_in_the_cache_is_never_followed(s3_server, two_datasets, tmp_path):
    from tbl_loader.source.upload import upload_dataset

    a, b = two_datasets
    url = f"s3://{s3_server.new_bucket()}/ds/"
    opts = s3_server.storage_options
    upload_dataset(a, url, storage_options=opts)
    cache = tmp_path / "cache"
    _rows(url, cache, opts)
    outside = tmp_path / "outside.tbl"
    outside.write_bytes((a / _shard_files(cache)[2].name).read_bytes())  # even the right bytes, out of the cache
    before = outside.read_bytes()
    victim = _shard_files(cache)[2]
    victim.unlink()
    victim.symlink_to(outside)
    got = _rows(url, cache, opts)
    assert all(np.array_equal(x, y) for x, y in zip(got, _local_rows(a), strict=True))
    assert not victim.is_symlink() and victim.read_bytes() == (a / victim.name).read_bytes()
    assert outside.read_bytes() == before  # the link's target was neither read as the shard nor changed


def _flip_data_byte(path):
    data = bytearray(path.read_bytes())
    data[4096 + 10] ^= 0xFF  # in the image column: only the block CRCs see it
    path.write_bytes(bytes(data))


def test_a_shard_corrupted_in_transit_is_healed(s3_server, two_datasets, tmp_path, monkeypatch):
    """A download corrupted on the way (the header intact) enters the cache under verify="lazy"; the lazy
    check fails on it, the shard is evicted and downloaded again, checked, and the run serves the true rows.
    A cache left holding such a file by an earlier run heals the same way on the next run."""
    from tbl_loader.source import storage
    from tbl_loader.source.upload import upload_dataset

    a, _ = two_datasets
    url = f"s3://{s3_server.new_bucket()}/ds/"
    opts = s3_server.storage_options
    upload_dataset(a, url, storage_options=opts)
    victim = tbl_format.open(a).shard_entries[1]["file"]
    real = storage.Store.download
    corrupted = []

    def in_transit(self, name, out):  # the first download of the victim arrives with a flipped byte
        written = real(self, name, out)
        if name == victim and not corrupted:
            out.flush()
            _flip_data_byte(Path(out.name))
            corrupted.append(name)
        return written

    monkeypatch.setattr(storage.Store, "download", in_transit)
    want = _local_rows(a)
    got = _rows(url, tmp_path / "cache", opts, verify="lazy")
    assert corrupted == [victim]
    assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
    monkeypatch.setattr(storage.Store, "download", real)
    cached = next(p for p in _shard_files(tmp_path / "cache") if p.name == victim)
    assert cached.read_bytes() == (a / victim).read_bytes()
    _flip_data_byte(cached)  # as an earlier run killed before its check would have left it
    got = _rows(url, tmp_path / "cache", opts, verify="lazy")
    assert all(np.array_equal(x, y) for x, y in zip(got, want, strict=True))
    assert cached.read_bytes() == (a / victim).read_bytes()


def test_a_shard_corrupt_in_the_store_names_the_url_without_credentials(s3_server, two_datasets, tmp_path):
    from tbl_loader.errors import RemoteChecksumError
    from tbl_loader.source.upload import upload_dataset

    a, _ = two_datasets
    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/ds/"
    opts = s3_server.storage_options
    upload_dataset(a, url, storage_options=opts)
    victim = tbl_format.open(a).shard_entries[1]["file"]
    data = bytearray((a / victim).read_bytes())
    data[4096 + 10] ^= 0xFF
    s3_server.boto().put_object(Bucket=bucket, Key=f"ds/{victim}", Body=bytes(data))
    with pytest.raises(RemoteChecksumError, match=f"{url}{victim}: failed its checks twice"):
        _rows(url, tmp_path / "cache", opts, verify="lazy")
    assert not any(p.name == victim for p in _shard_files(tmp_path / "cache"))  # nothing corrupt stays cached


def test_a_corrupt_cached_heap_shard_is_replaced_and_the_next_run_reads_it(s3_server, tmp_path):
    """Variable-size rows are read through a second reader of the cache (the streaming dataset), which may
    hold the old file mapped: the failed shard is downloaded again, checked, and the run stops with a named
    error; the next run serves the true rows."""
    from test_variable_loader import CROP, PER_SAMPLE, loader, make_images, write_raw

    from tbl_loader.errors import RemoteChecksumError
    from tbl_loader.source.upload import upload_dataset

    if not PER_SAMPLE:
        pytest.skip("needs tbl-kernels 0.2")
    images = make_images(12, seed=8)
    local = write_raw(tmp_path / "var", images, shard_rows=4)
    url = f"s3://{s3_server.new_bucket()}/var/"
    opts = s3_server.storage_options
    upload_dataset(local, url, storage_options=opts)
    cache = tmp_path / "cache"

    def run():
        with loader(url, 12, shuffle=False, verify="lazy", cache_dir=cache, storage_options=opts,
                    random_resized_crop=CROP) as ld:
            return [np.array(b.images) for b in ld]

    with loader(local, 12, shuffle=False, random_resized_crop=CROP) as ld:
        want = [np.array(b.images) for b in ld]
    assert all(np.array_equal(g, w) for g, w in zip(run(), want, strict=True))
    victim = next(p for p in _shard_files(cache) if p.name == tbl_format.open(local).shard_entries[1]["file"])
    data = bytearray(victim.read_bytes())
    at = data.find(images[5].tobytes())  # row 5: the second shard's second image, in its heap
    assert at > 0
    data[at + 7] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(RemoteChecksumError, match=f"{url}{victim.name}: the cached copy failed a data check"):
        run()
    assert victim.read_bytes() == (local / victim.name).read_bytes()  # downloaded again, checked
    assert all(np.array_equal(g, w) for g, w in zip(run(), want, strict=True))


def test_a_single_file_republished_at_the_same_url_is_downloaded_again(s3_server, tmp_path):
    """One .tbl at a URL has no manifest: the object's ETag is what its cached copy is checked against."""
    from tbl_loader.source.remote import RemoteDataset

    bucket = s3_server.new_bucket()
    url = f"s3://{bucket}/one.tbl"
    opts = s3_server.storage_options
    old = tbl_format.write(({"x": np.int64(i)} for i in range(8)), tmp_path / "old.tbl")
    new = tbl_format.write(({"x": np.int64(100 + i)} for i in range(8)), tmp_path / "new.tbl")
    assert old.stat().st_size == new.stat().st_size
    for path, first in ((old, 0), (new, 100), (new, 100)):
        s3_server.boto().put_object(Bucket=bucket, Key="one.tbl", Body=path.read_bytes())
        with RemoteDataset(url, cache_dir=tmp_path / "cache", storage_options=opts) as remote:
            with tbl_format.open(remote.ensure_all()) as ds:
                assert [ds[i]["x"] for i in range(8)] == list(range(first, first + 8))


def test_a_folder_under_a_shard_name_is_a_named_error(s3_server, two_datasets, tmp_path):
    from tbl_loader.errors import CacheEntryError
    from tbl_loader.source.upload import upload_dataset

    a, _ = two_datasets
    url = f"s3://{s3_server.new_bucket()}/ds/"
    opts = s3_server.storage_options
    upload_dataset(a, url, storage_options=opts)
    cache = tmp_path / "cache"
    _rows(url, cache, opts)
    victim = _shard_files(cache)[0]
    victim.unlink()
    victim.mkdir()
    with pytest.raises(CacheEntryError, match=f"{victim.name}: a folder where the cache keeps a shard"):
        _rows(url, cache, opts)
