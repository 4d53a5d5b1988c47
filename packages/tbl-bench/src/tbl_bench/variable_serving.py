"""TBL's three image storages served side by side: fixed raw, variable raw, variable JPEG.

    python -m tbl_bench.variable_serving FIXED.tbl RAW.tbl JPEG.tbl [--batch 256] [--size 224] [--epochs 3]

Each storage is served with RandomResizedCrop(size) + flip, float32 CHW, at
the consume level (every batch reduced, `tbl_bench.levels`), each in its own
subprocess; printed: the median images/s over the epochs after one warm-up
epoch. A tool-local comparison (no peer tools): the full peer comparison
belongs to ``tbl bench``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

__all__ = ["main"]


def _child(path: str, batch: int, size: int, epochs: int, threads: int | None) -> dict:
    from tbl_loader import ImageLoader, RandomResizedCrop

    from .levels import consume_batch

    loader = ImageLoader(path, batch, seed=0, hflip=0.5, random_resized_crop=RandomResizedCrop(size),
                         backend="numpy", num_threads=threads, prefetch=2)
    rates = []
    for epoch in range(epochs + 1):
        loader.set_epoch(epoch)
        t, n = time.perf_counter(), 0
        for b in loader:
            consume_batch(b.images, "consume")
            n += len(b.indices)
        if epoch:  # the first epoch warms the page cache and the thread pools
            rates.append(n / (time.perf_counter() - t))
    loader.close()
    return {"path": path, "images_per_s": sorted(rates)[len(rates) // 2], "epochs": rates}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.variable_serving", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.paths[0], args.batch, args.size, args.epochs, args.threads)))
        return 0
    for path in args.paths:
        cmd = [sys.executable, "-m", "tbl_bench.variable_serving", "--child", path, "--batch", str(args.batch),
               "--size", str(args.size), "--epochs", str(args.epochs)]
        if args.threads is not None:
            cmd += ["--threads", str(args.threads)]
        print(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
