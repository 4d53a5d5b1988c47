"""tbl doctor names the stage that bounds a loader, on cases built to be bound by different stages."""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pytest

import tbl_format
from tbl_bench.doctor import SCHEMA, DoctorError, diagnose, main, register_doctor

SECONDS = 1.0


@pytest.fixture(scope="module")
def fixed_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (48, 16, 16, 3), dtype=np.uint8)
    samples = [{"image": im, "label": np.int64(i % 3)} for i, im in enumerate(images)]
    return tbl_format.write(samples, tmp_path_factory.mktemp("doctor") / "fixed.tbl")


@pytest.fixture(scope="module")
def jpeg_path(tmp_path_factory):
    """Photos-like JPEGs of 192 x 256 served at 32 x 32: the decode dwarfs the crop-resize kernel."""
    simplejpeg = pytest.importorskip("simplejpeg")
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int")})
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:192, 0:256]
    path = tmp_path_factory.mktemp("doctor") / "jpeg.tbl"
    with tbl_format.Writer(path, schema) as w:
        for i in range(32):
            img = (rng.integers(0, 256, 3) + y[..., None] + x[..., None] + rng.integers(0, 40, (192, 256, 3))) % 256
            w.write({"image": simplejpeg.encode_jpeg(img.astype(np.uint8), quality=95), "height": 192,
                     "width": 256, "label": i % 3})
    return path


def test_one_thread_jpeg_decode_is_named(jpeg_path):
    report = diagnose(jpeg_path, batch_size=8, image_size=32, threads=1, seconds=SECONDS)
    assert report["schema"] == SCHEMA
    assert report["loader"]["storage"] == "jpeg" and report["loader"]["threads"] == 1
    assert report["bound"] == "decode"
    assert "decode" in report["ceilings"]
    changes = [a["change"] for a in report["advice"]]
    assert any("--store raw" in c for c in changes)
    if report["machine"]["cores"] > 1:
        assert changes[0].endswith("loader threads instead of 1 (one per core here)")
        # The prediction is the same loader measured on every core.
        all_cores = report["measured"]["all_cores_batches_per_s"]
        assert all_cores is not None and all_cores > 0
        assert report["advice"][0]["predicted_batches_per_s"] == all_cores
    else:
        assert report["measured"]["all_cores_batches_per_s"] is None


def test_a_sleeping_transform_is_named(fixed_path):
    def slow(batch):
        time.sleep(0.03)
        return batch

    report = diagnose(fixed_path, batch_size=16, transform=slow, seconds=SECONDS)
    assert report["bound"] == "transform"
    assert report["per_batch_seconds"]["transform"] >= 0.03
    assert report["loader"]["storage"] == "fixed" and report["loader"]["transform"] is True
    # The prediction is the same loader measured without the transform: far above what ran with it.
    untransformed = report["measured"]["untransformed_batches_per_s"]
    assert untransformed is not None and untransformed > report["measured"]["batches_per_s"]
    assert report["advice"][0]["predicted_batches_per_s"] == untransformed
    assert report["measured"]["warm_batches_per_s"] is None
    assert report["measured"]["all_cores_batches_per_s"] is None


def test_a_slow_training_step_is_named_consumer(fixed_path):
    report = diagnose(fixed_path, batch_size=16, consume=lambda batch: time.sleep(0.03), seconds=SECONDS)
    assert report["bound"] == "consumer"
    assert report["per_batch_seconds"]["consumer"] >= 0.03
    assert "nothing on the data side" in report["advice"][0]["change"]


