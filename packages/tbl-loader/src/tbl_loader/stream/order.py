"""Traversal order and per-sample randomness: pure functions of ``(seed, epoch, sample_id)``.

Every random decision a loader makes (the epoch permutation, each sample's
horizontal flip, each sample's random-resized-crop box) is computed here from a
counter-based generator, so that the stream does not depend on batch size,
prefetch depth, thread count or world size, and so that a resumed run, a GPU
loader (which computes these on the CPU and uploads them) and a straight run
agree bit for bit.

The generator (``ORDER_VERSION`` 1), defined exactly so that it can be
re-implemented anywhere. All integers are uint64 with wrap-around arithmetic::

    G  = 0x9E3779B97F4A7C15
    mix(z):  z ^= z >> 30; z *= 0xBF58476D1CE4E5B9
             z ^= z >> 27; z *= 0x94D049BB133111EB
             z ^= z >> 31                             (the SplitMix64 finalizer)
    key(seed, epoch, tag) = mix(mix(mix(seed + G) ^ (epoch + G)) ^ (tag + G))
    hash(seed, epoch, tag, i) = mix(mix(i + G) ^ key(seed, epoch, tag))
    uniform(...) = (hash(...) >> 11) * 2**-53          (a float64 in [0, 1))

``tag`` separates independent streams (``TAG_*`` below). The permutation of an
epoch is the stable argsort of ``hash(seed, epoch, TAG_PERMUTATION, arange(n))``.
A sample is flipped when ``uniform(seed, epoch, TAG_FLIP, sample_id) < p``.
Random-resized-crop boxes follow torchvision's ``RandomResizedCrop.get_params``
(ten attempts with uniform scale and log-uniform aspect ratio, then the
central-crop fallback), with ``exp`` and ``log`` evaluated by fixed polynomial
code using only IEEE-754 basic operations (correctly rounded everywhere), not by
the platform's libm or numpy's SIMD paths, whose last bits differ between
machines. ``np.random`` is never used: its algorithms carry no stability
guarantee across numpy versions.

Block shuffle (``shuffle="block"``), for datasets larger than the cache or the
RAM: a two-level order over the dataset's shards (files). The shards are put in
the order of the stable argsort of ``hash(seed, epoch, TAG_BLOCK_SHARDS,
arange(num_shards))``; consecutive groups of ``window`` shards of that order
form blocks; within a block the samples are ordered by the stable argsort of
``hash(seed, epoch, TAG_BLOCK_SAMPLES, sample_id)``. So at most ``window``
shards are live at a time, and which shards come next is known in advance
(Mosaic streaming's ``py1e`` and FFCV's ``QUASI_RANDOM`` are the same idea:
shuffle the shards, then the samples within a bounded window of them). The
result is a permutation like the global one, a pure function of ``(seed,
epoch)`` and the shards' row counts, and goes through the same rank split and
resume below.

Sharding: one global permutation per epoch. A run that has consumed ``start``
global positions serves the rest ``R = perm[start:]``; rank ``r`` of ``W``
takes positions ``r, r + W, r + 2W, ...`` of ``R`` (padded at the end by
wrapping around to the start of the epoch's permutation, or truncated, so every
rank gets the same count). Each step of ``W`` ranks consumes a contiguous block
of ``R``, so "global samples consumed" describes progress exactly and a resume
with another world size loses and repeats nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import NamedTuple

import numpy as np

__all__ = [
    "BatchPlan",
    "DEFAULT_BLOCK_WINDOW",
    "EpochOrder",
    "ORDER_VERSION",
    "SHUFFLE_MODES",
    "TAG_BLOCK_SAMPLES",
    "TAG_BLOCK_SHARDS",
    "TAG_CROP_LEFT",
    "TAG_CROP_RATIO",
    "TAG_CROP_SCALE",
    "TAG_CROP_TOP",
    "TAG_FLIP",
    "TAG_PERMUTATION",
    "block_permutation",
    "block_shards",
    "center_crop_box",
    "epoch_permutation",
    "flip_draws",
    "hash_u64",
    "random_resized_crop_boxes",
    "uniform",
]

ORDER_VERSION = 1
"""Bumped whenever any function here would return different values (part of the state fingerprint)."""

TAG_PERMUTATION = 1
TAG_FLIP = 2
TAG_CROP_SCALE = 16  # + attempt (0..9)
TAG_CROP_RATIO = 32  # + attempt (0..9)
TAG_CROP_TOP = 48
TAG_CROP_LEFT = 49
TAG_BLOCK_SHARDS = 64
TAG_BLOCK_SAMPLES = 65
CROP_ATTEMPTS = 10

PADDING_MODES = ("wrap", "drop")
SHUFFLE_MODES = (False, True, "block")
DEFAULT_BLOCK_WINDOW = 4
"""Shards whose samples are shuffled together by ``shuffle="block"`` (and live at once)."""

_G = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _S11 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(11)
_U64_MAX = (1 << 64) - 1


def _check_u64(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    value = int(value)
    if not 0 <= value <= _U64_MAX:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return value


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on a uint64 array (new array; wrap-around multiply)."""
    z = z ^ (z >> _S30)
    z *= _M1
    z ^= z >> _S27
    z *= _M2
    z ^= z >> _S31
    return z


