"""Pytree reads in one process: TBL's PyTreeDataset against litdata's StreamingDataset on the same rows.

Workload: ``--rows`` (default 80,000) rows of ``{"id": int, "score": float,
"name": str, "flag": bool}``. Configurations, each in its own subprocess:

=================  ==========================================================
tbl/iter           ``for row in PyTreeDataset(path)`` (file order)
tbl/item           ``ds[i]`` over a random permutation of every row
tbl/batch-fixed    ``get_batch`` of 256 random rows, fixed-size leaves
                   (``leaves=["id", "score", "flag"]``)
tbl/batch-all      ``get_batch`` of 256 random rows, every leaf (str included)
ram/take-fixed     floor: ``np.take`` of the same three columns held in RAM
litdata/iter       ``for row in StreamingDataset(dir)`` (litdata 0.2.76, file order)
litdata/item       ``StreamingDataset[i]`` over random rows
=================  ==========================================================

Every configuration fetches rows and does nothing else with them (the
*produce* level). Figures are the median rate over at least ``--epochs`` epochs
after one warm-up epoch, and over as many more as fill one second; drawing each
epoch's random indices is not timed. litdata runs in ``--peer-python`` (an interpreter with
litdata installed); without it those rows are skipped with a message.

    python -m tbl_bench.suites.pytree_read --peer-python /tmp/peervenv/bin/python

This file is also the child program: it imports only the standard library and
numpy at module level, so the peer interpreter can run it by path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

BATCH = 256
CONFIGS = (
    "tbl/iter", "tbl/item", "tbl/batch-fixed", "tbl/batch-all", "ram/take-fixed", "litdata/iter", "litdata/item",
)
TARGETS = {"tbl/iter": 420_000, "tbl/item": 300_000, "tbl/batch-fixed": 5_000_000}
LITDATA_ITEM_ROWS = 2_000  # litdata's random access is slow: time a fixed subset per epoch


def sample(i: int) -> dict:
    return {"id": i, "score": i * 0.25, "name": f"sample-{i:08d}", "flag": i % 3 == 0}


def _litdata_sample(i: int) -> dict:
    return sample(i)


# ---- children ----------------------------------------------------------------------------------


MIN_TIMED_S = 1.0  # timed epochs continue past --epochs until they cover this much wall time
MAX_EPOCHS = 200


def _epochs(run, order, epochs: int) -> list[float]:
    """Rates (items/s) of at least ``epochs`` timed epochs after one warm-up.

    ``order(epoch)`` makes the epoch's indices (not timed: drawing a permutation
    is not the dataset's work); ``run(indices)`` reads them and returns the
    number of items. Epochs continue until they cover MIN_TIMED_S, so that a
    fast configuration's median is not a handful of 10 ms epochs that one burst
    of someone else's load on a shared machine can cover.
    """
    run(order(0))
    rates: list[float] = []
    elapsed = 0.0
    e = 1
    while e <= epochs or (elapsed < MIN_TIMED_S and e <= MAX_EPOCHS):
        indices = order(e)
        t = time.perf_counter()
        n = run(indices)
        dt = time.perf_counter() - t
        rates.append(n / dt)
        elapsed += dt
        e += 1
    return rates


def _batches(rows: int, epoch: int) -> list[np.ndarray]:
    perm = np.random.default_rng(epoch).permutation(rows)
    return [perm[a : a + BATCH] for a in range(0, rows, BATCH)]


def child(config: str, workdir: Path, rows: int, epochs: int, shards: int) -> dict:
    tbl_path = workdir / f"tbl-{rows}-{shards}"
    lit_path = workdir / f"litdata-{rows}"
    info: dict = {}

    def order(epoch: int) -> None:  # in-order iteration needs no indices
        return None

    if config.startswith("tbl/"):
        from tbl_loader.pytree import PyTreeDataset

        kind = config.split("/")[1]
        ds = PyTreeDataset(tbl_path, leaves=["id", "score", "flag"] if kind == "batch-fixed" else None)
        if kind == "iter":
            def run(_: None) -> int:
                n = 0
                for _ in ds:
                    n += 1
                return n
        elif kind == "item":
            def order(epoch: int) -> list[int]:
                return np.random.default_rng(epoch).permutation(rows).tolist()

            def run(perm: list[int]) -> int:
                for i in perm:
                    ds[i]
                return len(perm)
        else:
            order = partial(_batches, rows)

            def run(batches: list[np.ndarray]) -> int:
                get_batch = ds.get_batch
                for b in batches:
                    get_batch(b)
                return rows
    elif config == "ram/take-fixed":
        cols = [np.arange(rows, dtype=np.int64), np.arange(rows) * 0.25, np.arange(rows) % 3 == 0]
        order = partial(_batches, rows)

        def run(batches: list[np.ndarray]) -> int:
            for b in batches:
                for c in cols:
                    c.take(b)
            return rows
    elif config.startswith("litdata/"):
        import litdata

        info["litdata"] = litdata.__version__
        ds = litdata.StreamingDataset(input_dir=str(lit_path), shuffle=False)
        if config == "litdata/iter":
            def run(_: None) -> int:
                n = 0
                for _ in ds:
                    n += 1
                return n
        else:
            def order(epoch: int) -> list[int]:
                return np.random.default_rng(epoch).permutation(rows)[:LITDATA_ITEM_ROWS].tolist()

            def run(idx: list[int]) -> int:
                for i in idx:
                    ds[i]
                return len(idx)
    else:
        raise ValueError(f"unknown configuration {config!r}")
    rates = _epochs(run, order, epochs)
    return {"config": config, "median": statistics.median(rates), "rates": rates, **info}


def prepare_litdata(workdir: Path, rows: int) -> None:
    import litdata

    litdata.optimize(fn=_litdata_sample, inputs=list(range(rows)), output_dir=str(workdir / f"litdata-{rows}"),
                     chunk_bytes="64MB", num_workers=1, verbose=False, mode="overwrite")


# ---- parent ------------------------------------------------------------------------------------


def prepare_tbl(workdir: Path, rows: int, shards: int) -> None:
    path = workdir / f"tbl-{rows}-{shards}"
    if not path.exists():
        from tbl_loader.pytree import write

        # One shard is a single .tbl file (what write() makes without shard options).
        kwargs = {"shard_rows": -(-rows // shards)} if shards > 1 else {}
        write((sample(i) for i in range(rows)), path, **kwargs)


def _run_child(python: str, config: str, args: argparse.Namespace) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--child", config, "--workdir", str(args.workdir),
           "--rows", str(args.rows), "--epochs", str(args.epochs), "--shards", str(args.shards)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"config": config, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=80_000)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--shards", type=int, default=1, help="TBL shard files (1: a single .tbl file)")
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "tbl-bench-pytree")
    parser.add_argument("--peer-python", help="interpreter with litdata installed (runs the litdata rows)")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child == "prepare-litdata":
            prepare_litdata(args.workdir, args.rows)
            print(json.dumps({"ok": True}))
        else:
            print(json.dumps(child(args.child, args.workdir, args.rows, args.epochs, args.shards)))
        return 0

    args.workdir.mkdir(parents=True, exist_ok=True)
    prepare_tbl(args.workdir, args.rows, args.shards)
    results = []
    peer = args.peer_python
    if peer and not (args.workdir / f"litdata-{args.rows}").exists():
        prep = _run_child(peer, "prepare-litdata", args)
        if "error" in prep:
            print(f"litdata: preparing the data failed ({prep['error']}); skipping litdata", file=sys.stderr)
            peer = None
    for config in args.configs:
        if config.startswith("litdata/"):
            if not peer:
                print(f"{config}: skipped (pass --peer-python with litdata installed)", file=sys.stderr)
                continue
            results.append(_run_child(peer, config, args))
        else:
            results.append(_run_child(sys.executable, config, args))

    by = {r["config"]: r for r in results if "median" in r}
    print(f"\nPytree reads, {args.rows:,} rows of {{int, float, str, bool}} in {args.shards} TBL shard(s); "
          f"median of >= {args.epochs} epochs (and >= {MIN_TIMED_S:g} s), items/s")
    print(f"{'config':<18}{'items/s':>14}  {'target':>12}  note")
    for r in results:
        if "error" in r:
            print(f"{r['config']:<18}{'error':>14}  {'':>12}  {r['error']}")
            continue
        target = TARGETS.get(r["config"])
        mark = "" if target is None else ("ok" if r["median"] >= target else "BELOW")
        print(f"{r['config']:<18}{r['median']:>14,.0f}  {target or '':>12}  {mark}")
    ratios = {}
    for ours, theirs in (("tbl/iter", "litdata/iter"), ("tbl/item", "litdata/item")):
        if ours in by and theirs in by:
            ratios[f"{ours} / {theirs}"] = by[ours]["median"] / by[theirs]["median"]
    if "tbl/batch-fixed" in by and "ram/take-fixed" in by:
        ratios["tbl/batch-fixed / ram/take-fixed"] = by["tbl/batch-fixed"]["median"] / by["ram/take-fixed"]["median"]
    for name, value in ratios.items():
        print(f"ratio {name}: {value:.2f}x")
    report = {"suite": "pytree_read", "rows": args.rows, "shards": args.shards, "epochs": args.epochs, "results": results, "ratios": ratios}
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
