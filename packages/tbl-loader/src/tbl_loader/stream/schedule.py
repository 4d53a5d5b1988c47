"""Mixture schedules: source weights as a function of the training step, and which source serves each position.

A :class:`Schedule` holds knots ``(step, weights)``, the weights of every knot normalized to sum 1:

- ``Schedule.constant(w)``: one knot;
- ``Schedule.piecewise([(0, w0), (s1, w1), ...])``: ``w_k`` from step ``s_k`` until ``s_{k+1}``;
- ``Schedule.linear([(0, w0), (s1, w1), ...])``: linear between knots (the normalized vectors are
  interpolated, so the weights sum to 1 everywhere), the last knot's weights after it;
- ``Schedule.from_json(text or path)``: ``{"kind": "linear" | "piecewise" | "constant", "points":
  [[step, [w, ...]], ...]}``, or a bare list of points (piecewise); ``to_json()`` writes it back.

``schedule.hash`` is the sha256 (32 hex digits) of ``to_json()`` (keys sorted, floats as Python writes them),
the identity a Mix's state carries.

Time. A Mix's run is a sequence of sample positions ``t = 0, 1, 2, ...`` (global, all ranks together:
epoch ``e``, position ``p`` is ``t = e * n + p``); step ``s`` covers positions ``[s * K, s * K + K)`` with
``K = step_samples``. The weight of source ``i`` at position ``t`` is the schedule's at the real step
``t / K``, and ``C_i(t) = integral of w_i over [0, t)`` is what the schedule asks of source ``i`` before
position ``t``: a quadratic in ``t`` within a linear segment, linear within a constant one (exact formulas
in :class:`Timeline`).

Smooth assignment (``mode="smooth"``). The ``k``-th draw of source ``i`` (``k = 0, 1, ...`` over the whole
run) has the target value ``V_ik = k + u_ik`` with ``u_ik`` uniform in ``(0, 1)``
(``((hash_u64(seed, i, TAG_MIX_JITTER, k) >> 11) + 0.5) / 2**53``) and the time
``tau_ik = C_i^{-1}(V_ik)`` (the first position where the schedule has asked ``V_ik`` of source ``i``;
infinite when it never does). All draws of all sources sorted by ``(tau, i)``: the draw of rank ``t`` is
served at position ``t``. So every prefix of the run has served each source ``C_i(t)`` samples to within
about one plus ``w_i`` times the number of sources, wherever a ramp stands; the order is random within
that slack (the jitter ``u``), deterministic per ``seed``, and position ``t``'s source is computed from
the draws with ``tau`` near ``t`` alone (``|rank - tau| < S`` for ``S`` sources), so a resume anywhere
costs the same as a step.

Epoch assignment (``mode="epoch"``, exact counts per epoch). Epoch ``e`` of ``n`` positions gives source
``i`` ``c_i(e)`` samples, the largest-remainder rounding (:func:`mix_counts`) of the epoch's mean weights
``(C_i((e + 1) n) - C_i(e n)) / n`` (a one-knot schedule: its weights, exactly); the epoch's sources are
``[0] * c_0 + [1] * c_1 + ...`` permuted by ``epoch_permutation(n, mix_seed, e)``, and the ``k``-th draw of
source ``i`` in epoch ``e`` is its draw ``sum(c_i(e') for e' < e) + k`` of the run. With constant weights
this is :class:`~tbl_loader.Mix`'s rule for plain weights, bit for bit.

A changed schedule taken "from here" starts a new origin ``(t_o, D)``: position ``t_o`` and the draws
``D_i`` each source had before it. From ``t_o`` on, draw ``k >= D_i`` has the target value
``C_i(t_o) + (k - D_i) + u_ik`` under the new schedule and draws are ranked from ``t_o`` (smooth), or
epochs from ``t_o / n`` on count from ``D`` (epoch). The origin is part of the Mix's state.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import MixError
from . import order

__all__ = ["SCHEDULE_KINDS", "TAG_MIX_JITTER", "Schedule", "Timeline", "mix_counts"]

SCHEDULE_KINDS = ("constant", "piecewise", "linear")
TAG_MIX_JITTER = 70
"""Stream tag of the smooth assignment's jitter (tags below 64 are :mod:`tbl_loader.stream.order`'s)."""


def mix_counts(weights: Sequence[float], epoch_size: int) -> np.ndarray:
    """Samples per source in one epoch: ``floor(w_i * n)`` plus one for the ``n - sum(floor)`` sources with
    the largest remainders (ties: lower ``i``), ``w`` normalized to sum 1."""
    w = np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    exact = w * epoch_size
    counts = np.floor(exact).astype(np.int64)
    short = epoch_size - int(counts.sum())
    if short:
        remainder = exact - counts
        counts[np.argsort(-remainder, kind="stable")[:short]] += 1
    return counts


def _normalized(weights: Any, where: str) -> tuple[float, ...]:
    try:
        w = [float(x) for x in weights]
    except (TypeError, ValueError):
        raise MixError(f"{where}: weights must be a sequence of numbers, got {weights!r}") from None
    if not w or not all(np.isfinite(x) and x >= 0 for x in w) or sum(w) <= 0:
        raise MixError(f"{where}: weights must be finite non-negative numbers with a positive sum, got {list(weights)}")
    total = sum(w)
    return tuple(x / total for x in w)


class Schedule:
    """Source weights as a function of the step (see the module docstring)."""

    def __init__(self, kind: str, points: Sequence[tuple[int, Sequence[float]]]) -> None:
        if kind not in SCHEDULE_KINDS:
            raise MixError(f"schedule kind must be one of {SCHEDULE_KINDS}, got {kind!r}")
        if isinstance(points, (str, bytes)) or not isinstance(points, Sequence) or not points:
            raise MixError("a schedule needs at least one point (step, weights)")
        steps, rows = [], []
        for k, point in enumerate(points):
            if not isinstance(point, Sequence) or isinstance(point, (str, bytes)) or len(point) != 2:
                raise MixError(f"schedule point {k} must be (step, weights), got {point!r}")
            step, weights = point
            if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
                raise MixError(f"schedule point {k}: the step must be an int >= 0, got {step!r}")
            steps.append(int(step))
            rows.append(_normalized(weights, f"schedule point {k} (step {int(step)})"))
        if steps[0] != 0:
            raise MixError(f"a schedule starts at step 0, its first point is at step {steps[0]}")
        if any(b <= a for a, b in zip(steps[:-1], steps[1:], strict=True)):
            raise MixError(f"schedule steps must increase, got {steps}")
        if len({len(r) for r in rows}) != 1:
            raise MixError(f"every schedule point needs one weight per source, got lengths {[len(r) for r in rows]}")
        if kind == "constant" and len(steps) != 1:
            raise MixError(f"a constant schedule has one point, got {len(steps)}")
        self.kind = kind
        self.steps = tuple(steps)
        self.weights = tuple(rows)

    @classmethod
    def constant(cls, weights: Sequence[float]) -> Schedule:
        return cls("constant", [(0, weights)])

    @classmethod
    def piecewise(cls, points: Sequence[tuple[int, Sequence[float]]]) -> Schedule:
        return cls("piecewise", points)

    @classmethod
    def linear(cls, points: Sequence[tuple[int, Sequence[float]]]) -> Schedule:
        return cls("linear", points)

    @classmethod
    def from_json(cls, source: str | os.PathLike[str]) -> Schedule:
        """A schedule from JSON text or a JSON file: ``{"kind": ..., "points": [[step, [w, ...]], ...]}`` or a
        bare list of points (piecewise)."""
        text = str(source)
        if isinstance(source, os.PathLike) or not text.lstrip().startswith(("{", "[")):
            text = Path(source).read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise MixError(f"schedule JSON does not parse: {exc}") from None
        if isinstance(data, list):
            data = {"kind": "piecewise", "points": data}
        if not isinstance(data, dict) or set(data) != {"kind", "points"}:
            raise MixError('schedule JSON must be {"kind": ..., "points": [[step, [w, ...]], ...]} or a list of points')
        return cls(data["kind"], [tuple(p) if isinstance(p, list) else p for p in data["points"]])

    def to_json(self) -> str:
        points = [[s, list(w)] for s, w in zip(self.steps, self.weights, strict=True)]
        return json.dumps({"kind": self.kind, "points": points}, sort_keys=True, separators=(",", ":"))

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:32]

    @property
    def num_sources(self) -> int:
        return len(self.weights[0])

    def weights_at(self, step: float) -> np.ndarray:
        """The (normalized) weights at the real step ``step``."""
        w = np.asarray(self.weights, np.float64)
        k = int(np.searchsorted(np.asarray(self.steps), step, side="right")) - 1
        if self.kind != "linear" or k == len(self.steps) - 1:
            return w[k].copy()
        f = (step - self.steps[k]) / (self.steps[k + 1] - self.steps[k])
        return w[k] + (w[k + 1] - w[k]) * f

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schedule) and other.to_json() == self.to_json()

    def __hash__(self) -> int:
        return hash(self.to_json())

    def __repr__(self) -> str:
        return f"Schedule.{self.kind}({len(self.steps)} points, {self.num_sources} sources)"


class Timeline:
    """A schedule over sample positions (``step_samples`` a step), with the origin ``(t_o, D)``.

    Segment ``k`` covers positions ``[P_k, P_{k+1})`` with ``P_k = steps[k] * step_samples`` (the last one
    unbounded); within it ``w_i(P_k + x) = A_ki + M_ki * x`` (``A``: knot ``k``'s weights; ``M``: the slope to
    knot ``k + 1``'s for a linear schedule, else 0; 0 in the last segment) and
    ``C_i(P_k + x) = Q_ki + A_ki x + M_ki x^2 / 2`` with ``Q`` the running sum of the segments' integrals. The
    inverse within segment ``k``: ``x = 2 d / (A + sqrt(A^2 + 2 M d))`` for ``d = V - Q_ki`` (infinite when the
    denominator is 0: the schedule never asks that much), clamped to the segment.
    """

    def __init__(self, schedule: Schedule, step_samples: int, seed: int, origin: int = 0,
                 draws: np.ndarray | None = None) -> None:
        self.schedule = schedule
        self.seed = int(seed)
        self.S = schedule.num_sources
        w = np.asarray(schedule.weights, np.float64)  # (knots, S)
        self.P = np.asarray(schedule.steps, np.float64) * float(step_samples)
        K = self.P.shape[0]
        self.A = w.copy()
        self.M = np.zeros_like(w)
        self.L = np.append(np.diff(self.P), np.inf)
        if schedule.kind == "linear" and K > 1:
            self.M[:-1] = (w[1:] - w[:-1]) / self.L[:-1, None]
        self.Q = np.zeros_like(w)
        for k in range(1, K):
            length = self.L[k - 1]
            self.Q[k] = self.Q[k - 1] + self.A[k - 1] * length + 0.5 * self.M[k - 1] * length * length
        self.origin = int(origin)
        self.draws = np.zeros(self.S, np.int64) if draws is None else np.asarray(draws, np.int64).copy()
        self.base = self.cumulative(float(self.origin))

    def cumulative(self, t: float) -> np.ndarray:
        """``C(t)`` of every source (float64, ``(S,)``; 0 before position 0)."""
        t = max(t, 0.0)
        k = int(np.searchsorted(self.P, t, side="right")) - 1
        x = t - self.P[k]
        return self.Q[k] + self.A[k] * x + 0.5 * self.M[k] * x * x

    def _times(self, i: int, values: np.ndarray) -> np.ndarray:
        """``tau = C_i^{-1}(V)`` for source ``i``."""
        q = self.Q[:, i]
        k = np.searchsorted(q, values, side="right") - 1
        d = values - q[k]
        a, m = self.A[k, i], self.M[k, i]
        den = a + np.sqrt(np.maximum(a * a + 2.0 * m * d, 0.0))
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.where(den > 0, 2.0 * d / np.where(den > 0, den, 1.0), np.inf)
        x = np.where(d <= 0, 0.0, x)
        x = np.minimum(x, self.L[k])  # the last segment's L is infinite
        return self.P[k] + x

    def _values(self, i: int, k: np.ndarray) -> np.ndarray:
        """Target values ``C_i(t_o) + (k - D_i) + u_ik`` of source ``i``'s draws ``k``."""
        h = order.hash_u64(self.seed, i, TAG_MIX_JITTER, k.astype(np.uint64))
        u = ((h >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
        return self.base[i] + (k - self.draws[i]).astype(np.float64) + u

    def count_before(self, tau: float) -> np.ndarray:
        """Draws of every source (from the origin's on, plus ``D``) whose time is below ``tau`` (``(S,)``)."""
        c = self.cumulative(tau) - self.base
        out = self.draws.copy()
        j0 = np.maximum(0, np.floor(c).astype(np.int64) - 2)
        for i in range(self.S):
            k = self.draws[i] + j0[i] + np.arange(5, dtype=np.int64)
            out[i] += j0[i] + int((self._times(i, self._values(i, k)) < tau).sum())
        return out

    def window(self, p0: int, p1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions ``[p0, p1)`` (``p0 >= t_o``): ``(source, draw)`` int64 arrays, and the draws of every source
        before ``p0`` (``(S,)``)."""
        margin = self.S + 2
        while True:
            lo = float(p0 - margin) if p0 - margin >= self.origin else self.origin - 1.0
            hi = float(p1 + margin)
            below, upto = self.count_before(lo), self.count_before(hi)
            first = self.origin + int((below - self.draws).sum())
            last = self.origin + int((upto - self.draws).sum())
            if first <= p0 and last >= p1:
                break
            margin *= 2  # never seen: |rank - tau| < S holds; widening keeps this exact if rounding disagreed
        src, draw, tau = [], [], []
        for i in range(self.S):
            k = np.arange(below[i], upto[i], dtype=np.int64)
            src.append(np.full(k.shape[0], i, np.int64))
            draw.append(k)
            tau.append(self._times(i, self._values(i, k)))
        src_all, draw_all, tau_all = np.concatenate(src), np.concatenate(draw), np.concatenate(tau)
        ranked = np.lexsort((src_all, tau_all))
        head = ranked[: p0 - first]
        before = below + np.bincount(src_all[head], minlength=self.S)
        take = ranked[p0 - first : p1 - first]
        return src_all[take], draw_all[take], before

    def epoch_counts(self, epoch: int, epoch_size: int) -> np.ndarray:
        """``c(e)``: samples of every source in epoch ``epoch`` (epoch mode)."""
        if len(self.schedule.steps) == 1:
            return mix_counts(self.schedule.weights[0], epoch_size)
        lo = max(float(epoch * epoch_size), float(self.origin))
        mean = self.cumulative(float((epoch + 1) * epoch_size)) - self.cumulative(lo)
        return mix_counts(mean, epoch_size)

    def epoch_draws(self, epoch: int, epoch_size: int) -> np.ndarray:
        """Draws of every source before epoch ``epoch`` (epoch mode; ``D`` plus the counts from the origin's epoch)."""
        out = self.draws.copy()
        if len(self.schedule.steps) == 1:  # the same counts every epoch
            return out + (epoch - self.origin // epoch_size) * mix_counts(self.schedule.weights[0], epoch_size)
        for e in range(self.origin // epoch_size, epoch):
            out += self.epoch_counts(e, epoch_size)
        return out
