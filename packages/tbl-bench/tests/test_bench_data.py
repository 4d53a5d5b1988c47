import hashlib
import io
import tarfile

import numpy as np
import pytest
from PIL import Image

from tbl_bench import data


@pytest.fixture(scope="module")
def small_tar(tmp_path_factory):
    path = tmp_path_factory.mktemp("tar") / "a.tar"
    info = data.make_image_tar(path, 12, num_classes=3, min_size=64, max_size=96, seed=7, workers=1)
    return path, info


def _md5(p):
    return hashlib.md5(p.read_bytes()).hexdigest()


def test_tar_is_deterministic_and_independent_of_workers(small_tar, tmp_path):
    path, _ = small_tar
    again = data.make_image_tar(tmp_path / "b.tar", 12, num_classes=3, min_size=64, max_size=96, seed=7, workers=2)
    assert _md5(again.path) == _md5(path)
    other = data.make_image_tar(tmp_path / "c.tar", 12, num_classes=3, min_size=64, max_size=96, seed=8, workers=1)
    assert _md5(other.path) != _md5(path)


def test_tar_holds_real_jpegs_in_imagenet_layout(small_tar):
    path, info = small_tar
    assert info.count == 12 and len(info.labels) == 12
    names, labels = data.read_tar_labels(path)
    assert labels == info.labels
    sizes, stds = set(), []
    with tarfile.open(path) as tar:
        for m, label in zip(tar.getmembers(), labels, strict=True):
            assert m.name.startswith(f"{data.class_name(label)}/") and m.name.endswith(".JPEG")
            blob = tar.extractfile(m).read()
            assert blob[:3] == b"\xff\xd8\xff"  # JPEG SOI marker
            img = Image.open(io.BytesIO(blob))
            assert img.format == "JPEG" and img.mode == "RGB"
            assert 64 <= img.width <= 96 and 64 <= img.height <= 96
            sizes.add(img.size)
            stds.append(np.asarray(img).std())
    assert len(sizes) > 1  # sizes are drawn, not fixed
    assert min(stds) > 5  # photographs, not flat colour


def test_bad_arguments_are_named_errors(tmp_path):
    with pytest.raises(data.GeneratorError, match="n must be"):
        data.make_image_tar(tmp_path / "x.tar", 0)
    with pytest.raises(data.GeneratorError, match="min_size"):
        data.make_image_tar(tmp_path / "x.tar", 1, min_size=300, max_size=200)
    assert not (tmp_path / "x.tar").exists()


def test_source_photos_are_rgb_photographs():
    photos = data.load_source_photos()
    assert len(photos) == len(data.SOURCE_PHOTOS) >= 8
    for p in photos:
        assert p.dtype == np.uint8 and p.ndim == 3 and p.shape[2] == 3 and min(p.shape[:2]) >= 250


def test_scalar_rows():
    rows = list(data.scalar_rows(50, seed=1))
    assert rows == list(data.scalar_rows(50, seed=1))
    assert len(rows) == 50
    for r in rows:
        assert [type(r[k]) for k in ("id", "score", "name", "flag")] == [int, float, str, bool]


def test_array_rows():
    rows = list(data.array_rows(70, seed=1, chunk=32))
    again = list(data.array_rows(70, seed=1, chunk=32))
    assert len(rows) == 70
    for a, b in zip(rows, again, strict=True):
        assert a["embedding"].shape == (64,) and a["embedding"].dtype == np.float32
        assert np.array_equal(a["embedding"], b["embedding"]) and a["key"] == b["key"]
    assert [r["id"] for r in rows] == list(range(70))
