"""ImageLoader output correctness against the numpy reference kernels, and argument validation."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import N_IMAGES, as_numpy, collect, make_images, reference_images, write_dataset

import tbl_format
from tbl_loader import Batch, ImageLoader, RandomResizedCrop
from tbl_loader.stream import order


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_no_crop_output_matches_reference(dataset_path, images, labels, dtype, layout):
    with ImageLoader(dataset_path, 16, seed=3, hflip=0.5, dtype=dtype, layout=layout, backend="numpy") as loader:
        got, lab, idx = collect(loader)
    assert np.array_equal(np.sort(idx), np.arange(N_IMAGES))
    assert np.array_equal(idx, order.epoch_permutation(N_IMAGES, 3, 0))
    want = reference_images(images, idx, seed=3, epoch=0, hflip=0.5, dtype=dtype, layout=layout)
    assert got.shape == want.shape
    assert np.array_equal(got.view(want.dtype), want)
    assert np.array_equal(lab, labels[idx])


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
def test_torch_output_dtypes_match_reference(dataset_path, images, labels, dtype):
    torch = pytest.importorskip("torch")
    with ImageLoader(dataset_path, 32, seed=1, hflip=0.3, dtype=dtype, backend="torch") as loader:
        b = next(iter(loader))
        want_dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
                      "uint8": torch.uint8}[dtype]
        assert isinstance(b.images, torch.Tensor) and b.images.dtype == want_dtype
        assert b.labels.dtype == torch.int64 and b.indices.dtype == torch.int64
        idx = b.indices.numpy()
        want = reference_images(images, idx, seed=1, epoch=0, hflip=0.3, dtype=dtype, layout="CHW")
        assert np.array_equal(as_numpy(b.images).view(want.dtype), want)
        assert np.array_equal(b.labels.numpy(), labels[idx])


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_random_resized_crop_matches_reference(dataset_path, images, layout, dtype):
    crop = RandomResizedCrop((8, 6), scale=(0.2, 1.0))
    loader = ImageLoader(dataset_path, 20, seed=4, hflip=0.5, random_resized_crop=crop, dtype=dtype,
                         layout=layout, backend="numpy")
    loader.set_epoch(2)
    got, _, idx = collect(loader)
    want = reference_images(images, idx, seed=4, epoch=2, hflip=0.5, dtype=dtype, layout=layout, crop=crop)
    assert got.shape[1:] == ((3, 8, 6) if layout == "CHW" else (8, 6, 3))
    assert np.array_equal(got, want)
    loader.close()


def test_center_crop_matches_reference(dataset_path, images):
    loader = ImageLoader(dataset_path, 25, seed=2, center_crop=(9, 7), hflip=1.0, backend="numpy")
    got, _, idx = collect(loader)
    want = reference_images(images, idx, seed=2, epoch=0, hflip=1.0, dtype="float32", layout="CHW", center=(9, 7))
    assert got.shape[1:] == (3, 9, 7)
    assert np.array_equal(got, want)
    # The centred box (top = left = round(1.5) = 2) without resize is the plain crop of the image.
    plain = reference_images(images[:, 2:11, 2:9], idx, seed=2, epoch=0, hflip=1.0, dtype="float32", layout="CHW")
    assert np.array_equal(got, plain)
    loader.close()


def test_custom_mean_std_and_single_file(single_file_path, images):
    mean, std = (0.5, 0.25, 0.125), (0.1, 0.2, 0.3)
    with ImageLoader(single_file_path, 64, shuffle=False, mean=mean, std=std, backend="numpy") as loader:
        got, _, idx = collect(loader)
    assert np.array_equal(idx, np.arange(N_IMAGES))
    want = reference_images(images, idx, seed=0, epoch=0, hflip=0.0, dtype="float32", layout="CHW",
                            mean=mean, std=std)
    assert np.array_equal(got, want)


def test_dataset_without_labels_yields_none(tmp_path):
    imgs = make_images(9, (4, 4, 1))
    path = write_dataset(tmp_path / "nolabel.tbl", imgs)
    with ImageLoader(path, 4, mean=(0.5,), std=(0.5,), backend="numpy") as loader:
        batches = list(loader)
        assert all(b.labels is None for b in batches)
        assert isinstance(batches[0], Batch)
        assert batches[0].images.shape == (4, 1, 4, 4)


def test_open_dataset_object_is_left_open(dataset_path):
    ds = tbl_format.open(dataset_path)
    loader = ImageLoader(ds, 50, backend="numpy")
    assert len(list(loader)) == 3
    loader.close()
    assert len(ds) == N_IMAGES and ds[0]["label"] == 0


def test_len_and_drop_last(dataset_path):
    assert len(ImageLoader(dataset_path, 10, backend="numpy")) == 11
    loader = ImageLoader(dataset_path, 10, drop_last=True, backend="numpy")
    assert len(loader) == 10
    sizes = [len(b.indices) for b in loader]
    assert sizes == [10] * 10
    assert len(ImageLoader(dataset_path, 10, world_size=4, rank=1, backend="numpy")) == 3  # 26 per rank
    assert len(ImageLoader(dataset_path, 10, world_size=4, rank=1, padding="drop", backend="numpy")) == 3


def test_last_partial_batch_is_a_prefix_view(dataset_path):
    with ImageLoader(dataset_path, 40, backend="numpy", shuffle=False) as loader:
        batches = list(loader)
    assert [len(b.images) for b in batches] == [40, 40, 21]
    assert np.array_equal(batches[-1].indices, np.arange(80, 101))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"dtype": "float64"}, ValueError, "dtype"),
        ({"layout": "NCHW"}, ValueError, "layout"),
        ({"hflip": 1.5}, ValueError, "hflip"),
        ({"random_resized_crop": RandomResizedCrop(4), "center_crop": 4}, ValueError, "exclusive"),
        ({"random_resized_crop": (4, 4)}, TypeError, "RandomResizedCrop"),
        ({"random_resized_crop": RandomResizedCrop(4, ratio=(2.0, 1.0))}, ValueError, "ratio"),
        ({"center_crop": 50}, ValueError, "fit"),
        ({"center_crop": (0, 3)}, ValueError, "center_crop"),
        ({"mean": (0.5,), "std": (0.5,)}, ValueError, "per channel"),
        ({"num_threads": 0}, ValueError, "num_threads"),
        ({"prefetch": -1}, ValueError, "prefetch"),
        ({"padding": "pad"}, ValueError, "padding"),
        ({"rank": 2, "world_size": 2}, ValueError, "rank"),
        ({"rank": 1}, ValueError, "world_size"),
        ({"seed": -1}, ValueError, "seed"),
        ({"backend": "jax"}, ValueError, "backend"),
        ({"device": "cpu"}, ValueError, "backend"),
        ({"pin_memory": True}, ValueError, "pinned"),
        ({"image_key": "img"}, ValueError, "no 'img' leaf"),
    ],
)
def test_bad_arguments_raise_named_errors(dataset_path, kwargs, error, match):
    args = {"backend": "numpy", **kwargs}
    with pytest.raises(error, match=match):
        ImageLoader(dataset_path, 8, **args)


def test_batch_size_validated(dataset_path):
    with pytest.raises(ValueError, match="batch_size"):
        ImageLoader(dataset_path, 0, backend="numpy")


def test_pin_memory_without_cuda_warns_and_is_a_no_op(dataset_path, images):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available: pin_memory is honoured here")
    with pytest.warns(RuntimeWarning, match="pin_memory=True has no effect"):
        loader = ImageLoader(dataset_path, 8, pin_memory=True, backend="torch")
    assert loader.output.pin_memory is False
    b = next(iter(loader))
    assert not b.images.is_pinned()
    loader.close()


def test_cpu_device_is_plain_host_output(dataset_path):
    torch = pytest.importorskip("torch")
    with ImageLoader(dataset_path, 8, device="cpu", backend="torch") as loader:
        b = next(iter(loader))
    assert b.images.device == torch.device("cpu")


def test_cuda_device_without_cuda_is_an_error(dataset_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        ImageLoader(dataset_path, 8, device="cuda", backend="torch")


def test_default_backend_is_torch_when_installed(dataset_path):
    torch = pytest.importorskip("torch")
    with ImageLoader(dataset_path, 8) as loader:
        assert isinstance(next(iter(loader)).images, torch.Tensor)


def test_non_cuda_device_gets_a_blocking_copy(dataset_path):
    torch = pytest.importorskip("torch")
    with ImageLoader(dataset_path, 8, device="meta", backend="torch", dtype="bfloat16") as loader:
        b = next(iter(loader))
    assert b.images.device.type == "meta" and b.images.dtype == torch.bfloat16
    assert b.labels.device.type == "meta"
    assert b.indices.device.type == "cpu"