@lru_cache(maxsize=1024)
def _stream_key(seed: int, epoch: int, tag: int) -> np.ndarray:
    """``key(seed, epoch, tag)`` as a 1-element uint64 array (cached: one per stream per epoch).

    1-element arrays rather than numpy scalars: array arithmetic wraps silently, while
    scalar arithmetic would warn about the (intended) overflow.
    """
    seed_a = np.array([_check_u64("seed", seed)], dtype=np.uint64)
    epoch_a = np.array([_check_u64("epoch", epoch)], dtype=np.uint64)
    tag_a = np.array([_check_u64("tag", tag)], dtype=np.uint64)
    return _mix(_mix(_mix(seed_a + _G) ^ (epoch_a + _G)) ^ (tag_a + _G))


def hash_u64(seed: int, epoch: int, tag, counters) -> np.ndarray:
    """``hash(seed, epoch, tag, i)`` for every ``i`` in ``counters`` (uint64 array).

    ``tag`` may be an int or an integer array; ``tag`` and ``counters`` broadcast
    (e.g. tags of shape ``(T, 1)`` with counters ``(n,)`` give ``(T, n)``).
    """
    counters = np.asarray(counters)
    if counters.dtype.kind not in "iu":
        raise TypeError(f"counters must be an integer array, got dtype {counters.dtype}")
    if counters.dtype.kind == "i" and counters.size and counters.min() < 0:
        raise ValueError("counters (sample ids) must be non-negative")
    _check_u64("seed", seed)
    _check_u64("epoch", epoch)
    if isinstance(tag, (int, np.integer)) and not isinstance(tag, bool):
        key = _stream_key(int(seed), int(epoch), int(tag))
        shape = counters.shape
    else:
        tags = np.asarray(tag)
        if tags.dtype.kind not in "iu":
            raise ValueError(f"tag must be a non-negative integer (array), got {tag!r}")
        key = np.array([_stream_key(int(seed), int(epoch), int(t))[0] for t in tags.reshape(-1)], dtype=np.uint64)
        key = key.reshape(tags.shape)
        shape = np.broadcast_shapes(tags.shape, counters.shape)
    out = _mix(_mix(counters.astype(np.uint64) + _G) ^ key)
    return out.reshape(shape)


def uniform(seed: int, epoch: int, tag, counters) -> np.ndarray:
    """Float64 draws in ``[0, 1)`` from the top 53 bits of :func:`hash_u64`."""
    return (hash_u64(seed, epoch, tag, counters) >> _S11).astype(np.float64) * (2.0**-53)


def epoch_permutation(num_samples: int, seed: int, epoch: int, *, shuffle: bool = True) -> np.ndarray:
    """The epoch's global order: int64 array of ``num_samples`` sample ids.

    ``shuffle=False`` gives ``arange(num_samples)``. Otherwise the stable argsort of
    the per-sample hashes (ties, which need a 64-bit collision, break by id).
    """
    if num_samples < 0:
        raise ValueError(f"num_samples must be >= 0, got {num_samples}")
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    keys = hash_u64(seed, epoch, TAG_PERMUTATION, np.arange(num_samples, dtype=np.uint64))
    return np.argsort(keys, kind="stable").astype(np.int64, copy=False)


