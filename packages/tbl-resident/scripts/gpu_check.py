"""Device check for tbl-resident: parity tests, serving throughput and upload speed on one device.

Run from the repository root (``scripts/gpu_check.sh`` sets up the import path):

    python packages/tbl-resident/scripts/gpu_check.py                       # CUDA, full sizes
    python packages/tbl-resident/scripts/gpu_check.py --device cpu --quick  # tiny, anywhere

Steps, each reported:

1. ``pytest -k <device>`` on tbl-resident's tests (the CUDA / MPS parity and
   resume tests that skip without the device; on ``cpu`` the whole suite).
2. A synthetic dataset (random uint8 images, ``--dataset-gb`` of them at
   ``--size`` px; written as parallel parts and merged) in a temporary folder
   that is deleted at the end.
3. Pinned host-to-device bandwidth (a pinned buffer copied to the device), then
   the loader's upload of the dataset: seconds and the ratio to that bandwidth.
4. Serving: images/s of ``ResidentImageLoader`` (shuffled, ``--batch`` images,
   float16 and float32, plus float16 with flips and random-resized crops),
   median over timed epochs after warm-up, the device synchronized at each
   epoch's end; next to it, in the same run, a device-to-device copy of the same
   output bytes per batch (what a loader that only wrote its output would reach).

Goals checked on CUDA at full size: >= 1,000,000 images/s in float16 at 160 px,
and an upload within 2x of the pinned host-to-device bandwidth. Prints a table
and writes everything as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

GOAL_IMAGES_PER_S = 1_000_000
GOAL_UPLOAD_RATIO = 2.0
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def _log(msg: str) -> None:
    print(msg, flush=True)


# ---- data --------------------------------------------------------------------------------------


def _write_part(args: tuple[str, int, int, int, int]) -> str:
    """Write rows [lo, hi) as one part file; images repeat a per-part random block (content is irrelevant
    to throughput, and generating 7.7 GB of random bytes would dominate the check)."""
    import tbl_format

    path, lo, hi, size, seed = args
    block = np.random.default_rng(seed).integers(0, 256, (min(512, hi - lo), size, size, 3), dtype=np.uint8)

    def samples():
        for i in range(lo, hi):
            yield {"image": block[(i - lo) % len(block)], "label": np.int64(i % 1000)}

    tbl_format.write(samples(), path, metadata={"source": "tbl-resident gpu_check"})
    return path


def make_dataset(root: Path, count: int, size: int, workers: int) -> Path:
    import tbl_format

    parts_dir = root / "parts"
    parts_dir.mkdir()
    nparts = max(1, min(workers, count // 256 or 1))
    bounds = np.linspace(0, count, nparts + 1).astype(int)
    jobs = [(str(parts_dir / f"part{k:03d}.tbl"), int(bounds[k]), int(bounds[k + 1]), size, k)
            for k in range(nparts)]
    if nparts == 1:
        parts = [_write_part(jobs[0])]
    else:
        # spawn: the parent may already hold CUDA and torch's threads, which a forked child must not inherit.
        with ProcessPoolExecutor(nparts, mp_context=multiprocessing.get_context("spawn")) as pool:
            parts = list(pool.map(_write_part, jobs))
    return tbl_format.merge_manifests(parts, root / "dataset")


def pick_tmp(needed: int) -> str:
    """/dev/shm when it holds the dataset twice over (no disk in the way), else the system temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and shutil.disk_usage(shm).free > 2 * needed:
        return shm
    return tempfile.gettempdir()


