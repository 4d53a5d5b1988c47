"""Benchmark of the tbl-kernels C++ kernels against memory bandwidth and TurboLoader.

    python -m tbl_bench.suites.kernels [--quick] [--rounds N] [--peer-python PATH] [--json PATH]

Every configuration runs in its own subprocess (a fresh interpreter per
measurement: no shared thread pools, allocators or page cache state beyond the
OS's). Each one allocates a source of >= 2.2 GB of uint8 images, draws random
indices over all of it, runs warm-up batches and reports the median batch time
over at least 20 timed batches and at least one second.
With ``--rounds N`` the whole list of configurations runs N times, round-robin,
and each figure is the median over the rounds: on a shared machine a burst of
someone else's load then lands on one round of every configuration instead of
on every batch of one, and the ratios compare like with like.
Figures:

* ``copy``: ``np.copyto`` of a buffer as large as one batch moves (read +
  written), single-threaded: the machine's own memory bandwidth, same run.
* ``tbl``: ``tbl_kernels.gather_normalize`` / ``gather_u8`` /
  ``gather_crop_resize`` at 1 and 2 threads, float32 / float16 / bfloat16 / uint8.
* ``turboloader``: ``normalize_u8_gather`` and
  ``crop_resize_normalize_u8_gather`` of TurboLoader on identical inputs, run
  with ``--peer-python`` (an interpreter whose environment has turboloader and
  numpy; TurboLoader picks its own thread count, OMP_NUM_THREADS is set to the
  requested one). Skipped with a message when not given.

The last line of the output is the JSON of all results and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

__all__ = ["main"]

SOURCE_BYTES = int(2.2e9)
BATCH = 256
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ----------------------------------------------------------------------------- worker side
# The worker half runs under the benchmarked interpreter (possibly the peer's
# venv) and imports only numpy plus the kernel library it measures.


def _make_source(np, size: int):
    """(N, size, size, 3) uint8 of >= SOURCE_BYTES, filled (pages touched) before timing."""
    per = size * size * 3
    n = -(-SOURCE_BYTES // per)
    src = np.empty((n, size, size, 3), dtype=np.uint8)
    block = np.random.default_rng(0).integers(0, 256, size=(64, size, size, 3), dtype=np.uint8)
    for i in range(0, n, 64):
        m = min(64, n - i)
        src[i : i + m] = block[:m]
    return src


def _boxes(np, rng, b: int, size: int):
    """RandomResizedCrop-style boxes (scale 0.08..1, ratio 3/4..4/3) as (top, left, height, width)."""
    area = size * size * rng.uniform(0.08, 1.0, b)
    ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), b))
    w = np.clip(np.round(np.sqrt(area * ratio)), 1, size).astype(np.int64)
    h = np.clip(np.round(np.sqrt(area / ratio)), 1, size).astype(np.int64)
    top = (rng.uniform(0, 1, b) * (size - h + 1)).astype(np.int64)
    left = (rng.uniform(0, 1, b) * (size - w + 1)).astype(np.int64)
    return np.stack([top, left, h, w], axis=1).astype(np.int32)


MIN_TIMED_S = 1.0  # keep timing past `batches` until this much wall time is covered
MAX_BATCHES = 2000


def _time_batches(fn, batches: int, warmup: int, inputs: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds (all threads of this process) per batch.

    At least ``batches`` timed batches, and more until they cover MIN_TIMED_S: a
    20-batch median of 3 ms batches spans 60 ms, which one burst of someone
    else's load on a shared machine can cover whole. ``fn(i)`` gets the input
    set ``i % inputs``.
    """
    wall, cpu = [], []
    i = 0
    while i < warmup + batches or (sum(wall) < MIN_TIMED_S and i < warmup + MAX_BATCHES):
        t0, c0 = time.perf_counter(), time.process_time()
        fn(i % inputs)
        t1, c1 = time.perf_counter(), time.process_time()
        if i >= warmup:
            wall.append(t1 - t0)
            cpu.append(c1 - c0)
        i += 1
    return statistics.median(wall), statistics.median(cpu)


