"""Resident memory of a benchmark process, split into anonymous and file-backed pages.

Anonymous memory is what a loader owns (decoded copies, caches, batch buffers);
file-backed memory is mapped file pages (the page cache a memory-mapped dataset
reads through). They mean different things, so they are reported separately.

`RssSampler` reads `/proc/<pid>/status` (RssAnon, RssFile) from a background
thread and keeps the peak of each, for this process and for the whole process
tree (DataLoader workers are child processes; their memory is part of the cost).
Tree sums add each process's own counters, so pages shared between a parent and
its forked workers are counted once per process: the tree figure is an upper
bound, the per-process figure is exact.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

__all__ = ["RssSample", "RssSampler", "RssUnavailableError", "read_rss", "read_tree_rss"]


class RssUnavailableError(RuntimeError):
    """The platform does not expose RssAnon / RssFile (Linux /proc is required)."""


@dataclass(frozen=True)
class RssSample:
    anon_kb: int
    file_kb: int


def _parse_status(text: str) -> RssSample | None:
    anon = file = None
    for line in text.splitlines():
        if line.startswith("RssAnon:"):
            anon = int(line.split()[1])
        elif line.startswith("RssFile:"):
            file = int(line.split()[1])
    if anon is None or file is None:
        return None
    return RssSample(anon, file)


def read_rss(pid: int | str = "self") -> RssSample:
    """RssAnon and RssFile of one process, in KiB."""
    path = f"/proc/{pid}/status"
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError as e:
        raise RssUnavailableError(f"{path} does not exist; RSS sampling needs Linux /proc") from e
    sample = _parse_status(text)
    if sample is None:
        raise RssUnavailableError(f"{path} has no RssAnon/RssFile lines (kernel older than 4.5?)")
    return sample


def _children_map() -> dict[int, list[int]]:
    """ppid -> child pids, from /proc/*/stat (task/*/children is not always compiled in)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # the process exited while we were listing
        # The command name is in parentheses and may contain spaces: split after the last ')'.
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(name))
    return children


def read_tree_rss(pid: int | None = None) -> RssSample:
    """Sum of RssAnon and RssFile over a process and all its descendants, in KiB."""
    root = os.getpid() if pid is None else pid
    children = _children_map()
    total_anon = total_file = 0
    stack = [root]
    while stack:
        p = stack.pop()
        try:
            s = read_rss(p)
        except (RssUnavailableError, ProcessLookupError):
            if p == root:
                raise
            continue  # a worker exited between listing and reading
        total_anon += s.anon_kb
        total_file += s.file_kb
        stack.extend(children.get(p, ()))
    return RssSample(total_anon, total_file)


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
        self.baseline: RssSample | None = None
        self.tree_baseline: RssSample | None = None
        self._peak_anon = self._peak_file = 0
        self._tree_peak_anon = self._tree_peak_file = 0
        self.samples = 0

    def sample_now(self) -> None:
        """Take one sample (process and tree) from the calling thread, e.g. at an epoch boundary."""
        with self._lock:
            self._take(with_tree=True)

    def _take(self, with_tree: bool) -> None:
        s = read_rss()
        self._peak_anon = max(self._peak_anon, s.anon_kb)
        self._peak_file = max(self._peak_file, s.file_kb)
        if with_tree:
            t = read_tree_rss()
            self._tree_peak_anon = max(self._tree_peak_anon, t.anon_kb)
            self._tree_peak_file = max(self._tree_peak_file, t.file_kb)
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
        self.baseline = read_rss()
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

    def result(self) -> dict[str, int]:
        """Peaks and growth in KiB (process and tree), as plain JSON-ready ints."""
        if self.baseline is None or self.tree_baseline is None:
            raise RuntimeError("RssSampler was never started")
        return {
            "baseline_anon_kb": self.baseline.anon_kb,
            "baseline_file_kb": self.baseline.file_kb,
            "peak_anon_kb": self._peak_anon,
            "peak_file_kb": self._peak_file,
            "growth_anon_kb": self._peak_anon - self.baseline.anon_kb,
            "growth_file_kb": self._peak_file - self.baseline.file_kb,
            "tree_peak_anon_kb": self._tree_peak_anon,
            "tree_peak_file_kb": self._tree_peak_file,
            "tree_growth_anon_kb": self._tree_peak_anon - self.tree_baseline.anon_kb,
            "tree_growth_file_kb": self._tree_peak_file - self.tree_baseline.file_kb,
            "samples": self.samples,
        }