def test_cli_json_and_text(fixed_path, capsys):
    assert main([str(fixed_path), "--batch-size", "8", "--seconds", "0.3", "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == SCHEMA and report["measured"]["batches"] > 0
    assert report["bound"] in report["per_batch_seconds"]
    assert main([str(fixed_path), "--batch-size", "8", "--seconds", "0.3", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "\nbound: " in text and "time per batch:" in text and "ceilings of this machine" in text


def test_refusals_name_the_flag_in_the_cli_and_the_keyword_in_python(tmp_path, fixed_path, capsys):
    assert main([str(tmp_path / "missing.tbl"), "--quiet"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    assert main([str(fixed_path), "--batch-size", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size must be an int >= 1, got 0" in err and "batch_size" not in err
    with pytest.raises(DoctorError, match=r"^batch_size must be an int >= 1, got 0$"):
        diagnose(fixed_path, batch_size=0)
    with pytest.raises(DoctorError, match=r"^threads must be an int >= 1 or None, got 0$"):
        diagnose(fixed_path, threads=0)
    pytree = tbl_format.write([{"x": i} for i in range(4)], tmp_path / "rows.tbl")
    with pytest.raises(DoctorError, match=r"^threads applies to image datasets only"):
        diagnose(pytree, threads=2)
    assert main([str(pytree), "--threads", "2", "--quiet"]) == 2
    assert "--threads applies to image datasets only" in capsys.readouterr().err


def test_registers_the_doctor_subcommand():
    parser = argparse.ArgumentParser(prog="tbl")
    register_doctor(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", "d.tbl", "--batch-size", "32", "--image-size", "96", "--threads", "3",
                              "--seconds", "2", "--json"])
    assert (args.dataset, args.batch_size, args.image_size, args.threads, args.seconds, args.json) == (
        "d.tbl", 32, 96, 3, 2.0, True)
    assert callable(args.func)


def _url_dataset(tmp_path, *, rows, seed):
    """A fixed-size image dataset of 8-row shards at a file:// URL: its local copy, the URL, the largest shard."""
    pytest.importorskip("obstore", reason="the remote extra (tbl-loader[remote]) is not installed")
    from tbl_loader import upload_dataset

    rng = np.random.default_rng(seed)
    samples = [{"image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), "label": np.int64(i % 3)}
               for i in range(rows)]
    local = tbl_format.write(samples, tmp_path / "local", shard_rows=8)
    url = (tmp_path / "store").resolve().as_uri() + "/ds/"
    upload_dataset(local, url, storage_options={"mkdir": True})
    return local, url, max(f.stat().st_size for f in local.glob("*.tbl"))


def test_a_url_with_a_one_shard_cache_is_bound_by_read(tmp_path):
    """A URL (a file:// store) read in order through a cache that holds one shard of eight: every batch downloads
    its shard, and the report carries what the measured run downloaded and the download speed it got."""
    local, url, shard = _url_dataset(tmp_path, rows=64, seed=0)
    report = diagnose(url, batch_size=8, shuffle=False, seconds=SECONDS, cache_dir=tmp_path / "cache",
                      cache_limit=shard)
    cache = report["measured"]["cache"]
    # One download a batch; up to prefetch + 2 batches were made before the measured run began.
    downloads = max(1, report["measured"]["batches"] - 4)
    assert cache["misses"] >= downloads
    assert cache["bytes_downloaded"] >= downloads * min(f.stat().st_size for f in local.glob("*.tbl"))
    assert report["ceilings"]["read"]["what"] == "download"
    assert report["bound"] == "read"  # a download, fsync and map a batch: several times the kernel's work
    assert "cache_limit" in report["advice"][0]["change"]
    assert report["ceilings"]["read"]["bytes_per_s"] == cache["bytes_downloaded"] / cache["download_seconds"]


@pytest.mark.parametrize("shuffle", [False, "block"])
def test_a_url_bound_by_downloads_predicts_from_a_warm_run_of_its_cached_rows(tmp_path, shuffle):
    """The prediction for a cache that holds the dataset is measured: the same loader over the rows whose shards
    the run left cached (no download), which runs faster than the download-bound run did. A block order (the
    usual one for a URL) is measured warm in a plain shuffle, since block does not take a subset of rows."""
    local, url, shard = _url_dataset(tmp_path, rows=128, seed=1)
    report = diagnose(url, batch_size=4, shuffle=shuffle, seconds=SECONDS, cache_dir=tmp_path / "cache",
                      cache_limit=8 * shard)
    assert report["bound"] == "read"
    warm = report["measured"]["warm_batches_per_s"]
    assert warm is not None and warm > report["measured"]["batches_per_s"]
    assert report["advice"][0]["predicted_batches_per_s"] == warm



class _PassesLoader:
    """A stand-in loader: passes of ``length`` batches, each batch ``batch_s`` seconds and the first of a pass
    ``start_s`` more."""

    def __init__(self, length, batch_s, start_s):
        self.length, self.batch_s, self.start_s = length, batch_s, start_s
        self.epoch, self.closed = 0, False

    def __iter__(self):
        for k in range(self.length):
            time.sleep(self.batch_s + (self.start_s if k == 0 else 0.0))
            yield k

    def set_epoch(self, epoch):
        self.epoch = epoch

    def close(self):
        self.closed = True


def test_the_warm_rate_spreads_a_passes_start_over_a_whole_dataset_pass():
    from tbl_bench.doctor import _warm_rate

    loader = _PassesLoader(length=5, batch_s=0.002, start_s=0.02)
    rate = _warm_rate(lambda rows: loader, list(range(64)), 8, 1000, 0.5, lambda batch: None)
    # Short passes as measured: (0.02 + 5 * 0.002) / 5 = 6 ms a batch; over passes of 1,000: about 2 ms.
    assert loader.closed
    assert 1 / 0.0035 < rate < 1 / 0.0019


def test_the_warm_rate_stops_within_a_long_pass():
    from tbl_bench.doctor import _warm_rate

    loader = _PassesLoader(length=10**6, batch_s=0.001, start_s=0.0)
    t0 = time.perf_counter()
    rate = _warm_rate(lambda rows: loader, list(range(64)), 8, 10**6, 0.3, lambda batch: None)
    assert time.perf_counter() - t0 < 5 and loader.closed and loader.epoch == 0
    assert 0 < rate < 1 / 0.001
