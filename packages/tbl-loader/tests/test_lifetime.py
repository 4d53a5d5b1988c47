"""Producer threads and buffers never outlive their loader; held batches are never overwritten."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import weakref

import numpy as np
import pytest
from conftest import as_numpy, reference_images

import tbl_kernels
from tbl_loader import ImageLoader
from tbl_loader.errors import LoaderClosedError, RingGrowthWarning


def _started_since(before: set[threading.Thread]) -> list[threading.Thread]:
    """The live threads that did not exist in ``before`` (other tests' threads may come and go meanwhile)."""
    return [t for t in threading.enumerate() if t not in before]


def _wait_gone(before: set[threading.Thread], timeout: float = 30.0) -> list[threading.Thread]:
    # Returns as soon as they are gone; the long limit only matters on a loaded CI machine,
    # where a stopping thread may wait seconds for a core.
    end = time.monotonic() + timeout
    while _started_since(before) and time.monotonic() < end:
        time.sleep(0.01)
    return _started_since(before)


def test_break_stops_the_producer(dataset_path):
    before = set(threading.enumerate())
    loader = ImageLoader(dataset_path, 4, prefetch=3, backend="numpy")
    for k, _ in enumerate(loader):
        assert len(_started_since(before)) == 1
        if k == 2:
            break
    assert _wait_gone(before) == []
    loader.close()


def test_close_stops_the_producer_and_forbids_iteration(dataset_path):
    before = set(threading.enumerate())
    loader = ImageLoader(dataset_path, 4, prefetch=2, backend="numpy")
    it = iter(loader)
    next(it)
    loader.close()
    assert _started_since(before) == []
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(LoaderClosedError):
        iter(loader)
    loader.close()  # idempotent


def test_garbage_collection_stops_the_producer_and_frees_the_loader(dataset_path):
    before = set(threading.enumerate())
    loader = ImageLoader(dataset_path, 4, prefetch=2, backend="numpy")
    it = iter(loader)
    batch = next(it)
    ref = weakref.ref(loader)
    del loader, it, batch
    gc.collect()
    assert ref() is None
    assert _wait_gone(before) == []


def test_new_pass_stops_the_previous_one(dataset_path):
    before = set(threading.enumerate())
    loader = ImageLoader(dataset_path, 4, prefetch=2, backend="numpy")
    first = iter(loader)
    next(first)
    second = iter(loader)
    next(second)
    assert len(_started_since(before)) == 1
    with pytest.raises(StopIteration):
        next(first)
    loader.close()


def test_exhausted_pass_leaves_no_thread(dataset_path):
    before = set(threading.enumerate())
    loader = ImageLoader(dataset_path, 50, prefetch=4, backend="numpy")
    assert len(list(loader)) == 3
    assert _wait_gone(before) == []
    loader.close()


@pytest.mark.parametrize("prefetch", [0, 2])
def test_kernel_error_reaches_the_consumer_with_its_traceback(dataset_path, monkeypatch, prefetch):
    real = tbl_kernels.gather_normalize
    calls = []
    raised = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            exc = MemoryError("simulated failure in batch 3")
            raised.append(exc)
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(tbl_kernels, "gather_normalize", flaky)
    before = set(threading.enumerate())
    loader = ImageLoader(dataset_path, 4, prefetch=prefetch, backend="numpy")
    it = iter(loader)
    next(it)
    next(it)
    with pytest.raises(MemoryError, match="batch 3") as info:
        next(it)
    assert info.value is raised[0]
    assert "flaky" in [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert _wait_gone(before) == []
    assert loader.consumed == 8  # the failed batch was not consumed
    monkeypatch.setattr(tbl_kernels, "gather_normalize", real)
    rest = list(loader)  # the next pass resumes at the failed batch
    assert sum(len(b.indices) for b in rest) == 101 - 8
    loader.close()


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_held_batch_is_never_overwritten(dataset_path, images, backend):
    if backend == "torch":
        pytest.importorskip("torch")
    loader = ImageLoader(dataset_path, 4, prefetch=2, backend=backend, hflip=0.5, seed=11)
    it = iter(loader)
    held = next(it)
    held_copy = as_numpy(held.images).copy()
    # Keep only derived views of a second batch: a slice and a strided view.
    second = next(it)
    second_part = second.images[1:3]
    second_strided = second.images[:, :, ::2]
    part_copy = as_numpy(second_part).copy()
    strided_copy = as_numpy(second_strided).copy()
    del second
    for _ in range(15):  # many later batches, several full turns of the ring
        next(it)
    assert np.array_equal(as_numpy(held.images), held_copy)
    assert np.array_equal(as_numpy(second_part), part_copy)
    assert np.array_equal(as_numpy(second_strided), strided_copy)
    idx = as_numpy(held.indices)
    want = reference_images(images, idx, seed=11, epoch=0, hflip=0.5, dtype="float32", layout="CHW")
    assert np.array_equal(held_copy, want)
    loader.close()


def test_released_buffers_are_reused(dataset_path):
    loader = ImageLoader(dataset_path, 4, prefetch=1, backend="numpy")
    for _ in loader:
        pass
    ring = loader._pipeline.ring
    assert ring.allocations == len(ring) == 3  # prefetch + 2, never grown
    loader.close()


def test_keeping_every_batch_grows_the_ring_with_a_warning(dataset_path):
    loader = ImageLoader(dataset_path, 2, prefetch=1, backend="numpy", shuffle=False)
    with pytest.warns(RingGrowthWarning):
        batches = list(loader)
    assert np.array_equal(np.concatenate([b.indices for b in batches]), np.arange(101))
    first = reference_images(loader_images(loader), np.arange(2), seed=0, epoch=0, hflip=0.0,
                             dtype="float32", layout="CHW")
    assert np.array_equal(batches[0].images, first)
    loader.close()


def loader_images(loader):
    return np.concatenate([np.asarray(s) for s in loader.dataset.segments("image")])


def test_interpreter_exit_mid_iteration_is_prompt_and_clean(dataset_path):
    script = textwrap.dedent(
        f"""
        import sys, threading, time
        from tbl_loader import ImageLoader
        loader = ImageLoader({str(dataset_path)!r}, 2, prefetch=3, backend="numpy")
        it = iter(loader)
        next(it); next(it)
        assert threading.active_count() == 2
        print("exiting at", time.time(), flush=True)
        sys.exit(0)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    ended = time.time()
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr
    exit_started = float(proc.stdout.split("exiting at")[1])
    assert ended - exit_started < 10  # shutdown itself, not interpreter start-up


def _mapped(path) -> bool:
    """Whether any file under ``path`` is memory-mapped in this process (Linux /proc)."""
    with open("/proc/self/maps") as f:
        return str(path) in f.read()


@pytest.fixture
def private_dataset(tmp_path, images, labels):
    from conftest import write_dataset

    return write_dataset(tmp_path / "mapped", images, labels, shard_rows=40)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_close_unmaps_the_dataset(private_dataset):
    loader = ImageLoader(private_dataset, 8, prefetch=2, backend="numpy")
    it = iter(loader)
    batch = next(it)
    assert _mapped(private_dataset)
    loader.close()
    # tbl_format's shard accessors form a reference cycle with the map, so the unmap itself
    # happens at the next collection; without close() the loader's own views keep it mapped.
    gc.collect()
    assert not _mapped(private_dataset)
    assert batch.images.shape == (8, 3, 12, 10)  # batches are ring copies, not views of the map
    del it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_open_loader_keeps_its_map(private_dataset):
    loader = ImageLoader(private_dataset, 8, prefetch=2, backend="numpy")
    next(iter(loader))
    gc.collect()
    assert _mapped(private_dataset)
    loader.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_garbage_collection_unmaps_the_dataset(private_dataset):
    loader = ImageLoader(private_dataset, 8, prefetch=2, backend="numpy")
    it = iter(loader)
    next(it)
    assert _mapped(private_dataset)
    del loader, it
    gc.collect()
    assert not _mapped(private_dataset)


def test_close_with_a_blocked_transform_returns_in_bounded_time_naming_it(dataset_path, monkeypatch):
    """A user transform that never returns: close() waits JOIN_TIMEOUT_S, then warns naming the function the
    producer thread is stuck in, and returns; the loader is closed."""
    from tbl_loader.host import producer

    monkeypatch.setattr(producer, "JOIN_TIMEOUT_S", 0.5)
    gate = threading.Event()
    calls = []

    def blocking_transform(batch):
        calls.append(1)
        if len(calls) > 1:
            gate.wait()  # the second batch never finishes until the test lets it
        return batch

    ld = ImageLoader(dataset_path, 8, backend="numpy", transform=blocking_transform, prefetch=2)
    next(iter(ld))
    while len(calls) < 2:
        time.sleep(0.01)
    start = time.monotonic()
    try:
        with pytest.warns(RuntimeWarning, match=r"did not stop within 0.5 s; it is in wait \(threading.py:\d+\) "
                                                r"<- .*blocking_transform \(test_lifetime.py:\d+\)"):
            ld.close()
        assert time.monotonic() - start < 5 and ld.closed
    finally:
        gate.set()
