"""Mix: several datasets interleaved by weight, with a deterministic schedule, exact resume and sharding.

``Mix([a, b, c], weights=(0.5, 0.3, 0.2), epoch_size=n, batch_size=B)`` is a
loader whose epoch is ``n`` samples drawn from the sources in the given
proportions. The sources are map-style datasets (``len(ds)`` and
``ds.get_batch(positions)``: :class:`~tbl_loader.PyTreeDataset`,
:class:`~tbl_loader.ImageDataset`) or loaders, which are replaced by their
map-style twin (an ImageLoader by ``ImageDataset.from_loader``, a PyTreeLoader
by a ``PyTreeDataset`` of its path, leaves, var mode and subset). A loader
source contributes its samples (data, augmentation, subset, fields), not its
``transform``: transform the Mix's batches instead.

The schedule of epoch ``e`` is a pure function of ``(seed, e)`` (the rules are
exact, so they can be re-implemented):

- counts: source ``i`` gets ``floor(w_i * n)`` samples plus one for the
  ``n - sum(floor)`` sources with the largest remainders (ties: lower ``i``),
  with ``w`` the weights normalized to sum 1: the realized proportions are
  exact to one sample;
- interleave: the sequence ``[0] * c_0 + [1] * c_1 + ...`` permuted by
  ``epoch_permutation(n, mix_seed, e)`` (:mod:`tbl_loader.stream.order`;
  ``mix_seed = hash_u64(seed, 0, TAG_MIX, 0)``): position ``p`` of the epoch
  takes a sample from source ``src[p]``;
- samples: the ``k``-th draw of source ``i`` in epoch ``e`` is its draw number
  ``g = e * c_i + k`` over the whole run; it reads position
  ``epoch_permutation(N_i, seed_i, g // N_i)[g % N_i]`` of the source
  (``N_i = len(source i)``, ``seed_i = hash_u64(seed, 0, TAG_MIX, i + 1)``):
  every source is walked through whole permutations, one after the other,
  however the mix epochs cut them, so a sample repeats only after all of its
  source has been seen (more often when its weight asks for it). An
  :class:`~tbl_loader.ImageDataset` source draws its augmentation with epoch
  ``g // N_i``.

Position, resume and sharding are a :class:`~tbl_loader.stream.StreamCursor` over the
``n`` schedule positions (``shuffle=False``: the schedule is already random),
the same code as every loader: ``state_dict()`` is ``(seed, epoch, consumed)``
plus fingerprints of the sources and of the mix settings; resuming yields
exactly the rest of the epoch, also with another world size or batch size.
Nothing is counted per source or per worker, so there is no per-source counter
to overflow or to lose (the failures reported for litdata's
``CombinedStreamingDataset``, e.g. ``num_samples_yielded`` larger than a
dataset after more than one epoch, and for resuming at an epoch's last sample).

Image sources must agree on what a batch holds (view shapes, dtype, backend, label
and field kinds; fixed- and variable-size storage mix once cropped to one size):
a disagreement is a :class:`~tbl_loader.errors.MixError` at construction, naming it.

A batch is the sources' batches for its positions, concatenated in schedule
order: arrays and tensors along the first axis, lists joined, dicts / tuples /
``Batch`` leaf by leaf (``Padded`` leaves have per-batch widths: use
``var="list"`` sources). An image batch (:class:`~tbl_loader.Batch`) carries ``batch.sources``, the int64 source index of
every sample (a tensor on a torch batch); ``return_sources=True`` yields ``(batch, sources)`` with
``sources`` as a numpy array, for every kind of source.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .errors import MixError
from .host.batch import Batch
from .host.pipeline import refuse_dataloader_workers
from .host.producer import Producer
from .image.loader import ImageLoader
from .image.torch_dataset import EpochBatch, ImageDataset
from .pytree.batch import Padded
from .pytree.dataset import PyTreeDataset
from .pytree.loader import PyTreeLoader
from .stream import order
from .stream.cursor import Resumable, StreamCursor, StreamOptions
from .stream.order import BatchPlan

__all__ = ["TAG_MIX", "Mix", "mix_counts", "mix_schedule"]

TAG_MIX = 67
"""Stream tag of the mix seeds (tags below 64 are :mod:`tbl_loader.stream.order`'s)."""


def _seed(seed: int, k: int) -> int:
    return int(order.hash_u64(seed, 0, TAG_MIX, np.array([k], np.uint64))[0])


def mix_counts(weights: Sequence[float], epoch_size: int) -> np.ndarray:
    """Samples per source in one epoch (largest remainders; see the module docstring)."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    exact = w * epoch_size
    counts = np.floor(exact).astype(np.int64)
    short = epoch_size - int(counts.sum())
    if short:
        remainder = exact - counts
        counts[np.argsort(-remainder, kind="stable")[:short]] += 1
    return counts


def mix_schedule(seed: int, epoch: int, counts: np.ndarray, sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray,
                                                                                              np.ndarray]:
    """Epoch ``epoch``'s schedule: ``(source, position, source_epoch)`` int64 arrays of ``sum(counts)`` entries."""
    n = int(counts.sum())
    labels = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    src = labels[order.epoch_permutation(n, _seed(seed, 0), epoch)]
    pos = np.empty(n, np.int64)
    src_epoch = np.empty(n, np.int64)
    for i, (count, size) in enumerate(zip(counts.tolist(), sizes, strict=True)):
        where = np.flatnonzero(src == i)  # the k-th draw of source i is its k-th position in the schedule
        g = epoch * count + np.arange(count, dtype=np.int64)
        ep = g // size
        at = g % size
        out = np.empty(count, np.int64)
        for e in np.unique(ep).tolist():  # at most a few source epochs per mix epoch
            sel = ep == e
            out[sel] = order.epoch_permutation(size, _seed(seed, i + 1), e)[at[sel]]
        pos[where] = out
        src_epoch[where] = ep
    return src, pos, src_epoch


def _map_style(source: Any) -> Any:
    """A source as a map-style dataset (loaders become their map-style twin)."""
    if isinstance(source, ImageLoader):
        return ImageDataset.from_loader(source)
    if isinstance(source, PyTreeLoader):
        return PyTreeDataset(source.path, fields=source.leaf_paths, var=source.collator.var_mode,
                             rows=source.cursor.rows)
    if not (hasattr(source, "__len__") and callable(getattr(source, "get_batch", None))):
        raise MixError(f"a Mix source is a map-style dataset (len, get_batch) or a loader, got {type(source).__name__}")
    if not isinstance(getattr(source, "fingerprint", None), str):
        # A state names its sources by fingerprint: without one, another Mix's state would load silently.
        raise MixError(f"a Mix source needs a str fingerprint (its data's identity, checked on resume); "
                       f"{type(source).__name__} has none")
    return source


def _check_alike(sources: list[Any]) -> None:
    """Image sources whose batches cannot be joined (another view shape, dtype, backend, label or field kind;
    fixed- and variable-size storage alike once cropped to one size) refused now, naming the difference,
    instead of failing at the first batch."""
    images = [k for k, s in enumerate(sources) if isinstance(s, ImageDataset)]
    if images and len(images) != len(sources):
        other = next(k for k in range(len(sources)) if k not in images)
        raise MixError(f"source {other} ({type(sources[other]).__name__}) cannot be mixed with image source "
                       f"{images[0]}: their batches have other structures")
    for k in images[1:]:
        first, this = sources[images[0]].signature, sources[k].signature
        for key in first:
            if first[key] != this[key]:
                raise MixError(f"source {k} serves {key} {this[key]!r}, source {images[0]} {first[key]!r}: the "
                               f"sources of a Mix must agree on it (for images, crop every source to one size "
                               f"with random_resized_crop or center_crop)")


class Mix(Resumable):
    """Interleave ``sources`` by ``weights`` over epochs of ``epoch_size`` samples (see the module docstring).

    ``epoch_size`` defaults to the sum of the sources' lengths. ``batch_size``,
    ``seed``, ``drop_last``, ``rank`` / ``world_size``, ``padding`` and ``prefetch``
    (batches made ahead on a producer thread; 0: none) as in the other loaders.
    """

    def __init__(self, sources: Sequence[Any], *, weights: Sequence[float] | None = None,
                 epoch_size: int | None = None, batch_size: int, seed: int = 0, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None, padding: str = "wrap",
                 prefetch: int = 2, return_sources: bool = False) -> None:
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence) or not sources:
            raise MixError("sources must be a non-empty sequence of datasets or loaders")
        self.sources = [_map_style(s) for s in sources]
        # The map-style twins made here from loaders are this Mix's to close; given datasets are the caller's.
        self._owned = [m for m, s in zip(self.sources, sources, strict=True) if m is not s]
        _check_alike(self.sources)
        self.sizes = [len(s) for s in self.sources]
        if min(self.sizes) < 1:
            raise MixError(f"every source needs at least one sample, got sizes {self.sizes}")
        if weights is None:
            weights = self.sizes
        w = [float(x) for x in weights]
        if len(w) != len(self.sources) or not all(np.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
            raise MixError(f"weights must be {len(self.sources)} finite non-negative numbers with a positive sum, "
                           f"got {list(weights)}")
        self.weights = tuple(x / sum(w) for x in w)
        epoch_size = sum(self.sizes) if epoch_size is None else epoch_size
        if isinstance(epoch_size, bool) or not isinstance(epoch_size, (int, np.integer)) or epoch_size < 1:
            raise MixError(f"epoch_size must be an int >= 1, got {epoch_size!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        self.epoch_size = int(epoch_size)
        self.counts = mix_counts(self.weights, self.epoch_size)
        self.prefetch = prefetch
        self.return_sources = bool(return_sources)
        options = StreamOptions(batch_size, shuffle=False, seed=seed, drop_last=drop_last, rank=rank,
                                world_size=world_size, padding=padding)
        fingerprint = hashlib.sha256(json.dumps(
            [s.fingerprint for s in self.sources]).encode()).hexdigest()[:32]
        self.cursor = StreamCursor(self.epoch_size, options, dataset_fingerprint=fingerprint,
                                   settings={"mix": {"weights": list(self.weights), "sizes": self.sizes,
                                                      "epoch_size": self.epoch_size}})
        self._schedule: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._producer: Producer | None = None
        self.cursor.on_jump(self._stop)

    def schedule(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(source, position, source_epoch)`` of every position of epoch ``epoch`` (cached per epoch)."""
        if self._schedule is None or self._schedule[0] != epoch:
            self._schedule = (epoch, mix_schedule(self.cursor.options.seed, epoch, self.counts, self.sizes))
        return self._schedule[1]

    def _stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.close()

    def __iter__(self) -> Iterator[Any]:
        refuse_dataloader_workers(self)
        self._stop()
        started = self.cursor.start_pass()
        if started is None:
            return iter(())
        _, plans = started
        epoch = self.cursor.epoch
        schedule = self.schedule(epoch)
        sources = list(self.sources)
        self._producer = Producer(lambda: ((plan, _make(sources, schedule, plan)) for plan in plans), self.prefetch,
                                  name="tbl-loader-mix")
        return self._consume(self._producer)

    def _consume(self, producer: Producer) -> Iterator[Any]:
        try:
            for plan, (batch, src) in producer:
                self.cursor.advance(plan)
                yield (batch, src) if self.return_sources else batch
        finally:
            producer.close()

    def close(self) -> None:
        """Stop the producer and close the map-style twins made from loaders (given datasets stay open)."""
        self._stop()
        for source in self._owned:
            source.close()


def _make(sources: list[Any], schedule: tuple[np.ndarray, np.ndarray, np.ndarray],
          plan: BatchPlan) -> tuple[Any, np.ndarray]:
    """One batch: each source's samples of the plan (one get_batch per source and source epoch), joined."""
    src_all, pos_all, ep_all = schedule
    ids = plan.sample_ids
    src, pos, ep = src_all[ids], pos_all[ids], ep_all[ids]
    parts, where = [], []
    for i in np.unique(src).tolist():
        for e in np.unique(ep[src == i]).tolist():
            sel = np.flatnonzero((src == i) & (ep == e))
            parts.append(sources[i].get_batch(EpochBatch(pos[sel].tolist(), e)))
            where.append(sel)
    placement = np.concatenate(where)
    inverse = np.empty_like(placement)
    inverse[placement] = np.arange(placement.shape[0])
    batch = _join(parts, inverse)
    if isinstance(batch, Batch):  # the source of every sample, beside its row (indices), on the same backend
        batch.sources = _like(src.copy(), batch.indices)
    return batch, src


def _like(values: np.ndarray, reference: Any) -> Any:
    """``values`` as a torch tensor when ``reference`` is one, else as they are."""
    if type(reference).__module__.startswith("torch"):
        import torch  # a torch batch

        return torch.from_numpy(values)
    return values


def _join(parts: list[Any], inverse: np.ndarray) -> Any:
    """Concatenate batch parts leaf by leaf, then put the rows in schedule order (``inverse``)."""
    first = parts[0]
    if isinstance(first, Batch):  # field by field (views, labels, indices, keys, fields, crop boxes, ...)
        joined = {f.name: _join([getattr(p, f.name) for p in parts], inverse) for f in dataclasses.fields(Batch)}
        views = joined.pop("views")
        return Batch(views[0], views=views, **joined)
    if isinstance(first, Padded):
        raise MixError("Padded leaves cannot be joined across sources (their widths differ): use var='list'")
    if isinstance(first, dict):
        return {k: _join([p[k] for p in parts], inverse) for k in first}
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_join([p[j] for p in parts], inverse) for j in range(len(first))))
    if isinstance(first, tuple):
        return tuple(_join([p[j] for p in parts], inverse) for j in range(len(first)))
    if isinstance(first, list):
        joined = [v for p in parts for v in p]
        return [joined[j] for j in inverse.tolist()]
    if isinstance(first, np.ndarray):
        return np.concatenate(parts)[inverse] if len(parts) > 1 else first[inverse]
    if type(first).__module__.startswith("torch"):
        import torch  # a torch batch: its parts are tensors

        index = torch.from_numpy(inverse)
        return (torch.cat(parts) if len(parts) > 1 else first)[index]
    if first is None:
        return None
    raise MixError(f"cannot join batch values of type {type(first).__name__}")