def _worker(cfg: dict) -> dict:
    import numpy as np

    kind, size, dtype, threads = cfg["kind"], cfg["size"], cfg["dtype"], cfg["threads"]
    out_size = cfg.get("out_size", size)
    batches, warmup = cfg["batches"], cfg["warmup"]
    rng = np.random.default_rng(1)
    np_dtype = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8}[dtype]
    out_elems = BATCH * 3 * out_size * out_size
    moved = BATCH * size * size * 3 + out_elems * np.dtype(np_dtype).itemsize  # read + written per batch

    if kind == "copy":
        a = np.empty(moved // 2, np.uint8)
        b = np.empty_like(a)
        a[:] = 1
        b[:] = 2
        t, cpu = _time_batches(lambda i: np.copyto(b, a), batches, warmup, 1)
        return {"batch_s": t, "cpu_s": cpu, "bytes_per_batch": 2 * a.nbytes}

    src = _make_source(np, size)
    n = len(src)
    idx = [rng.integers(0, n, BATCH).astype(np.int64) for _ in range(warmup + batches)]
    flips = [rng.integers(0, 2, BATCH).astype(np.uint8) for _ in range(warmup + batches)]
    out = np.empty((BATCH, 3, out_size, out_size), np_dtype)
    out[...] = 0
    crop = kind.endswith("crop")
    boxes = [_boxes(np, rng, BATCH, size) for _ in range(warmup + batches)] if crop else None

    if kind.startswith("tbl"):
        import tbl_kernels as tk

        tk.set_num_threads(threads)
        table = None if dtype == "uint8" else tk.normalization_table(MEAN, STD, dtype)
        if crop:

            def fn(i):
                tk.gather_crop_resize([src], idx[i], boxes[i], out, table, flip=flips[i], layout="CHW")
        elif table is None:

            def fn(i):
                tk.gather_u8([src], idx[i], out, layout="CHW")
        else:

            def fn(i):
                tk.gather_normalize([src], idx[i], out, table, layout="CHW")

        info = {"simd": tk.simd_level(), "version": tk.__version__}
    else:  # turboloader
        import turboloader as t

        if crop:
            # TurboLoader's crop windows are (x, y, w, h) float32.
            tl_boxes = [bx[:, [1, 0, 3, 2]].astype(np.float32) for bx in boxes]

            def fn(i):
                t.crop_resize_normalize_u8_gather(src, idx[i], tl_boxes[i], flips[i], out, mean=MEAN, std=STD)
        else:

            def fn(i):
                t.normalize_u8_gather(src, idx[i], out, mean=MEAN, std=STD)

        info = {"version": getattr(t, "__version__", "?")}
    t_batch, cpu = _time_batches(fn, batches, warmup, len(idx))
    return {
        "batch_s": t_batch,
        "cpu_s": cpu,
        "bytes_per_batch": int(moved),
        "source_bytes": int(src.nbytes),
        **info,
    }


# ----------------------------------------------------------------------------- driver side


def _configs(quick: bool, peer: bool) -> list[dict]:
    batches, warmup = (5, 2) if quick else (20, 3)
    base = {"batches": batches, "warmup": warmup}
    cfgs = []
    sizes = (224,) if quick else (160, 224)
    for size in sizes:
        cfgs.append({"name": f"copy-{size}", "kind": "copy", "size": size, "dtype": "float32", "threads": 1})
        for threads in (1, 2):
            for dtype in ("float32", "float16", "bfloat16", "uint8"):
                cfgs.append(
                    {
                        "name": f"tbl-{size}-{dtype}-{threads}t",
                        "kind": "tbl",
                        "size": size,
                        "dtype": dtype,
                        "threads": threads,
                    }
                )
        if peer:
            for dtype in ("float32", "float16"):
                cfgs.append(
                    {
                        "name": f"turboloader-{size}-{dtype}",
                        "kind": "turboloader",
                        "size": size,
                        "dtype": dtype,
                        "threads": 2,
                    }
                )
    for threads in (1, 2):
        for dtype in ("float32", "float16", "uint8"):
            cfgs.append(
                {
                    "name": f"tbl-crop-256to224-{dtype}-{threads}t",
                    "kind": "tbl-crop",
                    "size": 256,
                    "out_size": 224,
                    "dtype": dtype,
                    "threads": threads,
                }
            )
    if peer:
        cfgs.append(
            {
                "name": "turboloader-crop-256to224-float32",
                "kind": "turboloader-crop",
                "size": 256,
                "out_size": 224,
                "dtype": "float32",
                "threads": 2,
            }
        )
    return [{**base, **c} for c in cfgs]


def _run(cfg: dict, python: str) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(cfg["threads"])
    cmd = [python, os.path.abspath(__file__), "--worker", json.dumps(cfg)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _print_row(cfg: dict, r: dict) -> None:
    if "error" in r:
        print(f"{cfg['name']:36} failed: {r['error']}")
        return
    copy = cfg["kind"] == "copy"
    ips = "" if copy else f"{BATCH / r['batch_s']:10.0f}"
    cps = "" if copy else f"{BATCH / max(r['cpu_s'], 1e-9):10.0f}"
    gbs = r["bytes_per_batch"] / r["batch_s"] / 1e9
    print(f"{cfg['name']:36} {ips:>10} {gbs:11.2f} {r['batch_s'] * 1e3:9.1f} {cps:>10}", flush=True)


def _median_round(runs: list[dict]) -> dict:
    """One configuration over its rounds: median batch and CPU time, every round kept."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    out = dict(ok[0])
    out["batch_s"] = statistics.median(r["batch_s"] for r in ok)
    out["cpu_s"] = statistics.median(r["cpu_s"] for r in ok)
    if len(runs) > 1:
        out["rounds_batch_s"] = [r.get("batch_s") for r in runs]
    return out


def _ratios(results: dict) -> dict:
    def rate(name):
        r = results.get(name, {})
        return BATCH / r["batch_s"] if "batch_s" in r else None

    def gbs(name):
        r = results.get(name, {})
        return r["bytes_per_batch"] / r["batch_s"] / 1e9 if "batch_s" in r else None

    ratios = {}
    for size in (160, 224):
        f32 = f"tbl-{size}-float32-2t"
        if f32 not in results:
            continue
        if gbs(f"copy-{size}"):
            ratios[f"{size}: float32 2t bytes/s vs copy"] = gbs(f32) / gbs(f"copy-{size}")
        for dtype in ("float16", "bfloat16", "uint8"):
            if rate(f"tbl-{size}-{dtype}-2t"):
                ratios[f"{size}: {dtype} vs float32 images/s (2t)"] = rate(f"tbl-{size}-{dtype}-2t") / rate(
                    f32
                )
        for dtype in ("float32", "float16"):
            peer = f"turboloader-{size}-{dtype}"
            if rate(peer):
                ratios[f"{size}: {dtype} tbl 2t vs turboloader"] = rate(f"tbl-{size}-{dtype}-2t") / rate(peer)
        if rate(f"tbl-{size}-float32-1t"):
            ratios[f"{size}: float32 2t vs 1t"] = rate(f32) / rate(f"tbl-{size}-float32-1t")
    crop = "tbl-crop-256to224-float32"
    if rate(f"{crop}-2t") and rate(f"{crop}-1t"):
        ratios["crop float32 2t vs 1t"] = rate(f"{crop}-2t") / rate(f"{crop}-1t")
    if rate("turboloader-crop-256to224-float32") and rate(f"{crop}-2t"):
        ratios["crop float32 tbl 2t vs turboloader"] = rate(f"{crop}-2t") / rate(
            "turboloader-crop-256to224-float32"
        )
    return ratios


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tbl_bench.suites.kernels", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--quick", action="store_true", help="fewer batches, 224 px only")
    ap.add_argument("--peer-python", help="python of an environment with turboloader + numpy")
    ap.add_argument("--json", help="also write the JSON results here")
    ap.add_argument("--only", help="run only configurations whose name contains this")
    ap.add_argument("--rounds", type=int, default=1, help="run every configuration N times, round-robin; report medians")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(_worker(json.loads(args.worker))))
        return 0
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")

    peer = args.peer_python
    if peer and not os.path.exists(peer):
        print(f"peer python {peer} does not exist", file=sys.stderr)
        return 2
    if not peer:
        print("turboloader: skipped (pass --peer-python PATH, an interpreter with turboloader and numpy)")
    results = {}
    load_before = os.getloadavg()
    # images per CPU-second (all threads) is shown beside the wall-clock rate: on a
    # shared machine it tells compute cost apart from time spent waiting for a core.
    print(f"{'configuration':36} {'images/s':>10} {'GB/s moved':>11} {'batch ms':>9} {'img/cpu-s':>10}")
    configs = [c for c in _configs(args.quick, bool(peer)) if not args.only or args.only in c["name"]]
    rounds: dict[str, list[dict]] = {c["name"]: [] for c in configs}
    for k in range(args.rounds):
        if args.rounds > 1:
            print(f"round {k + 1} of {args.rounds}")
        for cfg in configs:
            python = peer if cfg["kind"].startswith("turboloader") else sys.executable
            r = _run(cfg, python)
            rounds[cfg["name"]].append(r)
            _print_row(cfg, r)
    for cfg in configs:
        results[cfg["name"]] = {**cfg, **_median_round(rounds[cfg["name"]])}
    if args.rounds > 1:
        print(f"median of {args.rounds} rounds")
        for cfg in configs:
            _print_row(cfg, results[cfg["name"]])
    ratios = _ratios(results)
    print()
    for k, v in ratios.items():
        print(f"{k:44} {v:6.2f}")
    # The machine may be shared: the load average says how much to trust wall-clock rates.
    print(f"load average before: {load_before}, after: {os.getloadavg()}")
    payload = {
        "suite": "kernels",
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "batch": BATCH,
        "source_bytes_min": SOURCE_BYTES,
        "cpu_count": os.cpu_count(),
        "rounds": args.rounds,
        "results": results,
        "ratios": ratios,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=1)
    print(json.dumps(payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
