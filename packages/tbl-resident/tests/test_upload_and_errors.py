"""Chunked upload, the device-memory refusal, argument errors and lifetime."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import N_IMAGES, collect

import tbl_resident
from tbl_loader import RandomResizedCrop
from tbl_loader.errors import LoaderClosedError
from tbl_resident import DeviceMemoryError, ResidentImageLoader, UploadStats
from tbl_resident.upload import upload_rows


def test_chunked_upload_crosses_shards(dataset_path, images, labels):
    """A chunk of 7 rows never lines up with the 40-row shards: every row still lands once, in order."""
    row = int(np.prod(images.shape[1:]))
    with ResidentImageLoader(dataset_path, 50, device="cpu", dtype="uint8", layout="HWC", shuffle=False,
                             chunk_bytes=7 * row) as r:
        stats = r.upload_stats
        got, lab, _ = collect(r)
        assert r.resident_bytes == images.nbytes + labels.nbytes
    assert isinstance(stats, UploadStats)
    assert stats.bytes == images.nbytes and stats.chunk_bytes == 7 * row
    assert stats.chunks == 6 + 6 + 3  # ceil(40/7) + ceil(40/7) + ceil(21/7)
    assert np.array_equal(got, images) and np.array_equal(lab, labels)


def test_upload_rows_progress_and_validation(capsys):
    segs = [np.arange(30, dtype=np.uint8).reshape(10, 3), np.arange(6, dtype=np.uint8).reshape(2, 3)]
    dst = torch.empty((12, 3), dtype=torch.uint8)
    stats = upload_rows(segs, dst, chunk_bytes=9, progress=True)
    assert torch.equal(dst, torch.from_numpy(np.concatenate(segs)))
    assert stats.chunks == 4 + 1 and stats.gb_per_s > 0
    assert "upload" in capsys.readouterr().err  # the tqdm bar
    with pytest.raises(ValueError, match="shape"):
        upload_rows(segs, torch.empty((11, 3), dtype=torch.uint8))
    with pytest.raises(ValueError, match="chunk_bytes"):
        upload_rows(segs, dst, chunk_bytes=0)


def test_refuses_dataset_larger_than_free_memory(dataset_path, monkeypatch):
    monkeypatch.setattr(tbl_resident.device, "free_bytes", lambda device: 1000)
    with pytest.raises(DeviceMemoryError, match=r"needs [\d,]+ bytes .* but 1,000 bytes are free") as info:
        ResidentImageLoader(dataset_path, 16, device="cpu")
    assert info.value.free == 1000 and info.value.needed > N_IMAGES * 12 * 10 * 3


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"device": "tpu"}, ValueError, "device must be one of"),
        ({"dtype": "float64"}, ValueError, "dtype must be one of"),
        ({"layout": "CWH"}, ValueError, "layout must be one of"),
        ({"layout": "HWC", "channels_last": True}, ValueError, "channels_last"),
        ({"hflip": 1.5}, ValueError, "hflip"),
        ({"center_crop": 4, "random_resized_crop": RandomResizedCrop(4)}, ValueError, "exclusive"),
        ({"random_resized_crop": (4, 4)}, TypeError, "RandomResizedCrop"),
        ({"center_crop": 40}, ValueError, "center crop"),
        ({"mean": (0.5,), "std": (0.5,)}, ValueError, "one value per channel"),
        ({"image_key": "pixels"}, ValueError, "no 'pixels' leaf"),
        ({"batch_size": 0}, ValueError, "batch_size"),
    ],
)
def test_bad_arguments(dataset_path, kwargs, error, match):
    kwargs = {"batch_size": 8, "device": "cpu", **kwargs}
    with pytest.raises(error, match=match):
        ResidentImageLoader(dataset_path, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_cuda_unavailable_is_a_clear_error(dataset_path):
    with pytest.raises(RuntimeError, match="no CUDA device"):
        ResidentImageLoader(dataset_path, 8, device="cuda")


def test_close_releases_and_refuses_iteration(dataset_path):
    r = ResidentImageLoader(dataset_path, 8, device="cpu")
    it = iter(r)
    next(it)
    r.close()
    assert r.resident_bytes == 0
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(LoaderClosedError):
        iter(r)


def test_public_api_is_sorted_and_complete():
    import importlib

    for name in ("tbl_resident", "tbl_resident.device", "tbl_resident.loader", "tbl_resident.normalize",
                 "tbl_resident.resample", "tbl_resident.upload"):
        mod = importlib.import_module(name)
        assert list(mod.__all__) == sorted(mod.__all__), name
        assert all(hasattr(mod, attr) for attr in mod.__all__), name
