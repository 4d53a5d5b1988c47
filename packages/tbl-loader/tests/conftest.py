"""Shared fixtures: small image datasets written with tbl_format, and the numpy reference of a batch."""

from __future__ import annotations

import numpy as np
import pytest

import tbl_format
import tbl_kernels
import tbl_kernels.reference as kref
from tbl_loader.stream import order

# tbl-kernels 0.2's per-sample calls: variable-size images and resize + center_crop need them, and the
# oldest kernels the loader's pin admits (0.1, tested by the kernels matrix) lack them.
PER_SAMPLE = hasattr(tbl_kernels, "crop_resize_images") and hasattr(tbl_kernels, "resize_crop_images")
needs_per_sample = pytest.mark.skipif(not PER_SAMPLE, reason="needs tbl-kernels 0.2 (per-sample resize calls)")

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


def reference_images(images, ids, *, seed, epoch, hflip, dtype, layout, crop=None, center=None,
                     mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)):
    """What the loader must produce for sample ``ids``: the numpy reference kernels on the drawn augmentations.

    Returns the raw storage array (float16 / bfloat16 as their 2-byte patterns).
    """
    ids = np.asarray(ids, dtype=np.int64)
    flip = order.flip_draws(seed, epoch, ids, hflip) if hflip else None
    table = None if dtype == "uint8" else kref.normalization_table(mean, std, dtype)
    storage = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8}[dtype]
    h, w, c = images.shape[1:]
    if crop is not None:
        oh, ow = crop.output_size
        boxes = order.random_resized_crop_boxes(seed, epoch, ids, h, w, crop.scale, crop.ratio)
    elif center is not None:
        oh, ow = center
        boxes = np.tile(order.center_crop_box(h, w, oh, ow), (len(ids), 1))
    else:
        oh, ow, boxes = h, w, None
    shape = (len(ids), c, oh, ow) if layout == "CHW" else (len(ids), oh, ow, c)
    out = np.empty(shape, dtype=storage)
    if boxes is not None:
        kref.gather_crop_resize([images], ids, boxes, out, table, flip, layout)
    elif table is None:
        kref.gather_u8([images], ids, out, flip, layout)
    else:
        kref.gather_normalize([images], ids, out, table, flip, layout)
    return out


def as_numpy(x):
    """A batch field as a host numpy array (torch bfloat16 / float16 as their bit patterns)."""
    if x is None or isinstance(x, np.ndarray):
        return x
    import torch

    x = x.cpu()  # a batch on a device (CUDA tests) is compared on the host
    if x.dtype == torch.bfloat16:
        return x.view(torch.int16).numpy().view(np.uint16)
    if x.dtype == torch.float16:
        return x.numpy()
    return x.numpy()


def collect(loader, limit: int | None = None):
    """(images, labels, indices) of the next ``limit`` batches (or the rest of the epoch), concatenated
    numpy copies. Takes exactly ``limit`` batches, so the loader's position moves by exactly that."""
    imgs, labs, idx = [], [], []
    it = iter(loader)
    while limit is None or len(imgs) < limit:
        try:
            b = next(it)
        except StopIteration:
            break
        imgs.append(as_numpy(b.images).copy())
        labs.append(None if b.labels is None else as_numpy(b.labels).copy())
        idx.append(as_numpy(b.indices).copy())
    del it
    if not imgs:
        return None, None, np.empty(0, np.int64)
    lab = None if labs[0] is None else np.concatenate(labs)
    return np.concatenate(imgs), lab, np.concatenate(idx)


def tree_form(value):
    """A pytree as nested tuples that ``==`` compares exactly: containers and scalars with their type,
    arrays by dtype, shape and bytes (subclasses of ndarray alike)."""
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return ("dict", tuple((k, tree_form(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(tree_form(v) for v in value))
    return (type(value).__name__, value)


def assert_tree_equal(got, want, where: str = "") -> None:
    """Same structure, types and values, every array element bit for bit (``where`` names the item)."""
    assert tree_form(got) == tree_form(want), where


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 server on 127.0.0.1 (moto), shared by the session; skips without the remote extra or moto."""
    from s3_server import S3Server

    server = S3Server()
    yield server
    server.stop()
