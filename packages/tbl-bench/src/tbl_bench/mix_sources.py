"""Threads and memory of a Mix against its number of sources: 3 against 100 token sources, one schedule.

    python -m tbl_bench.mix_sources --data-dir DIR [--sources 3 100] [--steps 2000] [--url] [--json OUT.json]

Workload: ``max(--sources)`` token datasets written once under ``--data-dir`` (reused by later runs), each
256k uint16 tokens in documents of 50..2000 tokens (seed = the source's number); a ``Mix`` of the first
``S`` of them as ``TokenLoader``s (``seq_len=1024``, boundary fields on; the Mix replaces each by its
map-style twin), weights a linear schedule from uniform to ``1, 2, ..., S`` over the run's steps, batches
of 32, ``prefetch=2``. Each configuration runs in its own process (a fresh interpreter: nothing of the
other configuration's memory or threads is counted). With ``--url`` every source is read from a URL
instead: the datasets are uploaded to a loopback S3 server (moto, in the parent process) and each source
streams through a shard cache of its own (``cache_dir`` under a temporary folder, no limit), so the
figures include the download threads and the object-store client.

Figures per configuration, sampled at each of the first 100 steps and every 50 steps after: the process's OS threads
(``psutil.Process().num_threads()``, native threads included) and Python threads at their peak, the peak
resident memory split into anonymous and file-backed pages (:mod:`tbl_bench.rss`), and steps/s. What this
shows: a Mix has one producer thread whatever its number of sources, and its memory grows with what the
sources map (their shards' pages, file-backed), not with a per-source pool.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

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


def measure(paths: list[Path] | list[str], steps: int, cache_root: Path | None = None) -> dict:
    """Iterate a Mix of ``paths`` (folders, or URLs read through caches under ``cache_root``) for ``steps``
    steps; threads, memory and speed (this process)."""
    import psutil

    from tbl_bench.rss import read_rss
    from tbl_loader import Mix, Schedule, TokenLoader

    proc = psutil.Process()
    before = {"os_threads": proc.num_threads(), "python_threads": threading.active_count()}
    remote = (lambda i: {"cache_dir": cache_root / f"cache-{i:03d}"}) if cache_root is not None else (lambda i: {})
    loaders = [TokenLoader(p, 32, 1024, seed=i, boundaries=True, prefetch=0, backend="numpy", **remote(i))
               for i, p in enumerate(paths)]
    s = len(paths)
    schedule = Schedule.linear([(0, [1.0] * s), (steps, [float(k + 1) for k in range(s)])])
    mix = Mix(loaders, weights=schedule, batch_size=32, epoch_size=32 * steps, seed=0, prefetch=2)
    peak_os = peak_py = peak_download = 0
    peak_anon = peak_file = peak_rss = 0
    start = time.perf_counter()
    for k, batch in enumerate(mix):
        assert batch.tokens.shape == (32, 1025)
        if k < 100 or k % 50 == 0:  # every step at first, while a URL's downloads run
            peak_os = max(peak_os, proc.num_threads())
            peak_py = max(peak_py, threading.active_count())
            peak_download = max(peak_download, sum(t.name.startswith("tbl-download") for t in threading.enumerate()))
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
            "python_threads_peak": peak_py, "download_threads_peak": peak_download, "url": cache_root is not None,
            "rss_kb_peak": peak_rss, "anon_kb_peak": peak_anon,
            "file_kb_peak": peak_file, "steps_per_s": steps / seconds,
            "max_abs_share_error": float(np.abs(report["observed"] - report["requested"]).max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tbl_bench.mix_sources", description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--sources", type=int, nargs="+", default=[3, 100])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--url", action="store_true", help="read every source from a loopback S3 server")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-cache", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.data_dir.mkdir(parents=True, exist_ok=True)
    if args.child is not None:  # one configuration, in this fresh process
        if args.child_cache is not None:
            paths = [f"s3://mix/source-{i:03d}/" for i in range(args.child)]
        else:
            paths = [args.data_dir / f"source-{i:03d}" for i in range(args.child)]
        print(json.dumps(measure(paths, args.steps, args.child_cache)))
        return 0
    local = write_sources(args.data_dir, max(args.sources))
    server, env, work = (_serve(local) if args.url else (None, None, None))
    results = []
    try:
        for s in args.sources:
            cmd = [sys.executable, "-m", "tbl_bench.mix_sources", "--data-dir", str(args.data_dir),
                   "--steps", str(args.steps), "--child", str(s)]
            if work is not None:
                cmd += ["--child-cache", str(work / f"caches-{s}")]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        if server is not None:
            server.stop()
            shutil.rmtree(work, ignore_errors=True)
    for r in results:
        print(f"{r['sources']:>4} sources{' (URLs)' if r['url'] else ''}: threads {r['os_threads_before']} -> "
              f"{r['os_threads_peak']} OS, {r['python_threads_before']} -> {r['python_threads_peak']} Python "
              f"({r['download_threads_peak']} downloading); RSS peak "
              f"{r['rss_kb_peak'] / 1024:.0f} MiB (anon {r['anon_kb_peak'] / 1024:.0f}, file "
              f"{r['file_kb_peak'] / 1024:.0f}); {r['steps_per_s']:.0f} steps/s; max share error "
              f"{r['max_abs_share_error']:.5f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


def _serve(paths: list[Path]) -> tuple[Any, dict[str, str], Path]:
    """A loopback S3 server holding every source under s3://mix/, the environment that reaches it, a scratch
    folder for the children's caches."""
    import boto3

    from tbl_bench.remote import KEYS, _S3Server
    from tbl_loader import upload_dataset

    server = _S3Server()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEYS["aws_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": KEYS["aws_secret_access_key"], "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": server.endpoint, "AWS_ALLOW_HTTP": "true"}
    boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", **KEYS).create_bucket(Bucket="mix")
    options = {**KEYS, "region": "us-east-1", "endpoint": server.endpoint, "client_options": {"allow_http": True}}
    for path in paths:
        upload_dataset(path, f"s3://mix/{path.name}/", storage_options=options)
    return server, env, Path(tempfile.mkdtemp(prefix="tbl-mix-sources-"))


if __name__ == "__main__":
    sys.exit(main())
