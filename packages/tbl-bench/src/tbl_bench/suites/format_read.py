"""Pytree row reads from tbl_format: in-order iteration and random ds[i], against litdata on the same rows.

    python -m tbl_bench.suites.format_read [--quick] [--epochs 5] [--litdata-python PATH]

Rows: 80,000 dicts {"i": int, "f": float, "s": str, "b": bool}, written once
with `tbl_format.write` (and, when litdata is available, with
`litdata.optimize`). Every configuration runs in a fresh subprocess: one
warm-up epoch, then `--epochs` timed epochs; the figure is items/s of the
median epoch. Two consumption levels: *produce* (the row is fetched and
dropped) and *consume* (every leaf is read: ints and floats summed, string
lengths added). Random order is one permutation per epoch (litdata reads the first
2,000 of it per epoch: its ds[i] is slow enough that all 80,000 would take
hours; the rate is what is compared).

Targets (produce): in order >= 400,000 items/s, random >= 300,000 items/s.

Peers: litdata 0.2.76 `StreamingDataset` (iteration and `ds[i]`, in the main
process, no DataLoader workers, like tbl_format here). litdata runs under the
interpreter given by `--litdata-python` / `TBL_BENCH_LITDATA_PYTHON`, or this
one when it imports litdata; otherwise its rows say skipped. Floor: the same
rows as a Python list of dicts in RAM.

Prints a table, then the whole result as JSON on the last line. The module
imports only the standard library at top level so that a peer's interpreter
can run its child mode by path.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS = 80_000
QUICK_ROWS = 20_000
TARGETS = {"sequential": 400_000, "random": 300_000}
ORDERS = ("sequential", "random")
# litdata's ds[i] runs at a few hundred items/s here; its random epochs read this many rows of the
# permutation (not all of them), so a run takes minutes, not hours. The rate is what is compared.
LITDATA_RANDOM_READS = 2_000
LEVELS = ("produce", "consume")


def make_row(i: int) -> dict:
    """Row i of the benchmark dataset (module level so that litdata's worker processes can pickle it)."""
    return {"i": i, "f": i * 0.25, "s": f"item-{i:06d}", "b": i % 3 == 0}


def _consume(row: dict) -> float:
    return row["i"] + row["f"] + len(row["s"]) + row["b"]


def _epoch_order(n: int, order: str, epoch: int, limit: int) -> list[int] | None:
    if order == "sequential":
        return None
    perm = list(range(n))
    random.Random(1000 + epoch).shuffle(perm)
    return perm[:limit]


def _run_epochs(open_rows, n: int, order: str, level: str, warmup: int, epochs: int, limit: int) -> list[float]:
    """Time epochs of reading rows from the object open_rows() returns (len/getitem/iter).

    A sequential epoch reads all n rows; a random epoch reads the first `limit` of a fresh permutation.
    """
    ds = open_rows()
    times = []
    for e in range(warmup + epochs):
        perm = _epoch_order(n, order, e, limit)
        t = time.perf_counter()
        count = 0
        if level == "produce":
            if perm is None:
                for _row in ds:
                    count += 1
            else:
                get = ds.__getitem__
                for i in perm:
                    get(i)
                    count += 1
        else:
            acc = 0.0
            if perm is None:
                for row in ds:
                    acc += _consume(row)
                    count += 1
            else:
                get = ds.__getitem__
                for i in perm:
                    acc += _consume(get(i))
                    count += 1
        dt = time.perf_counter() - t
        if count != (n if perm is None else len(perm)):
            raise RuntimeError(f"epoch {e} read {count} rows")
        if e >= warmup:
            times.append(dt)
    return times


# ---- child mode: one configuration per process --------------------------------------------------


def child(cfg: dict) -> dict:
    tool, n = cfg["tool"], cfg["rows"]
    if tool == "litdata-optimize":
        import litdata

        t = time.perf_counter()
        litdata.optimize(fn=make_row, inputs=list(range(n)), output_dir=cfg["path"], chunk_bytes="64MB",
                         num_workers=1, mode="overwrite")
        return {"optimize_s": time.perf_counter() - t}
    if tool == "tbl_format":
        import tbl_format

        def open_rows():
            return tbl_format.open(cfg["path"])
    elif tool == "litdata":
        import litdata

        def open_rows():
            return litdata.StreamingDataset(cfg["path"])
    elif tool == "list":
        rows = [make_row(i) for i in range(n)]

        def open_rows():
            return rows
    else:
        raise ValueError(f"unknown tool {tool!r}")
    t = time.perf_counter()
    probe = open_rows()
    setup = time.perf_counter() - t
    if probe[n - 1] != make_row(n - 1) or probe[0] != make_row(0):
        raise RuntimeError(f"{tool} does not return the rows that were written: {probe[0]!r}")
    times = _run_epochs(open_rows, n, cfg["order"], cfg["level"], cfg["warmup"], cfg["epochs"], cfg["limit"])
    return {"epochs_s": times, "setup_s": setup}


def _spawn(python: str, cfg: dict) -> dict:
    out = subprocess.run([python, str(Path(__file__).resolve()), "--child", json.dumps(cfg)], capture_output=True,
                         text=True, check=False, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{cfg['tool']} child failed ({out.returncode}): {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _litdata_python(arg: str | None) -> str | None:
    candidates = [arg, os.environ.get("TBL_BENCH_LITDATA_PYTHON"), sys.executable]
    for py in candidates:
        if not py:
            continue
        ok = subprocess.run([py, "-c", "import litdata, sys; sys.exit(litdata.__version__ != '0.2.76')"],
                            capture_output=True, check=False)
        if ok.returncode == 0:
            return py
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows, 2 timed epochs")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--litdata-python", default=None, help="interpreter with litdata==0.2.76 installed")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(json.loads(args.child))))
        return 0

    n = QUICK_ROWS if args.quick else ROWS
    epochs = 2 if args.quick else args.epochs
    lit_py = _litdata_python(args.litdata_python)
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="tbl-format-read-") as tmp:
        import tbl_format

        t = time.perf_counter()
        tbl_path = tbl_format.write((make_row(i) for i in range(n)), Path(tmp) / "rows.tbl")
        write_s = time.perf_counter() - t
        lit_dir = Path(tmp) / "litdata"
        lit_info: dict = {"status": "skipped", "reason": "litdata 0.2.76 is not importable (see --litdata-python)"}
        if lit_py is not None:
            try:
                lit_info = {"status": "ok", "python": lit_py,
                            **_spawn(lit_py, {"tool": "litdata-optimize", "rows": n, "path": str(lit_dir)})}
            except RuntimeError as exc:
                lit_info = {"status": "failed", "reason": str(exc)[-500:]}
        for order in ORDERS:
            for level in LEVELS:
                base = {"rows": n, "order": order, "level": level, "warmup": args.warmup, "epochs": epochs}
                runs = [("tbl_format", sys.executable, str(tbl_path), n), ("list", sys.executable, "", n)]
                if lit_info["status"] == "ok":
                    runs.append(("litdata", lit_py, str(lit_dir), LITDATA_RANDOM_READS))
                for tool, py, path, limit in runs:
                    r = _spawn(py, {**base, "tool": tool, "path": path, "limit": limit})
                    med = statistics.median(r["epochs_s"])
                    items = n if order == "sequential" else min(n, limit)
                    results.append({"tool": tool, "order": order, "level": level, "items_per_epoch": items,
                                    "items_per_s": items / med, "median_s": med, "epochs_s": r["epochs_s"],
                                    "setup_s": r["setup_s"]})

    def rate(tool: str, order: str, level: str) -> float | None:
        for r in results:
            if (r["tool"], r["order"], r["level"]) == (tool, order, level):
                return r["items_per_s"]
        return None

    ratios = {}
    for order in ORDERS:
        for level in LEVELS:
            lit = rate("litdata", order, level)
            if lit:
                ratios[f"{order}/{level}: tbl_format / litdata"] = rate("tbl_format", order, level) / lit
    meets = {order: rate("tbl_format", order, "produce") >= TARGETS[order] for order in ORDERS}
    result = {"suite": "format_read", "rows": n, "epochs": epochs, "warmup": args.warmup, "targets": TARGETS,
              "tbl_write_s": write_s, "litdata": lit_info, "results": results, "ratios": ratios,
              "meets_target": meets, "python": platform.python_version(), "cpus": os.cpu_count()}

    print(f"pytree reads, {n:,} rows of {{int, float, str, bool}}; items/s of the median of {epochs} epochs")
    print(f"{'tool':12} {'order':11} {'level':8} {'items/s':>12} {'setup s':>8}")
    for r in results:
        print(f"{r['tool']:12} {r['order']:11} {r['level']:8} {r['items_per_s']:12,.0f} {r['setup_s']:8.3f}")
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    if lit_info["status"] != "ok":
        print(f"litdata: {lit_info['status']}: {lit_info.get('reason', '')}")
    else:
        print(f"litdata optimize: {lit_info['optimize_s']:.2f} s; tbl_format.write: {write_s:.2f} s")
    for order in ORDERS:
        print(f"target {order} produce >= {TARGETS[order]:,}: {'met' if meets[order] else 'MISSED'}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
