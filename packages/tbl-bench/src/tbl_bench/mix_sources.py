"""Threads and memory of a Mix against its number of sources: 3 against 100 token sources, one schedule.

    python -m tbl_bench.mix_sources --data-dir DIR [--sources 3 100] [--steps 2000] [--json OUT.json]

Workload: ``max(--sources)`` token datasets written once under ``--data-dir`` (reused by later runs), each
256k uint16 tokens in documents of 50..2000 tokens (seed = the source's number); a ``Mix`` of the first
``S`` of them as ``TokenLoader``s (``seq_len=1024``, boundary fields on; the Mix replaces each by its
map-style twin), weights a linear schedule from uniform to ``1, 2, ..., S`` over the run's steps, batches
of 32, ``prefetch=2``. Each configuration runs in its own process (a fresh interpreter: nothing of the
other configuration's memory or threads is counted).

Figures per configuration, sampled every 50 steps while iterating: the process's OS threads
(``psutil.Process().num_threads()``, native threads included) and Python threads at their peak, the peak
resident memory split into anonymous and file-backed pages (:mod:`tbl_bench.rss`), and steps/s. What this
shows: a Mix has one producer thread whatever its number of sources, and its memory grows with what the
sources map (their shards' pages, file-backed), not with a per-source pool.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

__all__ = ["main", "measure", "write_sources"]

TOKENS = 1 << 18


def write_sources(data_dir: Path, count: int) -> list[Path]:
    """``count`` token datasets under ``data_dir`` (kept: a later run reuses them)."""
    from tbl_loader import write_tokens

    out = []
    for i in range(count):
        path = data_dir / f"source-{i:03d}"
        if not (path / "manifest.json").exists() and not path.exists():
            rng = np.random.default_rng(i)
            docs, total = [], 0
            while total < TOKENS:
                n = int(rng.integers(50, 2000))
                docs.append(rng.integers(1, 50_000, n, dtype=np.int64))
                total += n + 1
            write_tokens(docs, path, eos=0, chunk=8192, shard_tokens=1 << 16)
        out.append(path)
    return out


def measure(paths: list[Path], steps: int) -> dict:
    """Iterate a Mix of ``paths`` for ``steps`` steps; threads, memory and speed (this process)."""
    import psutil

    from tbl_bench.rss import read_rss
    from tbl_loader import Mix, Schedule, TokenLoader

    proc = psutil.Process()
    before = {"os_threads": proc.num_threads(), "python_threads": threading.active_count()}
    loaders = [TokenLoader(p, 32, 1024, seed=i, boundaries=True, prefetch=0, backend="numpy")
               for i, p in enumerate(paths)]
    s = len(paths)
    schedule = Schedule.linear([(0, [1.0] * s), (steps, [float(k + 1) for k in range(s)])])
    mix = Mix(loaders, weights=schedule, batch_size=32, epoch_size=32 * steps, seed=0, prefetch=2)
    peak_os = peak_py = 0
    peak_anon = peak_file = peak_rss = 0
    start = time.perf_counter()
    for k, batch in enumerate(mix):
        assert batch.tokens.shape == (32, 1025)
        if k % 50 == 0:
            peak_os = max(peak_os, proc.num_threads())
            peak_py = max(peak_py, threading.active_count())
            rss = read_rss()
            peak_rss = max(peak_rss, rss.rss_kb)
            peak_anon = max(peak_anon, rss.anon_kb or 0)
            peak_file = max(peak_file, rss.file_kb or 0)
        if k + 1 == steps:
            break
    seconds = time.perf_counter() - start
    report = mix.proportions()
    mix.close()
    for loader in loaders:
        loader.close()
    return {"sources": s, "steps": steps, "os_threads_before": before["os_threads"],
            "python_threads_before": before["python_threads"], "os_threads_peak": peak_os,
            "python_threads_peak": peak_py, "rss_kb_peak": peak_rss, "anon_kb_peak": peak_anon,
            "file_kb_peak": peak_file, "steps_per_s": steps / seconds,
            "max_abs_share_error": float(np.abs(report["observed"] - report["requested"]).max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tbl_bench.mix_sources", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--sources", type=int, nargs="+", default=[3, 100])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    if args.child is not None:  # one configuration, in this fresh process
        paths = [args.data_dir / f"source-{i:03d}" for i in range(args.child)]
        print(json.dumps(measure(paths, args.steps)))
        return 0
    write_sources(args.data_dir, max(args.sources))
    results = []
    for s in args.sources:
        out = subprocess.run([sys.executable, "-m", "tbl_bench.mix_sources", "--data-dir", str(args.data_dir),
                              "--steps", str(args.steps), "--child", str(s)], check=True, capture_output=True,
                             text=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for r in results:
        print(f"{r['sources']:>4} sources: threads {r['os_threads_before']} -> {r['os_threads_peak']} OS, "
              f"{r['python_threads_before']} -> {r['python_threads_peak']} Python; RSS peak "
              f"{r['rss_kb_peak'] / 1024:.0f} MiB (anon {r['anon_kb_peak'] / 1024:.0f}, file "
              f"{r['file_kb_peak'] / 1024:.0f}); {r['steps_per_s']:.0f} steps/s; max share error "
              f"{r['max_abs_share_error']:.5f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
