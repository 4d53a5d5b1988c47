"""Resident memory of a benchmark process, split into anonymous and file-backed pages, through psutil.

Anonymous memory is what a loader owns (decoded copies, caches, batch buffers);
file-backed memory is mapped file pages (the page cache a memory-mapped dataset
reads through). They mean different things, so they are reported separately
where the platform tells them apart: on Linux psutil's `shared` is the resident
file-backed (and shared-memory) pages and `rss - shared` the anonymous ones. On
macOS and Windows only the total is known; the split is None there, never a
guess, and `rss_kb` carries the total everywhere.

`RssSampler` samples from a background thread and keeps the peak of each, for
this process and for the whole process tree (DataLoader workers are child
processes; their memory is part of the cost). Tree sums add each process's own
counters, so pages shared between a parent and its forked workers are counted
once per process: the tree figure is an upper bound, the per-process figure is
exact.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import psutil

__all__ = ["RssSample", "RssSampler", "read_rss", "read_tree_rss"]


@dataclass(frozen=True)
class RssSample:
    """KiB. `anon_kb` / `file_kb` are None where the platform does not split resident memory."""

    rss_kb: int
    anon_kb: int | None
    file_kb: int | None


def _sample(proc: psutil.Process) -> RssSample:
    mem = proc.memory_info()
    rss = mem.rss >> 10
    shared = getattr(mem, "shared", None)  # Linux only
    if shared is None:
        return RssSample(rss, None, None)
    file_kb = shared >> 10
    return RssSample(rss, rss - file_kb, file_kb)


def read_rss(pid: int | None = None) -> RssSample:
    """Resident memory of one process (default: this one), in KiB."""
    return _sample(psutil.Process(pid))


def _add(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


def read_tree_rss(pid: int | None = None) -> RssSample:
    """Sum over a process (default: this one) and all its descendants, in KiB."""
    root = psutil.Process(pid if pid is not None else os.getpid())
    total = _sample(root)
    for child in root.children(recursive=True):
        try:
            s = _sample(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # a worker exited between listing and reading
        total = RssSample(total.rss_kb + s.rss_kb, _add(total.anon_kb, s.anon_kb), _add(total.file_kb, s.file_kb))
    return total


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def _minus(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a - b


class _Peak:
    """The largest value seen of each figure."""

    def __init__(self) -> None:
        self.rss_kb: int | None = None
        self.anon_kb: int | None = None
        self.file_kb: int | None = None

    def update(self, s: RssSample) -> None:
        self.rss_kb = _max(self.rss_kb, s.rss_kb)
        self.anon_kb = _max(self.anon_kb, s.anon_kb)
        self.file_kb = _max(self.file_kb, s.file_kb)


class RssSampler:
    """Samples this process (every `interval` s) and its tree (every `tree_every` samples) in a thread.

    Use as a context manager, or call start() / stop(). `baseline` is taken at
    start(); `result()` gives peaks and growth over that baseline.
    """

    def __init__(self, interval: float = 0.01, tree_every: int = 10) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0, got {interval}")
        if tree_every < 1:
            raise ValueError(f"tree_every must be >= 1, got {tree_every}")
        self.interval = interval
        self.tree_every = tree_every
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._process = psutil.Process()
        self.baseline: RssSample | None = None
        self.tree_baseline: RssSample | None = None
        self._peak = _Peak()
        self._tree_peak = _Peak()
        self.samples = 0

    def sample_now(self) -> None:
        """Take one sample (process and tree) from the calling thread, e.g. at an epoch boundary."""
        with self._lock:
            self._take(with_tree=True)

    def _take(self, with_tree: bool) -> None:
        self._peak.update(_sample(self._process))
        if with_tree:
            self._tree_peak.update(read_tree_rss())
        self.samples += 1

    def _loop(self) -> None:
        n = 0
        while not self._stop.wait(self.interval):
            n += 1
            with self._lock:
                self._take(with_tree=n % self.tree_every == 0)

    def start(self) -> RssSampler:
        if self._thread is not None:
            raise RuntimeError("RssSampler already started")
        self.baseline = _sample(self._process)
        self.tree_baseline = read_tree_rss()
        self._take(with_tree=True)
        self._thread = threading.Thread(target=self._loop, name="tbl-bench-rss", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._take(with_tree=True)  # the final state counts too

    def __enter__(self) -> RssSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def result(self) -> dict[str, int | None]:
        """Peaks and growth in KiB (process and tree), as plain JSON-ready ints (None: not split here)."""
        if self.baseline is None or self.tree_baseline is None:
            raise RuntimeError("RssSampler was never started")
        b, tb, p, tp = self.baseline, self.tree_baseline, self._peak, self._tree_peak
        return {
            "baseline_rss_kb": b.rss_kb,
            "baseline_anon_kb": b.anon_kb,
            "baseline_file_kb": b.file_kb,
            "peak_rss_kb": p.rss_kb,
            "peak_anon_kb": p.anon_kb,
            "peak_file_kb": p.file_kb,
            "growth_rss_kb": _minus(p.rss_kb, b.rss_kb),
            "growth_anon_kb": _minus(p.anon_kb, b.anon_kb),
            "growth_file_kb": _minus(p.file_kb, b.file_kb),
            "tree_peak_rss_kb": tp.rss_kb,
            "tree_peak_anon_kb": tp.anon_kb,
            "tree_peak_file_kb": tp.file_kb,
            "tree_growth_rss_kb": _minus(tp.rss_kb, tb.rss_kb),
            "tree_growth_anon_kb": _minus(tp.anon_kb, tb.anon_kb),
            "tree_growth_file_kb": _minus(tp.file_kb, tb.file_kb),
            "samples": self.samples,
        }