# ---- device helpers ----------------------------------------------------------------------------


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def h2d_bandwidth(device, nbytes: int, reps: int = 5) -> float:
    """Best-of-``reps`` GB/s of one copy of ``nbytes`` from (pinned, on CUDA) host memory to ``device``."""
    import torch

    src = torch.ones(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = math.inf
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def copy_floor(device, batches: int, batch_bytes: int, images_per_batch: int, reps: int) -> dict:
    """Images/s of copying each batch's output bytes device-to-device (from a buffer larger than the cache)."""
    import torch

    pool = max(4 * batch_bytes, 1 << 30) if device.type == "cuda" else 4 * batch_bytes
    src = torch.ones(pool, dtype=torch.uint8, device=device)
    dst = torch.empty(batch_bytes, dtype=torch.uint8, device=device)
    slots = pool // batch_bytes
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        for k in range(batches):
            off = (k % slots) * batch_bytes
            dst.copy_(src[off : off + batch_bytes])
        sync(device)
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    return {"images_per_s": batches * images_per_batch / t, "gb_per_s": batches * batch_bytes / t / 1e9,
            "note": "read + write of the output bytes; GB/s counts the bytes written once"}


def serve_rate(loader, device, warmup: int, epochs: int) -> dict:
    """Median images/s over ``epochs`` timed epochs (after ``warmup``), synchronized at each epoch's end."""
    rates = []
    for epoch in range(warmup + epochs):
        loader.set_epoch(epoch)
        sync(device)
        t0 = time.perf_counter()
        n = 0
        for batch in loader:
            n += batch.images.shape[0]
        sync(device)
        dt = time.perf_counter() - t0
        if epoch >= warmup:
            rates.append(n / dt)
    return {"images_per_s": statistics.median(rates), "epochs": [round(r) for r in rates]}


# ---- steps -------------------------------------------------------------------------------------


def run_tests(device: str) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(PACKAGE_ROOT / "tests")]
    if device != "cpu":
        cmd += ["-k", device]
    _log(f"$ {' '.join(cmd)}")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=PACKAGE_ROOT / "tests")
    tail = (proc.stdout + proc.stderr).strip().splitlines()
    summary = tail[-1] if tail else ""
    if proc.returncode != 0:
        _log(proc.stdout[-6000:] + proc.stderr[-3000:])
    _log(f"tests: {summary} (exit {proc.returncode})")
    return {"command": cmd, "returncode": proc.returncode, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default=None, help="cuda (default when available), mps or cpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run, any device)")
    p.add_argument("--size", type=int, default=None, help="image side in px (default 160; quick 32)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 256; quick 64)")
    p.add_argument("--dataset-gb", type=float, default=None, help="dataset size (default 7.7; quick 0.006)")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs per configuration (default 5)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes writing the dataset")
    p.add_argument("--tmp", default=None, help="folder for the temporary dataset")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args(argv)

    import torch

    from tbl_resident import ResidentImageLoader
    from tbl_resident.device import resolve_device

    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.device or ("cuda" if torch.cuda.is_available() else None)
    if name is None:
        p.error("no CUDA device: pass --device cpu (or mps)")
    device = resolve_device(name)
    size = args.size or (32 if args.quick else 160)
    batch = args.batch or (64 if args.quick else 256)
    gb = args.dataset_gb if args.dataset_gb is not None else (0.006 if args.quick else 7.7)
    epochs = args.epochs or (2 if args.quick else 5)
    count = max(batch, int(gb * 1e9) // (size * size * 3))
    results: dict = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
        "size": size, "batch": batch, "images": count, "quick": args.quick,
    }
    if not args.skip_tests:
        results["tests"] = run_tests(device.type)

    nbytes = count * size * size * 3
    root = Path(tempfile.mkdtemp(prefix="tbl-resident-check-", dir=args.tmp or pick_tmp(nbytes)))
    try:
        t0 = time.perf_counter()
        path = make_dataset(root, count, size, args.workers)
        results["dataset"] = {"path": str(path), "bytes": nbytes, "write_s": round(time.perf_counter() - t0, 2)}
        _log(f"dataset: {count} images of {size}x{size}x3 = {nbytes / 1e9:.2f} GB written in "
             f"{results['dataset']['write_s']} s under {root}")

        h2d = h2d_bandwidth(device, min(nbytes, 1 << 30))
        results["h2d_gb_per_s"] = h2d
        configs = [
            ("float16", {"dtype": "float16"}),
            ("float32", {"dtype": "float32"}),
            ("float16+flip+crop", {"dtype": "float16", "hflip": 0.5, "crop": True}),
        ]
        serving = {}
        for label, cfg in configs:
            kwargs = {"dtype": cfg["dtype"], "hflip": cfg.get("hflip", 0.0)}
            if cfg.get("crop"):
                from tbl_loader import RandomResizedCrop

                kwargs["random_resized_crop"] = RandomResizedCrop(size)
            loader = ResidentImageLoader(path, batch, device=device, shuffle=True, seed=0,
                                         progress=not args.quick, **kwargs)
            if "upload" not in results:
                st = loader.upload_stats
                ideal = st.bytes / (h2d * 1e9)
                results["upload"] = {"bytes": st.bytes, "seconds": st.seconds, "host_copy_seconds": st.host_seconds,
                                     "gb_per_s": st.gb_per_s,
                                     "chunks": st.chunks, "pinned": st.pinned,
                                     "ratio_to_h2d": st.seconds / ideal}
                _log(f"upload: {st.bytes / 1e9:.2f} GB in {st.seconds:.3f} s = {st.gb_per_s:.1f} GB/s; pinned H2D "
                     f"{h2d:.1f} GB/s -> {st.seconds / ideal:.2f}x the H2D time (host copies out of the map: "
                     f"{st.host_seconds:.3f} s)")
            rate = serve_rate(loader, device, args.warmup, epochs)
            item = torch.empty((), dtype=getattr(torch, cfg["dtype"])).element_size()
            batch_bytes = batch * 3 * size * size * item
            floor = copy_floor(device, -(-count // batch), batch_bytes, batch, reps=3)
            rate["d2d_copy_same_bytes"] = floor
            rate["ratio_to_copy"] = rate["images_per_s"] / floor["images_per_s"]
            serving[label] = rate
            _log(f"serve {label:>18}: {rate['images_per_s']:>12,.0f} images/s   d2d copy of the same bytes "
                 f"{floor['images_per_s']:>12,.0f} images/s ({floor['gb_per_s']:.0f} GB/s)  "
                 f"ratio {rate['ratio_to_copy']:.2f}")
            loader.close()
            del loader
            if device.type == "cuda":
                torch.cuda.empty_cache()
        results["serving"] = serving
    finally:
        shutil.rmtree(root, ignore_errors=True)

    goals = {}
    if device.type == "cuda" and not args.quick:
        goals["float16_images_per_s>=1e6"] = results["serving"]["float16"]["images_per_s"] >= GOAL_IMAGES_PER_S
        goals["upload<=2x_h2d"] = results["upload"]["ratio_to_h2d"] <= GOAL_UPLOAD_RATIO
    results["goals"] = goals
    tests_ok = args.skip_tests or results["tests"]["returncode"] == 0
    for k, v in goals.items():
        _log(f"goal {k}: {'met' if v else 'NOT met'}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
        _log(f"results written to {args.out}")
    return 0 if tests_ok else 1


if __name__ == "__main__":
    sys.exit(main())
