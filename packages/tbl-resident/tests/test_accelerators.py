"""The same parity and resume checks on CUDA and MPS; skipped where torch sees no such device.

``pytest -k cuda`` (or ``-k mps``) selects one device's tests.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import collect

import tbl_resident
from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_resident import ResidentImageLoader

_HAS_CUDA = torch.cuda.is_available()
_HAS_MPS = torch.backends.mps.is_available()

DEVICES = [
    pytest.param("cuda", marks=pytest.mark.skipif(not _HAS_CUDA, reason="torch sees no CUDA device")),
    pytest.param("mps", marks=pytest.mark.skipif(not _HAS_MPS, reason="torch's MPS backend is not available")),
]


def _pair(path, batch_size, device, **kwargs):
    return (ImageLoader(path, batch_size, backend="torch", prefetch=0, **kwargs),
            ResidentImageLoader(path, batch_size, device=device, **kwargs))


def _same(cpu, res, limit=None):
    a, b = collect(cpu, limit), collect(res, limit)
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x, y)
    return a


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("hflip", [0.0, 0.5])
def test_device_parity(dataset_path, device, dtype, layout, hflip):
    cpu, res = _pair(dataset_path, 16, device, seed=3, hflip=hflip, dtype=dtype, layout=layout)
    with cpu, res:
        b = next(iter(res))
        assert b.images.device.type == device and b.labels.device.type == device
        assert b.indices.device.type == "cpu"
        res.set_epoch(1)
        res.set_epoch(0)  # back to the start of epoch 0
        _same(cpu, res)
        _same(cpu, res)  # epoch 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_device_crop_is_exact(dataset_path, device, dtype):
    crop = RandomResizedCrop((8, 6), scale=(0.05, 1.0))
    cpu, res = _pair(dataset_path, 20, device, seed=4, hflip=0.5, random_resized_crop=crop, dtype=dtype)
    with cpu, res:
        _same(cpu, res)


@pytest.mark.parametrize("device", DEVICES)
def test_device_center_crop_and_channels_last(dataset_path, device):
    cpu = ImageLoader(dataset_path, 20, backend="torch", center_crop=(9, 7), hflip=0.5, dtype="float16")
    res = ResidentImageLoader(dataset_path, 20, device=device, center_crop=(9, 7), hflip=0.5, dtype="float16",
                              channels_last=True)
    with cpu, res:
        for a, b in zip(cpu, res, strict=True):
            assert b.images.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(a.images, b.images.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_device_resume_from_cpu_state(dataset_path, device):
    kwargs = dict(seed=8, hflip=0.5, dtype="bfloat16")
    with ImageLoader(dataset_path, 16, backend="torch", **kwargs) as cpu:
        want = collect(cpu)
        cpu.set_epoch(0)
        head = collect(cpu, 2)
        state = cpu.state_dict()
    with ResidentImageLoader(dataset_path, 9, device=device, **kwargs) as res:
        res.load_state_dict(state)
        tail = collect(res)
    for w, h, t in zip(want, head, tail, strict=True):
        assert np.array_equal(w, np.concatenate([h, t]))


@pytest.mark.parametrize("device", DEVICES)
def test_device_free_bytes_and_refusal(dataset_path, device, monkeypatch):
    free = tbl_resident.free_bytes(torch.device(device))
    assert free > 0
    monkeypatch.setattr(tbl_resident.device, "free_bytes", lambda d: 1234)
    with pytest.raises(tbl_resident.DeviceMemoryError, match="1,234 bytes are free"):
        ResidentImageLoader(dataset_path, 8, device=device)


@pytest.mark.skipif(not _HAS_CUDA, reason="torch sees no CUDA device")
def test_cuda_batches_consumed_on_another_stream(dataset_path):
    """Prefetched side-stream batches are safe to read on the consumer's own (non-default) stream."""
    with ImageLoader(dataset_path, 16, backend="torch", seed=6, hflip=0.5) as cpu:
        want = [b.images.double().sum().item() for b in cpu]
    consumer = torch.cuda.Stream()
    with torch.cuda.stream(consumer), \
            ResidentImageLoader(dataset_path, 16, device="cuda", seed=6, hflip=0.5, prefetch=4) as res:
        got = [b.images.double().sum() for b in res]
        got = [g.item() for g in got]
    assert got == want


@pytest.mark.skipif(not _HAS_CUDA, reason="torch sees no CUDA device")
def test_cuda_upload_is_pinned_and_chunked(dataset_path, images):
    row = int(np.prod(images.shape[1:]))
    with ResidentImageLoader(dataset_path, 16, device="cuda", chunk_bytes=5 * row, shuffle=False,
                             dtype="uint8", layout="HWC") as res:
        assert res.upload_stats.pinned and res.upload_stats.chunks == 8 + 8 + 5
        got, _, _ = collect(res)
    assert np.array_equal(got, images)