def block_permutation(shard_rows, seed: int, epoch: int, window: int = DEFAULT_BLOCK_WINDOW) -> np.ndarray:
    """The epoch's block-shuffled order (see the module docstring): int64 array of every sample id once.

    ``shard_rows``: the row count of each shard, in dataset order (shard ``k``
    holds the ids ``sum(shard_rows[:k]) ..``). ``window``: shards per block (>= 1).
    """
    rows = np.asarray(shard_rows, dtype=np.int64).reshape(-1)
    if rows.size and rows.min() < 0:
        raise ValueError("shard row counts must be >= 0")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"block window must be an int >= 1, got {window!r}")
    starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    shard_keys = hash_u64(seed, epoch, TAG_BLOCK_SHARDS, np.arange(rows.shape[0], dtype=np.uint64))
    shard_order = np.argsort(shard_keys, kind="stable")
    out = np.empty(int(starts[-1]), dtype=np.int64)
    pos = 0
    for b in range(0, shard_order.shape[0], int(window)):
        block = shard_order[b : b + int(window)]
        ids = np.concatenate([np.arange(starts[k], starts[k + 1], dtype=np.int64) for k in block])
        keys = hash_u64(seed, epoch, TAG_BLOCK_SAMPLES, ids)
        out[pos : pos + ids.shape[0]] = ids[np.argsort(keys, kind="stable")]
        pos += ids.shape[0]
    return out


def block_shards(shard_rows, seed: int, epoch: int, window: int = DEFAULT_BLOCK_WINDOW) -> list[list[int]]:
    """The blocks of ``shuffle="block"``: lists of shard indices, in the order the epoch reads them."""
    n = len(shard_rows)
    keys = hash_u64(seed, epoch, TAG_BLOCK_SHARDS, np.arange(n, dtype=np.uint64))
    shard_order = [int(k) for k in np.argsort(keys, kind="stable")]
    return [shard_order[b : b + int(window)] for b in range(0, n, int(window))]


