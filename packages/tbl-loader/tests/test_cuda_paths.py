"""ImageLoader's CUDA paths: pinned ring, non-blocking copies guarded by events, device transforms.

Skipped where torch sees no CUDA device; the CPU side of the same machinery is tested elsewhere
(test_ring, test_output, test_transforms) with fake events.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import collect

from tbl_loader import ImageLoader, RandomResizedCrop

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "uint8"])
@pytest.mark.parametrize("pin", [True, False])
def test_cuda_batches_equal_the_host_batches(dataset_path, dtype, pin):
    kw = dict(seed=2, hflip=0.5, dtype=dtype, backend="torch", random_resized_crop=RandomResizedCrop((9, 7)))
    with ImageLoader(dataset_path, 16, **kw) as cpu, \
            ImageLoader(dataset_path, 16, device="cuda", pin_memory=pin, **kw) as gpu:
        first = next(iter(gpu))
        assert first.images.device.type == "cuda" and first.labels.device.type == "cuda"
        assert first.indices.device.type == "cpu"
        if pin:
            assert all(a.pinned is not None for s in gpu._pipeline.ring.slots for a in s.arrays.values())
        del first
        gpu.set_epoch(1)
        gpu.set_epoch(0)  # back to the start of epoch 0
        for a, b in zip(collect(cpu), collect(gpu), strict=True):
            assert np.array_equal(a, b)


def test_ring_never_overwrites_a_pending_copy(dataset_path):
    """The consumer's stream is kept busy so every non-blocking copy is still queued when the producer wants
    its slot back: the event must hold the slot, or later batches would read overwritten bytes."""
    with ImageLoader(dataset_path, 8, backend="torch", seed=5, hflip=0.5) as cpu:
        want = [b.images.double().sum().item() for b in cpu]
    got = []
    with ImageLoader(dataset_path, 8, device="cuda", pin_memory=True, prefetch=4, seed=5, hflip=0.5) as gpu:
        for b in gpu:
            torch.cuda._sleep(2_000_000)  # a few ms of GPU time ahead of each copy
            got.append(b.images.double().sum())
        got = [g.item() for g in got]
    assert got == want


def test_device_transform_runs_on_the_cuda_batch(dataset_path):
    mean = torch.tensor([0.485, 0.456, 0.406], device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device="cuda").view(1, 3, 1, 1) * 255
    seen = []

    def normalize(batch):
        seen.append(batch.images.device.type)
        return batch._replace(images=(batch.images.float() - mean) / std)

    with ImageLoader(dataset_path, 16, backend="torch", dtype="float32", seed=1) as ref, \
            ImageLoader(dataset_path, 16, device="cuda", pin_memory=True, dtype="uint8", seed=1,
                        device_transform=normalize, num_threads=2) as gpu:
        for a, b in zip(ref, gpu, strict=True):
            assert b.images.dtype == torch.float32 and b.images.device.type == "cuda"
            assert torch.allclose(a.images, b.images.cpu(), atol=1e-5)
    assert seen and set(seen) == {"cuda"}


def test_producer_transform_then_cuda_copy(dataset_path):
    def flip_all(batch):
        return batch._replace(images=batch.images.flip(-1))

    with ImageLoader(dataset_path, 16, backend="torch", seed=3) as cpu, \
            ImageLoader(dataset_path, 16, backend="torch", seed=3, device="cuda", pin_memory=True,
                        transform=flip_all) as gpu:
        for a, b in zip(cpu, gpu, strict=True):
            assert b.images.device.type == "cuda"
            assert torch.equal(a.images.flip(-1), b.images.cpu())
