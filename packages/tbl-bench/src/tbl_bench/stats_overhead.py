"""What the per-stage clocks of ``loader.stats()`` cost: one loader, epochs with the clocks on and off in turn.

    python -m tbl_bench.stats_overhead DATASET [--batch-size 64] [--crop 224] [--threads T] [--pairs 12]
                                       [--json OUT.json]

``DATASET`` is an image ``.tbl`` (fixed or variable size; ``--crop S`` serves RandomResizedCrop(S) + flip,
which variable-size storage needs). One ``ImageLoader`` in this process serves ``--pairs`` pairs of
epochs at the consume level (every element of every batch summed), one epoch of each pair with the stage
clocks on (the default) and one with them off (``loader.time_stages(False)``), the pair's order
alternating (on-off, off-on, ...) so that a drift of the machine's load falls on both sides alike. The
figure is each pair's ``off / on`` epoch time ratio minus one: the clocks' cost, as a fraction of the
epoch; printed per pair, then the median and the range, with the load average.

Why not the suites' ``stats-off`` configurations: those run each side in its own process, rounds apart,
and on a shared 2-core machine the spread between rounds (tens of percent) hides a cost of a percent.
Here both sides share the process, the maps and the page cache, and follow each other within seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "measure"]


def _epoch(loader: Any) -> tuple[float, int]:
    from tbl_bench.levels import consume_batch

    start = time.perf_counter()
    n = 0
    for batch in loader:
        consume_batch(batch.images, "consume")
        n += 1
    return time.perf_counter() - start, n


def measure(path: str, *, batch_size: int = 64, crop: int | None = None, threads: int | None = None,
            pairs: int = 12) -> dict[str, Any]:
    """``pairs`` pairs of epochs of one loader, stage clocks on and off in alternating order; per pair the
    seconds of each side and ``on / off - 1``."""
    from tbl_loader import ImageLoader, RandomResizedCrop

    options = {"random_resized_crop": RandomResizedCrop(crop), "hflip": 0.5} if crop else {}
    loader = ImageLoader(path, batch_size, shuffle=True, seed=0, num_threads=threads, **options)
    rows = []
    try:
        _epoch(loader)  # warm-up: maps, page cache, thread pools
        for k in range(pairs):
            seconds = {}
            for side in (("on", "off") if k % 2 == 0 else ("off", "on")):
                loader.time_stages(side == "on")
                seconds[side], batches = _epoch(loader)
            rows.append({"on_s": seconds["on"], "off_s": seconds["off"], "batches": batches,
                         "overhead": seconds["on"] / seconds["off"] - 1})
    finally:
        loader.close()
    costs = [r["overhead"] for r in rows]
    return {"dataset": path, "batch_size": batch_size, "crop": crop, "threads": threads, "pairs": rows,
            "median_overhead": statistics.median(costs), "min_overhead": min(costs), "max_overhead": max(costs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.stats_overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("dataset")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--crop", type=int, default=None, help="serve RandomResizedCrop(CROP) + flip")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error("--pairs must be >= 1")
    load = os.getloadavg()
    out = measure(args.dataset, batch_size=args.batch_size, crop=args.crop, threads=args.threads, pairs=args.pairs)
    out["load_before"], out["load_after"] = list(load), list(os.getloadavg())
    for k, r in enumerate(out["pairs"]):
        print(f"pair {k:2d}: clocks on {r['on_s']:.3f} s, off {r['off_s']:.3f} s ({r['batches']} batches): "
              f"{r['overhead']:+.2%}")
    print(f"{Path(args.dataset).name}: the stage clocks cost {out['median_overhead']:+.2%} of an epoch (median of "
          f"{args.pairs} pairs; range {out['min_overhead']:+.2%} to {out['max_overhead']:+.2%}); load "
          f"{load[0]:.2f} before, {out['load_after'][0]:.2f} after")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
