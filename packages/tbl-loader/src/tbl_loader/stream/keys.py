"""Per-sample 64-bit keys for user randomness, and generators seeded from them.

Every batch a loader yields carries ``batch.keys``: one uint64 per sample,
``hash_u64(seed, epoch, TAG_SAMPLE_KEY, row)`` from :mod:`tbl_loader.stream.order`'s
counter-based generator (a stream of its own, independent of the permutation,
flip and crop draws). A key depends only on the loader's seed, the epoch and
the dataset row, never on batch size, prefetch, thread count, world size or
resume, so user augmentations drawn from it are as deterministic as the
loader's own.

Making a transform independent of the batch size: draw every random number of
a sample from *that sample's* key, never from one generator shared by the
batch (a shared generator hands sample ``i`` a different draw when the batch
is cut differently). Either loop over the samples with one generator each::

    for k, key in enumerate(batch.keys):
        g = numpy_generator(key)              # or torch_generator(key)
        images[k] = jitter(images[k], g.uniform(0.6, 1.4))

or draw for the whole batch at once, still per sample, with
:func:`keys_uniform` (vectorized; draw ``d`` of a sample is its own number)::

    brightness = 0.6 + 0.8 * keys_uniform(batch.keys, draw=0)   # (B,) float64

Reproducibility of the helpers: :func:`keys_uniform` is defined here exactly
(integer operations only), so it is stable across machines and versions.
:func:`numpy_generator` seeds numpy's ``Philox`` bit generator with the key
(its bit stream is stable; numpy documents that ``Generator`` distribution
methods may change between numpy versions). :func:`torch_generator` seeds a
``torch.Generator`` (stable for a given torch version and device type).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import order

__all__ = ["TAG_SAMPLE_KEY", "keys_uniform", "numpy_generator", "sample_keys", "torch_generator"]

TAG_SAMPLE_KEY = 65
"""Stream tag of the per-sample keys (tags below 64 are :mod:`tbl_loader.stream.order`'s, 64 the subsample's)."""


def sample_keys(seed: int, epoch: int, rows: Any) -> np.ndarray:
    """uint64 keys of dataset ``rows`` in ``epoch`` of a loader seeded ``seed``."""
    return order.hash_u64(seed, epoch, TAG_SAMPLE_KEY, np.asarray(rows))


def keys_uniform(keys: Any, draw: int = 0) -> np.ndarray:
    """Float64 numbers in ``[0, 1)``, one per key: the key's draw number ``draw``.

    Exactly ``(mix(mix(key + G) ^ mix(draw + G)) >> 11) * 2**-53`` in uint64 arithmetic, with ``mix``
    and ``G`` of :mod:`tbl_loader.stream.order` (integer operations only: the same bits on every machine).
    """
    if isinstance(draw, bool) or not isinstance(draw, (int, np.integer)) or not 0 <= draw < 2**64:
        raise ValueError(f"draw must be an int in [0, 2**64), got {draw!r}")
    keys = np.asarray(keys)
    if keys.dtype.kind not in "iu":
        raise TypeError(f"keys must be an integer array, got dtype {keys.dtype}")
    stream = order._mix(np.array([draw], dtype=np.uint64) + order._G)
    bits = order._mix(order._mix(keys.astype(np.uint64) + order._G) ^ stream)
    return (bits >> np.uint64(11)).astype(np.float64) * (2.0**-53)


def numpy_generator(key: Any) -> np.random.Generator:
    """A numpy Generator (Philox bit generator) seeded from one sample key."""
    return np.random.Generator(np.random.Philox(key=int(np.uint64(key))))


def torch_generator(key: Any, device: Any = "cpu") -> Any:
    """A ``torch.Generator`` on ``device`` seeded from one sample key."""
    import torch  # only this helper needs torch

    g = torch.Generator(device=device)
    g.manual_seed(int(np.uint64(key)))
    return g
