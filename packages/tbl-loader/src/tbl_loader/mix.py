"""Mix: several datasets interleaved by weight, with a deterministic schedule, exact resume and sharding.

``Mix([a, b, c], weights=(0.5, 0.3, 0.2), epoch_size=n, batch_size=B)`` is a
loader whose epoch is ``n`` samples drawn from the sources in the given
proportions. The sources are map-style datasets (``len(ds)`` and
``ds.get_batch(positions)``: :class:`~tbl_loader.PyTreeDataset`,
:class:`~tbl_loader.ImageDataset`) or loaders, which are replaced by their
map-style twin (an ImageLoader by ``ImageDataset.from_loader``, a TokenLoader by
``TokenDataset.from_loader``: its windows or packed rows, with their boundary fields, a PyTreeLoader
by ``PyTreeDataset.from_loader``: its path, cache and storage options, leaves, var mode and subset). A loader
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
  ``g // N_i``, a :class:`~tbl_loader.TokenDataset` its window offset.

Schedules (``weights=Schedule.linear([(0, w0), (1000, w1)])``, :mod:`tbl_loader.stream.schedule`):
the weights are a function of the step, step ``s`` being the run's global positions
``[s * K, s * K + K)`` (``K = step_samples``, default ``batch_size * world_size``; a run's global position
is ``t = e * n + p``). ``C_i(t)``, the integral of source ``i``'s weight over positions ``[0, t)``, is
what the schedule asks of it before ``t``. Two modes decide which source serves each position:

- ``mode="smooth"`` (the default with a schedule): draw ``k`` of source ``i`` (``k = 0, 1, ...`` over the
  run) has the value ``V = k + u``, ``u = ((hash_u64(seed, i, TAG_MIX_JITTER, k) >> 11) + 0.5) / 2**53``,
  and the time ``tau = C_i^{-1}(V)`` (the inverse of a quadratic within a linear segment: ``x = 2d / (A +
  sqrt(A^2 + 2 M d))``); every source's draws together, sorted by ``(tau, i)``, are served in that order,
  the one of rank ``t`` at position ``t``. Any prefix of the run holds ``C_i(t)`` samples of source ``i``
  to within about ``1 + w_i * S`` (``S`` sources), mid-ramp included, and position ``t`` is computed from
  the draws with ``tau`` within ``S`` of ``t``: no state is counted while serving.
- ``mode="epoch"`` (exact counts per epoch; the default with plain weights, whose rule above it is):
  epoch ``e``'s counts are :func:`mix_counts` of the epoch's mean weights
  ``(C_i((e + 1) n) - C_i(e n)) / n``, permuted as above; the draws of source ``i`` in epoch ``e`` start at
  ``sum(c_i(e') for e' < e)``.

Either way, draw ``g`` of source ``i`` reads the sample given in the rule for samples above. The state
of a Mix with a schedule (or in smooth mode) carries ``mix_schedule``: the schedule's ``hash``, its origin
and every source's draws before the saved position. Loading a state saved under another schedule
raises :class:`~tbl_loader.errors.ScheduleChangedError`, unless
``load_state_dict(state, accept_schedule_change=True)``: this Mix's schedule then applies from the saved
position ``t_o`` on, with the saved draws ``D`` as the start (draw ``k >= D_i`` has the value
``C_i(t_o) + (k - D_i) + u``, ranks count from ``t_o``; in epoch mode only at an epoch's start). Nothing
served before ``t_o`` changes and no source repeats or skips a sample. ``mix.proportions(last_steps)``
gives the observed and requested shares of the run so far (or its last steps), at any time, and
``mix.draws_before(t)`` each source's samples before position ``t``.

``step_samples`` is part of the state's settings: to resume with another batch size or world size, pass
it explicitly (the default, ``batch_size * world_size``, changes with them).

A Mix has one producer thread and no per-source pool, whatever its number of sources; a batch reads each
source present in it once (one ``get_batch`` per source and source epoch, grouped by one sort). Smooth mode
assigns run positions in chunks of ``SMOOTH_CHUNK`` as batches reach them (a few kept); epoch mode makes an
epoch's assignment at once (its permutation needs all of it).

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
a disagreement is a :class:`~tbl_loader.errors.MixError` at construction, naming it. Token
sources likewise (``seq_len``, dtype, backend, boundary fields), and a token source mixes only with
token sources.

A batch is the sources' batches for its positions, concatenated in schedule
order: arrays and tensors along the first axis, lists joined, dicts / tuples /
``Batch`` / ``PyTreeBatch`` / ``TokenBatch`` leaf by leaf (``Padded`` leaves have per-batch widths: use
``var="list"`` sources). Every batch (:class:`~tbl_loader.Batch`, :class:`~tbl_loader.PyTreeBatch`,
:class:`~tbl_loader.TokenBatch`) carries ``batch.indices``, each sample's row in its source, and
``batch.sources``, the int64 source index of every sample (tensors on a torch batch);
``return_sources=True`` yields ``(batch, sources)`` pairs instead, ``sources`` a numpy array (what a
source of bare-value samples needs).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .errors import MixError, ScheduleChangedError
from .host.batch import Batch, PyTreeBatch, pytree_batch
from .host.pipeline import refuse_dataloader_workers
from .host.producer import Producer
from .image.loader import ImageLoader
from .image.torch_dataset import EpochBatch, ImageDataset
from .pytree.batch import Padded
from .pytree.dataset import PyTreeDataset
from .pytree.loader import PyTreeLoader
from .source.storage import is_url
from .stream import order
from .stream.cursor import Resumable, StreamCursor, StreamOptions
from .stream.order import BatchPlan
from .stream.schedule import Schedule, Timeline, mix_counts
from .tokens.batch import TokenBatch
from .tokens.dataset import TokenDataset
from .tokens.loader import TokenLoader

__all__ = ["MIX_MODES", "TAG_MIX", "Mix", "Schedule", "mix_counts", "mix_schedule"]

MIX_MODES = ("epoch", "smooth")
SMOOTH_CHUNK = 1 << 16
"""Run positions a smooth-mode chunk holds (computed as the batches reach them)."""

READ_AHEAD_BATCHES = 16
"""Batches whose samples a Mix with a source at a URL hands to its sources before reading them."""

TAG_MIX = 67
"""Stream tag of the mix seeds (tags below 64 are :mod:`tbl_loader.stream.order`'s)."""


def _seed(seed: int, k: int) -> int:
    return int(order.hash_u64(seed, 0, TAG_MIX, np.array([k], np.uint64))[0])


def mix_schedule(seed: int, epoch: int, counts: np.ndarray, sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray,
                                                                                              np.ndarray]:
    """Epoch ``epoch``'s schedule under constant ``counts``: ``(source, position, source_epoch)`` int64 arrays of
    ``sum(counts)`` entries."""
    return _epoch_assignment(seed, epoch, counts, epoch * np.asarray(counts, np.int64), sizes)


def _epoch_assignment(seed: int, epoch: int, counts: np.ndarray, drawn: np.ndarray,
                      sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Epoch mode: ``counts[i]`` samples of source ``i``, permuted by the epoch; its draws start at ``drawn[i]``."""
    n = int(counts.sum())
    labels = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    src = labels[order.epoch_permutation(n, _seed(seed, 0), epoch)]
    draws = np.empty(n, np.int64)
    for i, count in enumerate(counts.tolist()):
        draws[src == i] = int(drawn[i]) + np.arange(count, dtype=np.int64)  # the k-th draw: k-th position
    pos, src_epoch = _source_positions(seed, src, draws, sizes)
    return src, pos, src_epoch


def _source_positions(seed: int, src: np.ndarray, draws: np.ndarray,
                      sizes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Position and source epoch of every draw: draw ``g`` of source ``i`` reads
    ``epoch_permutation(N_i, seed_i, g // N_i)[g % N_i]``."""
    pos = np.empty(src.shape[0], np.int64)
    src_epoch = np.empty(src.shape[0], np.int64)
    for i in np.unique(src).tolist():
        where = np.flatnonzero(src == i)
        g = draws[where]
        size = sizes[i]
        ep, at = g // size, g % size
        out = np.empty(where.shape[0], np.int64)
        for e in np.unique(ep).tolist():  # at most a few source epochs per mix epoch
            sel = ep == e
            out[sel] = order.epoch_permutation(size, _seed(seed, i + 1), e)[at[sel]]
        pos[where] = out
        src_epoch[where] = ep
    return pos, src_epoch


def _map_style(source: Any) -> Any:
    """A source as a map-style dataset (loaders become their map-style twin)."""
    if isinstance(source, ImageLoader):
        return ImageDataset.from_loader(source)
    if isinstance(source, TokenLoader):
        return TokenDataset.from_loader(source)
    if isinstance(source, PyTreeLoader):
        return PyTreeDataset.from_loader(source)
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
    tokens = [k for k, s in enumerate(sources) if isinstance(s, TokenDataset)]
    if tokens and len(tokens) != len(sources):
        other = next(k for k in range(len(sources)) if k not in tokens)
        raise MixError(f"source {other} ({type(sources[other]).__name__}) cannot be mixed with token source "
                       f"{tokens[0]}: their batches have other structures")
    for k in tokens[1:]:
        first, this = sources[tokens[0]].signature, sources[k].signature
        for key in first:
            if first[key] != this[key]:
                raise MixError(f"source {k} serves {key} {this[key]!r}, source {tokens[0]} {first[key]!r}: the "
                               f"token sources of a Mix must agree on it")
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

    ``weights``: one weight per source (default: the sources' lengths), or a
    :class:`~tbl_loader.stream.schedule.Schedule` (weights as a function of the step). ``mode``: ``"epoch"``
    (exact counts per epoch; the default for plain weights) or ``"smooth"`` (the weights followed position by
    position; the default for a schedule). ``step_samples``: global samples a step (default ``batch_size *
    world_size``), the unit of a schedule's steps. ``epoch_size`` defaults to the sum of the sources' lengths.
    ``batch_size``, ``seed``, ``drop_last``, ``rank`` / ``world_size``, ``padding`` and ``prefetch``
    (batches made ahead on one producer thread, whatever the number of sources; 0: none) as in the other loaders.
    """

    def __init__(self, sources: Sequence[Any], *, weights: Sequence[float] | Schedule | None = None,
                 epoch_size: int | None = None, batch_size: int, seed: int = 0, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None, padding: str = "wrap",
                 prefetch: int = 2, return_sources: bool = False, mode: str | None = None,
                 step_samples: int | None = None) -> None:
        if isinstance(sources, (str, bytes)) or not isinstance(sources, Sequence) or not sources:
            raise MixError("sources must be a non-empty sequence of datasets or loaders")
        if mode is not None and mode not in MIX_MODES:
            raise MixError(f"mode must be one of {MIX_MODES}, got {mode!r}")
        self.sources = [_map_style(s) for s in sources]
        # The map-style twins made here from loaders are this Mix's to close; given datasets are the caller's.
        self._owned = [m for m, s in zip(self.sources, sources, strict=True) if m is not s]
        _check_alike(self.sources)
        self.sizes = [len(s) for s in self.sources]
        if min(self.sizes) < 1:
            raise MixError(f"every source needs at least one sample, got sizes {self.sizes}")
        if isinstance(weights, Schedule):
            if weights.num_sources != len(self.sources):
                raise MixError(f"the schedule has weights for {weights.num_sources} sources, the Mix has "
                               f"{len(self.sources)}")
            self.weight_schedule = weights
            self.weights = None
        else:
            if weights is None:
                weights = self.sizes
            w = [float(x) for x in weights]
            if len(w) != len(self.sources) or not all(np.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
                raise MixError(f"weights must be {len(self.sources)} finite non-negative numbers with a positive "
                               f"sum, got {list(weights)}")
            self.weights = tuple(x / sum(w) for x in w)
            self.weight_schedule = Schedule.constant(self.weights)
        self.mode = mode if mode is not None else ("epoch" if self.weights is not None else "smooth")
        epoch_size = sum(self.sizes) if epoch_size is None else epoch_size
        if isinstance(epoch_size, bool) or not isinstance(epoch_size, (int, np.integer)) or epoch_size < 1:
            raise MixError(f"epoch_size must be an int >= 1, got {epoch_size!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        self.epoch_size = int(epoch_size)
        self.counts = mix_counts(self.weights, self.epoch_size) if self.weights is not None else None
        self.prefetch = prefetch
        self.return_sources = bool(return_sources)
        options = StreamOptions(batch_size, shuffle=False, seed=seed, drop_last=drop_last, rank=rank,
                                world_size=world_size, padding=padding)
        if step_samples is None:
            step_samples = options.batch_size * options.world_size
        if isinstance(step_samples, bool) or not isinstance(step_samples, (int, np.integer)) or step_samples < 1:
            raise MixError(f"step_samples must be an int >= 1, got {step_samples!r}")
        self.step_samples = int(step_samples)
        fingerprint = hashlib.sha256(json.dumps(
            [s.fingerprint for s in self.sources]).encode()).hexdigest()[:32]
        # Plain weights in epoch mode: the settings of every earlier Mix (their states stay valid). Otherwise the
        # schedule is checked by its hash, apart from the settings, so that a change can be named and accepted.
        self._scheduled = self.weights is None or self.mode != "epoch"
        if self._scheduled:
            settings = {"mode": self.mode, "step_samples": self.step_samples, "sizes": self.sizes,
                        "epoch_size": self.epoch_size}
        else:
            settings = {"weights": list(self.weights), "sizes": self.sizes, "epoch_size": self.epoch_size}
        self.cursor = StreamCursor(self.epoch_size, options, dataset_fingerprint=fingerprint,
                                   settings={"mix": settings})
        self.timeline = Timeline(self.weight_schedule, self.step_samples, options.seed)
        self._schedule: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._chunks: dict[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray, int]] = {}
        self._producer: Producer | None = None
        self.cursor.on_jump(self._stop)

    def schedule(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(source, position, source_epoch)`` of every position of epoch ``epoch`` (epoch mode: cached per epoch;
        smooth mode: made here, while iterating reads only the chunks of positions it serves)."""
        if self.mode == "smooth":
            return self.lookup(epoch, np.arange(self.epoch_size, dtype=np.int64))
        if self._schedule is None or self._schedule[0] != epoch:
            line, n = self.timeline, self.epoch_size
            if epoch * n < line.origin:
                raise MixError(f"epoch {epoch} lies before the schedule's origin (position {line.origin})")
            self._schedule = (epoch, _epoch_assignment(self.cursor.options.seed, epoch, line.epoch_counts(epoch, n),
                                                       line.epoch_draws(epoch, n), self.sizes))
        return self._schedule[1]

    def lookup(self, epoch: int, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(source, position, source_epoch)`` of positions ``ids`` of epoch ``epoch``.

        Smooth mode computes chunks of ``SMOOTH_CHUNK`` run positions as batches reach them (a few kept), so
        memory does not grow with ``epoch_size``. In the epoch holding the schedule's origin, a position
        ``p`` before it (served under the earlier schedule; only wrap padding reads it again) takes the draw
        of position ``origin + (p - e * n) % ((e + 1) * n - origin)``."""
        if self.mode == "epoch":
            src, pos, ep = self.schedule(epoch)
            return src[ids], pos[ids], ep[ids]
        n, origin = self.epoch_size, self.timeline.origin
        t = epoch * n + np.asarray(ids, np.int64)
        if (epoch + 1) * n <= origin:
            raise MixError(f"epoch {epoch} lies before the schedule's origin (position {origin})")
        early = t < origin
        if early.any():
            t = np.where(early, origin + (t - epoch * n) % ((epoch + 1) * n - origin), t)
        out = tuple(np.empty(t.shape[0], np.int64) for _ in range(3))
        chunk = t // SMOOTH_CHUNK
        for c in np.unique(chunk).tolist():
            sel = np.flatnonzero(chunk == c)
            arrays = self._chunk(c)
            for k in range(3):
                out[k][sel] = arrays[k][t[sel] - arrays[3]]
        return out

    def _chunk(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """Smooth mode: ``(source, position, source_epoch, first)`` of run positions ``[first, (c + 1) * CHUNK)``
        (``first``: the chunk's start, or the origin when it lies inside)."""
        key = (id(self.timeline), c)
        found = self._chunks.get(key)
        if found is None:
            first = max(c * SMOOTH_CHUNK, self.timeline.origin)
            src, draws, _ = self.timeline.window(first, (c + 1) * SMOOTH_CHUNK)
            pos, src_epoch = _source_positions(self.cursor.options.seed, src, draws, self.sizes)
            found = (src, pos, src_epoch, first)
            self._chunks[key] = found
            while len(self._chunks) > 4:  # the producer reads forward: a few chunks are plenty
                self._chunks.pop(next(iter(self._chunks)))
        return found

    # ---- where the run stands ------------------------------------------------------------------
    @property
    def position(self) -> int:
        """Global samples of the run consumed so far (all ranks): ``epoch * epoch_size + consumed``."""
        return self.cursor.epoch * self.epoch_size + self.cursor.consumed

    def draws_before(self, position: int) -> np.ndarray:
        """Samples each source served before global position ``position`` (computed from the schedule, which
        decides every position: nothing is counted while serving)."""
        line, n = self.timeline, self.epoch_size
        if position < line.origin:
            raise MixError(f"position {position} lies before the schedule's origin ({line.origin})")
        if self.mode == "smooth":
            return line.window(position, position)[2]
        epoch, at = divmod(position, n)
        src = self.schedule(epoch)[0] if at else np.empty(0, np.int64)
        return line.epoch_draws(epoch, n) + np.bincount(src[:at], minlength=len(self.sources))

    def proportions(self, last_steps: int | None = None) -> dict[str, Any]:
        """Observed against requested source proportions over the run so far, or its last ``last_steps`` steps.

        Returns ``{"start", "stop"`` (global positions), ``"observed"`` (each source's share of the samples
        served in ``[start, stop)``), ``"requested"`` (the schedule's mean weights over the same positions)``}``;
        ``start`` is not before the schedule's origin. Both are computed, at any time, from the schedule."""
        stop = self.position
        start = self.timeline.origin if last_steps is None else max(self.timeline.origin,
                                                                    stop - int(last_steps) * self.step_samples)
        s = len(self.sources)
        if stop <= start:
            return {"start": start, "stop": stop, "observed": np.full(s, np.nan), "requested": np.full(s, np.nan)}
        observed = (self.draws_before(stop) - self.draws_before(start)) / (stop - start)
        asked = self.timeline.cumulative(float(stop)) - self.timeline.cumulative(float(start))
        return {"start": start, "stop": stop, "observed": observed, "requested": asked / asked.sum()}

    # ---- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The cursor's state; with a schedule (or smooth mode) also ``"mix_schedule"``: the schedule's hash,
        its origin and the draws of every source before the saved position (what a changed schedule taken
        from here starts from)."""
        state = self.cursor.state_dict()
        if self._scheduled:
            line = self.timeline
            state["mix_schedule"] = {"hash": self.weight_schedule.hash, "origin": line.origin,
                                     "origin_draws": line.draws.tolist(),
                                     "draws": self.draws_before(self.position).tolist()}
        return state

    def load_state_dict(self, state: dict[str, Any], *, accept_schedule_change: bool = False) -> None:
        """Resume at a saved position. A state saved under another schedule raises
        :class:`~tbl_loader.errors.ScheduleChangedError`, unless ``accept_schedule_change``: then this Mix's
        schedule applies from the saved position on (the samples served before it stay as they were; in
        epoch mode only at an epoch's start)."""
        saved = state.get("mix_schedule") if isinstance(state, dict) else None
        if not self._scheduled:
            self.cursor.load_state_dict(state)
            return
        if not isinstance(saved, dict) or not {"hash", "origin", "origin_draws", "draws"} <= set(saved):
            raise ScheduleChangedError("the state holds no mixture schedule (saved by a Mix of plain weights, or "
                                       "not by a Mix)")
        s = len(self.sources)
        if len(saved["draws"]) != s or len(saved["origin_draws"]) != s:
            raise ScheduleChangedError(f"the state's schedule is over {len(saved['draws'])} sources, this Mix has {s}")
        if saved["hash"] == self.weight_schedule.hash:
            self.cursor.load_state_dict(state)
            self._rebase(int(saved["origin"]), saved["origin_draws"])
            return
        position = int(state.get("epoch", 0)) * self.epoch_size + int(state.get("consumed", 0))
        if not accept_schedule_change:
            raise ScheduleChangedError(
                f"the state was saved under schedule {saved['hash']}, this Mix has {self.weight_schedule.hash} "
                f"(at position {position}, step {position // self.step_samples}); pass "
                f"accept_schedule_change=True to apply this schedule from there on")
        if self.mode == "epoch" and position % self.epoch_size:
            raise ScheduleChangedError(f"in mode='epoch' a changed schedule applies from an epoch's start; the "
                                       f"state stands at sample {position % self.epoch_size} of its epoch")
        self.cursor.load_state_dict(state)
        self._rebase(position, saved["draws"])

    def _rebase(self, origin: int, draws: Sequence[int]) -> None:
        self.timeline = Timeline(self.weight_schedule, self.step_samples, self.cursor.options.seed, origin=origin,
                                 draws=np.asarray(draws, np.int64))
        self._schedule = None
        self._chunks = {}

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
        if self.mode == "epoch":
            schedule = self.schedule(epoch)  # the whole epoch's, made now (its permutation needs all of it)

            def lookup(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
                return schedule[0][ids], schedule[1][ids], schedule[2][ids]
        else:
            def lookup(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
                return self.lookup(epoch, ids)
        sources = list(self.sources)
        streamed = any(is_url(str(getattr(s, "path", ""))) and hasattr(s, "_read_ahead") for s in sources)

        def batches() -> Iterator[tuple[BatchPlan, tuple[Any, np.ndarray]]]:
            if streamed:
                return _reading_ahead(sources, lookup, plans)
            return ((plan, _make(sources, lookup(plan.sample_ids), plan)) for plan in plans)

        self._producer = Producer(batches, self.prefetch, name="tbl-loader-mix")
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


def _reading_ahead(sources: list[Any], lookup: Any, plans: Iterator[BatchPlan]) -> Iterator[tuple[Any, Any]]:
    """The batches of ``plans`` as :func:`_make` makes them, while the next ``READ_AHEAD_BATCHES`` batches' samples
    are handed to their streamed sources (``_read_ahead``) so that the shards they read download ahead, on the
    shared download threads, instead of in this thread when a batch first needs them. The window is looked up
    again when half of it has been served; which shards come early changes no batch."""
    window: collections.deque[tuple[BatchPlan, tuple[np.ndarray, np.ndarray, np.ndarray]]] = collections.deque()
    plans = iter(plans)
    more = True
    while True:
        if more and len(window) <= READ_AHEAD_BATCHES // 2:
            fresh = list(itertools.islice(plans, READ_AHEAD_BATCHES - len(window)))
            more = len(fresh) == READ_AHEAD_BATCHES - len(window)
            window.extend((plan, lookup(plan.sample_ids)) for plan in fresh)
            _schedule_reads(sources, [looked for _, looked in window])
        if not window:
            return
        plan, looked = window.popleft()
        yield plan, _make(sources, looked, plan)


def _schedule_reads(sources: list[Any], looked: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """Each streamed source's positions in ``looked`` (a window's (source, position, epoch) arrays), in order."""
    if not looked:
        return
    src, pos, ep = (np.concatenate(parts) for parts in zip(*looked, strict=True))
    for i in np.unique(src).tolist():
        read_ahead = getattr(sources[i], "_read_ahead", None)
        if read_ahead is not None:
            sel = src == i
            read_ahead(pos[sel], ep[sel])


def _make(sources: list[Any], looked: tuple[np.ndarray, np.ndarray, np.ndarray],
          plan: BatchPlan) -> tuple[Any, np.ndarray]:
    """One batch: each source's samples of the plan (``looked``: the source, position and source epoch of each;
    one get_batch per source and source epoch), joined."""
    src, pos, ep = looked
    # Grouped by (source, source epoch) with one sort, whatever the number of sources (no scan per source).
    grouped = np.lexsort((ep, src))
    key_s, key_e = src[grouped], ep[grouped]
    cuts = np.flatnonzero((key_s[1:] != key_s[:-1]) | (key_e[1:] != key_e[:-1])) + 1
    parts, where = [], []
    for sel in np.split(grouped, cuts):
        if sel.shape[0] == 0:
            continue
        parts.append(sources[int(src[sel[0]])].get_batch(EpochBatch(pos[sel].tolist(), int(ep[sel[0]]))))
        where.append(sel)
    placement = np.concatenate(where)
    inverse = np.empty_like(placement)
    inverse[placement] = np.arange(placement.shape[0])
    batch = _join(parts, inverse)
    if isinstance(batch, (Batch, PyTreeBatch, TokenBatch)):  # each sample's source beside its row, same backend
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
    if isinstance(first, TokenBatch):  # field by field: tokens, window numbers, boundary fields
        return TokenBatch(**{f.name: _join([getattr(p, f.name) for p in parts], inverse)
                             for f in dataclasses.fields(TokenBatch)})
    if isinstance(first, PyTreeBatch):  # the pytree leaf by leaf, and the rows
        return pytree_batch(_join([p.tree for p in parts], inverse), _join([p.indices for p in parts], inverse))
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
