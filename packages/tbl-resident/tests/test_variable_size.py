"""device="cpu" (and "cuda" where there is one): images of variable size (tbl convert --max-size, raw storage) served resident equal
tbl_loader.ImageLoader element for element; JPEG storage and several crop views are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import collect

import tbl_format
import tbl_kernels
from tbl_kernels import reference as kref
from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_loader.errors import UnsupportedCombinationError
from tbl_loader.stream import order
from tbl_resident import ResidentImageLoader

if not hasattr(tbl_kernels, "crop_resize_images"):
    pytest.skip("needs tbl-kernels 0.2 (crop_resize_images)", allow_module_level=True)

N = 29
SEED = 5
CROP = RandomResizedCrop((10, 12), scale=(0.1, 1.0))


def _images(n: int = N) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 256, (int(rng.integers(9, 41)), int(rng.integers(9, 41)), 3), dtype=np.uint8)
            for _ in range(n)]


def _write(path, images, store="raw"):
    image = (tbl_format.Leaf("var_array", dtype="uint8", ndim=3) if store == "raw"
             else tbl_format.Leaf("encoded_image", format="jpeg"))
    schema = tbl_format.Schema({"image": image, "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int")})
    with tbl_format.Writer(path, schema, shard_rows=8) as w:
        for i, img in enumerate(images):
            value = img if store == "raw" else b"\xff\xd8 not decoded here"
            w.write({"image": value, "height": img.shape[0], "width": img.shape[1], "label": 3 * i})
    return path


@pytest.fixture(scope="module")
def images():
    return _images()


@pytest.fixture(scope="module")
def raw_path(tmp_path_factory, images):
    return _write(tmp_path_factory.mktemp("var") / "raw", images)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                 reason="torch sees no CUDA device"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "layout", "hflip"), [("float32", "CHW", 0.5), ("uint8", "HWC", 1.0),
                                                        ("bfloat16", "CHW", 0.0)])
def test_random_resized_crop_equals_image_loader_and_the_reference(raw_path, images, dtype, layout, hflip, device):
    opts = {"seed": SEED, "hflip": hflip, "dtype": dtype, "layout": layout, "random_resized_crop": CROP}
    with ImageLoader(raw_path, 6, backend="torch", prefetch=0, **opts) as cpu, \
            ResidentImageLoader(raw_path, 6, device=device, **opts) as res:
        cpu.set_epoch(2)
        res.set_epoch(2)
        want, got = collect(cpu), collect(res)
        assert res.image_shape is None
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b)
    ids = got[2]
    assert np.array_equal(got[1], ids * 3)
    if dtype == "float32":  # and the numpy reference on boxes drawn from the sizes alone
        hs = np.array([images[i].shape[0] for i in ids], np.int64)
        ws = np.array([images[i].shape[1] for i in ids], np.int64)
        boxes = order.random_resized_crop_boxes(SEED, 2, ids, hs, ws, CROP.scale, CROP.ratio)
        flip = order.flip_draws(SEED, 2, ids, hflip).astype(np.uint8)
        ref = np.empty((len(ids), 3, 10, 12), np.float32)
        table = kref.normalization_table((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "float32")
        kref.crop_resize_images([images[i] for i in ids], boxes, ref, table, flip, "CHW")
        assert np.array_equal(got[0], ref)


def test_center_crop_and_resume_across_loaders(raw_path):
    opts = {"seed": SEED, "hflip": 0.5, "center_crop": 8, "dtype": "float16"}
    with ImageLoader(raw_path, 5, backend="torch", prefetch=0, **opts) as cpu:
        want = collect(cpu)
    with ImageLoader(raw_path, 5, backend="torch", prefetch=0, **opts) as first:
        it = iter(first)
        next(it)
        next(it)
        state = first.state_dict()
        del it
    with ResidentImageLoader(raw_path, 4, device="cpu", **opts) as res:
        res.load_state_dict(state)  # a state of ImageLoader resumes the resident loader
        tail = collect(res)
    for a, b in zip(tail, want, strict=True):
        assert np.array_equal(a, b[10:])


def test_jpeg_storage_and_several_views_are_refused_by_name(tmp_path, images, raw_path):
    path = _write(tmp_path / "jpeg", images[:4], store="jpeg")
    with pytest.raises(UnsupportedCombinationError, match="--store raw"):
        ResidentImageLoader(path, 2, device="cpu", random_resized_crop=CROP)
    with pytest.raises(UnsupportedCombinationError, match="one RandomResizedCrop"):
        ResidentImageLoader(raw_path, 2, device="cpu", random_resized_crop=[CROP, CROP])