def flip_draws(seed: int, epoch: int, sample_ids, p: float) -> np.ndarray:
    """Boolean array: sample ``i`` is flipped iff ``uniform(seed, epoch, TAG_FLIP, i) < p``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"flip probability must be in [0, 1], got {p}")
    ids = np.asarray(sample_ids)
    if p == 0.0:
        return np.zeros(ids.shape, dtype=bool)
    return uniform(seed, epoch, TAG_FLIP, ids) < p


# ---- deterministic exp / log (IEEE basic operations only) -------------------------------------

_LN2 = 0.6931471805599453
_INV_LN2 = 1.4426950408889634


def _exp(x: np.ndarray) -> np.ndarray:
    """exp(x) for float64 arrays with |x| < 700, from +, -, *, / and exact scaling by 2**n.

    Accurate to a few ulp, and (what matters here) bit-identical on every platform.
    """
    n = np.rint(x * _INV_LN2)
    r = x - n * _LN2  # |r| <= ~0.35
    p = np.ones_like(r)
    for k in range(20, 0, -1):  # Horner form of the Taylor series; error term ~ 0.35**21 / 21!
        p = 1.0 + p * r / float(k)
    return np.ldexp(p, n.astype(np.int64))


def _log(x: float) -> float:
    """log(x) for a positive finite float, from frexp (exact) and an atanh series."""
    if not (x > 0.0 and math.isfinite(x)):
        raise ValueError(f"log argument must be positive and finite, got {x}")
    m, e = math.frexp(x)  # x = m * 2**e, m in [0.5, 1)
    if m < 0.7071067811865476:
        m *= 2.0
        e -= 1
    s = (m - 1.0) / (m + 1.0)  # |s| <= 0.1716
    s2 = s * s
    acc = 0.0
    for k in range(41, 0, -2):
        acc = acc * s2 + 1.0 / float(k)
    return 2.0 * s * acc + float(e) * _LN2


# ---- crops ------------------------------------------------------------------------------------


def _check_range(name: str, pair, positive: bool) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in pair)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of numbers (low, high), got {pair!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi or (positive and lo <= 0.0):
        raise ValueError(f"{name} must satisfy 0 < low <= high (finite), got {pair!r}")
    return lo, hi


def random_resized_crop_boxes(
    seed: int,
    epoch: int,
    sample_ids,
    height,
    width,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
) -> np.ndarray:
    """int32 ``(n, 4)`` boxes ``(top, left, height, width)``, one per sample id.

    ``height`` / ``width``: one image size for every sample (ints), or each
    sample's own (integer arrays of shape ``(n,)``, for images of variable size;
    a sample's box depends only on its own size).
    torchvision's ``RandomResizedCrop.get_params`` algorithm on a ``height x width``
    image: up to ten attempts of ``target_area = area * U(scale)`` and
    ``aspect = exp(U(log ratio))``, ``w = round(sqrt(target_area * aspect))``,
    ``h = round(sqrt(target_area / aspect))`` (round half to even, as Python's
    ``round``); the first attempt with ``0 < w <= width`` and ``0 < h <= height``
    wins and draws ``top`` uniformly in ``[0, height - h]`` and ``left`` in
    ``[0, width - w]``; otherwise the central-crop fallback. Attempt ``a`` of sample
    ``i`` uses tags ``TAG_CROP_SCALE + a`` and ``TAG_CROP_RATIO + a``.
    """
    ids = np.asarray(sample_ids).reshape(-1)
    n = ids.shape[0]
    height, width = _sizes(height, n), _sizes(width, n)
    if height.size and (height.min() <= 0 or width.min() <= 0):
        k = int(np.argmax((height <= 0) | (width <= 0)))
        raise ValueError(f"image size must be positive, got {int(height[k])}x{int(width[k])}")
    s_lo, s_hi = _check_range("scale", scale, positive=False)
    if s_lo < 0.0:
        raise ValueError(f"scale must be non-negative, got {scale!r}")
    r_lo, r_hi = _check_range("ratio", ratio, positive=True)
    boxes = np.empty((n, 4), dtype=np.int32)
    if n == 0:
        return boxes

    area = (height * width).astype(np.float64)
    log_lo, log_hi = _log(r_lo), _log(r_hi)
    attempts = np.arange(CROP_ATTEMPTS, dtype=np.int64)[:, None]
    u_scale = uniform(seed, epoch, TAG_CROP_SCALE + attempts, ids)  # (10, n)
    u_ratio = uniform(seed, epoch, TAG_CROP_RATIO + attempts, ids)
    target_area = area * (s_lo + u_scale * (s_hi - s_lo))
    aspect = _exp(log_lo + u_ratio * (log_hi - log_lo))
    w = np.rint(np.sqrt(target_area * aspect))
    h = np.rint(np.sqrt(target_area / aspect))
    ok = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = np.argmax(ok, axis=0)
    found = ok[first, np.arange(n)]
    cols = np.arange(n)
    h_sel = h[first, cols].astype(np.int64)
    w_sel = w[first, cols].astype(np.int64)
    u_top = uniform(seed, epoch, TAG_CROP_TOP, ids)
    u_left = uniform(seed, epoch, TAG_CROP_LEFT, ids)
    # floor(u * count) with u < 1 stays in [0, count - 1]; exact for counts < 2**53.
    top = np.floor(u_top * (height - h_sel + 1)).astype(np.int64)
    left = np.floor(u_left * (width - w_sel + 1)).astype(np.int64)

    fb_top, fb_left, fb_h, fb_w = _fallback_boxes(height, width, r_lo, r_hi)
    boxes[:, 0] = np.where(found, top, fb_top)
    boxes[:, 1] = np.where(found, left, fb_left)
    boxes[:, 2] = np.where(found, h_sel, fb_h)
    boxes[:, 3] = np.where(found, w_sel, fb_w)
    return boxes


def _sizes(size, n: int) -> np.ndarray:
    """An image side for each of ``n`` samples as int64 ``(n,)``: one int broadcast, or an array of n."""
    arr = np.asarray(size)
    if arr.ndim == 0:
        return np.full(n, int(arr), dtype=np.int64)
    if arr.dtype.kind not in "iu" or arr.shape != (n,):
        raise ValueError(f"image sizes must be an int or an integer array of shape ({n},), got {arr.dtype} {arr.shape}")
    return arr.astype(np.int64)


def _fallback_boxes(
    height: np.ndarray, width: np.ndarray, r_lo: float, r_hi: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """torchvision's central-crop fallback after ten failed attempts, per sample (Python's round: half to even)."""
    hf, wf = height.astype(np.float64), width.astype(np.float64)
    in_ratio = wf / hf
    narrow, wide = in_ratio < r_lo, in_ratio > r_hi
    w = np.where(narrow, width, np.where(wide, np.rint(hf * r_hi).astype(np.int64), width))
    h = np.where(narrow, np.rint(wf / r_lo).astype(np.int64), height)
    return (height - h) // 2, (width - w) // 2, h, w


def center_crop_box(height: int, width: int, crop_height: int, crop_width: int) -> np.ndarray:
    """int32 ``(4,)`` box ``(top, left, crop_height, crop_width)`` centred as torchvision's CenterCrop."""
    if not (0 < crop_height <= height and 0 < crop_width <= width):
        raise ValueError(
            f"center crop {crop_height}x{crop_width} must be positive and fit the {height}x{width} image"
        )
    top = int(round((height - crop_height) / 2.0))
    left = int(round((width - crop_width) / 2.0))
    return np.array([top, left, crop_height, crop_width], dtype=np.int32)


