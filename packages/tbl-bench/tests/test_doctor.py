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
        assert "from 1 to" in changes[0]


def test_a_sleeping_transform_is_named(fixed_path):
    def slow(batch):
        time.sleep(0.03)
        return batch

    report = diagnose(fixed_path, batch_size=16, transform=slow, seconds=SECONDS)
    assert report["bound"] == "transform"
    assert report["per_batch_seconds"]["transform"] >= 0.03
    assert report["loader"]["storage"] == "fixed" and report["loader"]["transform"] is True
    # Without the transform the producer side costs (almost) nothing: the prediction is far above what ran.
    assert report["advice"][0]["predicted_batches_per_s"] > report["measured"]["batches_per_s"]


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


def test_cli_refuses_by_flag(tmp_path, capsys):
    assert main([str(tmp_path / "missing.tbl"), "--quiet"]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    with pytest.raises(DoctorError, match="--batch-size must be an int >= 1"):
        diagnose(tmp_path / "missing.tbl", batch_size=0)


def test_registers_the_doctor_subcommand():
    parser = argparse.ArgumentParser(prog="tbl")
    register_doctor(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", "d.tbl", "--batch-size", "32", "--image-size", "96", "--threads", "3",
                              "--seconds", "2", "--json"])
    assert (args.dataset, args.batch_size, args.image_size, args.threads, args.seconds, args.json) == (
        "d.tbl", 32, 96, 3, 2.0, True)
    assert callable(args.func)
