"""Fixtures: small image datasets written with tbl_format, and helpers to compare batches bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tbl_format

# The test tensors are tiny: intra-op threads only add synchronization, and on a shared 2-core CI
# machine an OpenMP team waiting for a descheduled thread makes each op take milliseconds.
torch.set_num_threads(1)

N_IMAGES = 101  # prime: every batch size and world size leaves a remainder
IMAGE_SHAPE = (12, 10, 3)


def make_images(n: int = N_IMAGES, shape: tuple[int, ...] = IMAGE_SHAPE, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *shape), dtype=np.uint8)


def write_dataset(path, images: np.ndarray, labels=None, shard_rows: int | None = None):
    samples = []
    for i in range(len(images)):
        s = {"image": images[i]}
        if labels is not None:
            s["label"] = np.int64(labels[i])
        samples.append(s)
    kwargs = {"shard_rows": shard_rows} if shard_rows else {}
    return tbl_format.write(samples, path, metadata={"classes": ["a", "b", "c"]}, **kwargs)


@pytest.fixture(scope="session")
def images() -> np.ndarray:
    return make_images()


@pytest.fixture(scope="session")
def labels() -> np.ndarray:
    return (np.arange(N_IMAGES, dtype=np.int64) * 7919) % 1000


@pytest.fixture(scope="session")
def dataset_path(tmp_path_factory, images, labels):
    """A three-shard dataset directory (shards of 40, 40, 21 rows)."""
    return write_dataset(tmp_path_factory.mktemp("ds") / "sharded", images, labels, shard_rows=40)


@pytest.fixture(scope="session")
def single_file_path(tmp_path_factory, images, labels):
    return write_dataset(tmp_path_factory.mktemp("ds") / "single.tbl", images, labels)


def bits(x) -> np.ndarray:
    """A batch field as a host numpy array of its exact bits (float16 / bfloat16 as 2-byte integers)."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.float16, torch.bfloat16):
            return x.contiguous().view(torch.int16).numpy()
        return x.contiguous().numpy()
    x = np.asarray(x)
    return x.view(np.int16) if x.dtype in (np.float16, np.uint16) else x


def collect(loader, limit: int | None = None):
    """(images, labels, indices) of the next ``limit`` batches (or the rest of the epoch) as numpy bits.

    Takes exactly ``limit`` batches, so the loader's position moves by exactly that."""
    imgs, labs, idx = [], [], []
    it = iter(loader)
    while limit is None or len(imgs) < limit:
        try:
            b = next(it)
        except StopIteration:
            break
        imgs.append(bits(b.images).copy())
        labs.append(None if b.labels is None else bits(b.labels).copy())
        idx.append(bits(b.indices).copy())
    del it
    if not imgs:
        return None, None, np.empty(0, np.int64)
    lab = None if labs[0] is None else np.concatenate(labs)
    return np.concatenate(imgs), lab, np.concatenate(idx)