# ---- epoch order, sharding and batch plans ----------------------------------------------------


class BatchPlan(NamedTuple):
    """One batch of one rank: what to load and where the stream stands after it."""

    epoch: int
    number: int  # batch number within this pass (0-based)
    sample_ids: np.ndarray  # int64, contiguous
    consumed: int  # global samples consumed in the epoch once every rank has taken this step
    last: bool  # the last batch of the epoch for this rank


@dataclass(frozen=True)
class EpochOrder:
    """The rest of one epoch as seen by one rank.

    ``start`` is the number of global positions of the epoch's permutation already
    consumed (by all ranks together). See the module docstring for the sharding rule.
    """

    num_samples: int
    seed: int
    epoch: int
    shuffle: bool | str = True
    world_size: int = 1
    rank: int = 0
    padding: str = "wrap"
    start: int = 0
    shard_rows: tuple[int, ...] | None = None  # shuffle="block": the rows of each shard
    block_window: int = DEFAULT_BLOCK_WINDOW
    # With a subset: the dataset row of every stream position (what ``dataset_rows`` maps through).
    rows: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.shuffle not in SHUFFLE_MODES:
            raise ValueError(f'shuffle must be True, False or "block", got {self.shuffle!r}')
        if self.shuffle == "block":
            if self.shard_rows is None or sum(self.shard_rows) != self.num_samples:
                raise ValueError('shuffle="block" needs shard_rows that add up to num_samples')
        if self.num_samples < 0:
            raise ValueError(f"num_samples must be >= 0, got {self.num_samples}")
        _check_u64("seed", self.seed)
        _check_u64("epoch", self.epoch)
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        if self.padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {PADDING_MODES}, got {self.padding!r}")
        if not 0 <= self.start <= self.num_samples:
            raise ValueError(f"start must be in [0, {self.num_samples}], got {self.start}")

    @cached_property
    def permutation(self) -> np.ndarray:
        """The whole epoch's global order (int64)."""
        if self.shuffle == "block":
            return block_permutation(self.shard_rows, self.seed, self.epoch, self.block_window)
        return epoch_permutation(self.num_samples, self.seed, self.epoch, shuffle=self.shuffle)

    @property
    def remaining(self) -> int:
        """Global positions left in the epoch."""
        return self.num_samples - self.start

    @cached_property
    def padded_sequence(self) -> np.ndarray:
        """The rest of the epoch, padded or truncated to a multiple of ``world_size``."""
        rest = self.permutation[self.start :]
        extra = rest.shape[0] % self.world_size
        if extra == 0:
            return rest
        if self.padding == "drop":
            return rest[: rest.shape[0] - extra]
        pad = self.world_size - extra
        # Wrap around to the start of the epoch's permutation (cyclically, if the epoch is tiny).
        wrapped = np.resize(self.permutation, pad) if self.num_samples else np.empty(0, np.int64)
        return np.concatenate([rest, wrapped])

    @cached_property
    def indices(self) -> np.ndarray:
        """This rank's sample ids for the rest of the epoch (contiguous int64)."""
        return np.ascontiguousarray(self.padded_sequence[self.rank :: self.world_size])

    @property
    def dataset_rows(self) -> np.ndarray:
        """The dataset rows this rank reads in the rest of the epoch, in order (``indices`` without a subset)."""
        return self.indices if self.rows is None else np.ascontiguousarray(self.rows[self.indices])

    def num_batches(self, batch_size: int, drop_last: bool) -> int:
        n = self.indices.shape[0]
        return n // batch_size if drop_last else -(-n // batch_size)

    def batches(self, batch_size: int, drop_last: bool) -> Iterator[BatchPlan]:
        """This rank's batches for the rest of the epoch.

        ``consumed`` of batch ``k`` is ``start + min((k + 1) * batch_size * world_size,
        remaining)``: every rank is assumed to take its batches in lockstep (as in
        data-parallel training), so any rank's count describes global progress.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        ids = self.indices
        count = self.num_batches(batch_size, drop_last)
        step = batch_size * self.world_size
        for k in range(count):
            chunk = ids[k * batch_size : (k + 1) * batch_size]
            consumed = self.start + min((k + 1) * step, self.remaining)
            yield BatchPlan(self.epoch, k, chunk, consumed, k == count - 1)
