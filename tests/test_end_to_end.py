"""Real photographs through the whole pipeline, as a user runs it.

A real-photo ImageNet-layout TAR (tbl-bench's generator) is converted with the
``tbl convert`` command (tbl-format's CLI, extended by tbl-loader through the
``tbl.commands`` entry points), verified with ``tbl verify``, and served by
ImageLoader. Every served batch must equal, element for element, the
reference pipeline computed independently here: Pillow decode and resize
(``tbl_loader.conversion.decode.reference_preprocess``), the sample order and flips
drawn from ``tbl_loader.stream.order``, and the normative normalization table.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile

import numpy as np
import pytest

import tbl_format
import tbl_kernels
from tbl_bench.data import make_image_tar
from tbl_loader import IMAGENET_MEAN, IMAGENET_STD, ImageLoader
from tbl_loader.conversion.decode import reference_preprocess
from tbl_loader.stream import order

SIZE = 48
N = 40


def _tbl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tbl_format.cli", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    tar_path = root / "photos.tar"
    make_image_tar(tar_path, N, num_classes=3, min_size=60, max_size=120, seed=5, workers=1)
    dst = root / "photos.tbl"
    result = _tbl("convert", str(tar_path), str(dst), "--size", str(SIZE), "--workers", "2", "--quiet")
    assert result.returncode == 0, result.stderr
    return tar_path, dst


def _reference_images(tar_path):
    """Decode every member independently, in the documented order (sorted member names)."""
    with tarfile.open(tar_path) as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
        images = [reference_preprocess(tar.extractfile(m).read(), SIZE) for m in members]
        classes = sorted({m.name.split("/")[0] for m in members})
        labels = [classes.index(m.name.split("/")[0]) for m in members]
    return np.stack(images), np.asarray(labels, dtype=np.int64), classes


def test_subcommands_of_every_installed_package_are_listed():
    result = _tbl("--help")
    assert result.returncode == 0, result.stderr
    for command in ("inspect", "verify", "convert", "bench"):
        assert command in result.stdout


def test_converted_file_verifies_and_matches_the_reference(converted):
    tar_path, dst = converted
    assert _tbl("verify", str(dst)).returncode == 0
    images, labels, classes = _reference_images(tar_path)
    ds = tbl_format.open(dst)
    try:
        assert ds.metadata["classes"] == classes
        assert np.array_equal(np.concatenate(ds.segments("image")), images)
        assert np.array_equal(np.concatenate(ds.segments("label")), labels)
    finally:
        ds.close()


@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_served_batches_equal_the_reference_pipeline(converted, dtype):
    tar_path, dst = converted
    images, labels, _ = _reference_images(tar_path)
    seed, hflip = 11, 0.5
    with ImageLoader(dst, batch_size=16, seed=seed, hflip=hflip, dtype=dtype, backend="numpy") as loader:
        batches = list(loader)
    served = np.concatenate([b.images for b in batches])
    ids = np.concatenate([b.indices for b in batches])

    assert np.array_equal(ids, order.epoch_permutation(N, seed, 0))
    flips = order.flip_draws(seed, 0, ids, hflip)
    expected = images[ids]
    expected[flips] = expected[flips, :, ::-1]
    if dtype != "uint8":
        table = tbl_kernels.normalization_table(IMAGENET_MEAN, IMAGENET_STD, dtype)
        expected = np.stack([table[c][expected[..., c]] for c in range(3)], axis=-1)
    assert np.array_equal(served, expected.transpose(0, 3, 1, 2))
    assert np.array_equal(np.concatenate([b.labels for b in batches]), labels[ids])
