"""Pytree batches through a torch DataLoader with 2 spawn workers: TBL's PyTreeDataset against litdata.

Workload: ``--rows`` (default 1,000,000) rows of ``{"vec": (64,) float32,
"name": str, "id": int}``, batch 256, shuffled, 2 workers started with
``spawn``, persistent across epochs. Configurations, each in its own subprocess:

===============  ==================================================================
tbl              ``DataLoader(PyTreeDataset(dir), batch_size=256, shuffle=True,
                 collate_fn=collate_identity, ...)``: one ``__getitems__`` call per
                 batch (kernel gather of ``vec`` and ``id``, row reads of ``name``);
                 numpy batches, ``torch.from_numpy`` in the consumer
litdata          ``StreamingDataLoader(StreamingDataset(dir, shuffle=True),
                 batch_size=256, ...)`` (litdata 0.2.76, torch's default collate)
===============  ==================================================================

The consumer sums ``vec`` and counts the names of every batch (the *consume*
level). Reported: rows/s (median over ``--epochs`` epochs after one warm-up
epoch) and the peak resident memory of the process tree (main process plus
workers), split into anonymous and file-backed pages (a tree sum: pages shared
between processes count once per process).

    python -m tbl_bench.suites.pytree_dataloader --peer-python /tmp/peervenv/bin/python

Imports only the standard library and numpy at module level: the peer
interpreter runs this file by path as the litdata child.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

BATCH = 256
WORKERS = 2
CONFIGS = ("tbl", "litdata")
PARTS = 8


def sample(i: int) -> dict:
    vec = (np.arange(64, dtype=np.float32) + np.float32(i % 1000)) * np.float32(0.5)
    return {"vec": vec, "name": f"row-{i:09d}", "id": i}


def part_samples(part: int, rows: int):
    """Rows of part ``part`` of ``PARTS`` (module-level: pickled into the writer processes)."""
    per = -(-rows // PARTS)
    return (sample(i) for i in range(part * per, min(rows, (part + 1) * per)))


# ---- peak RSS of the process tree (stdlib only: also runs in the peer interpreter) --------------


def _status(pid: int) -> tuple[int, int]:
    anon = file = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1])
                elif line.startswith("RssFile:"):
                    file = int(line.split()[1])
    except OSError:
        pass
    return anon, file


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


class PeakRss:
    """Samples RssAnon / RssFile of this process tree every 20 ms; keeps the peak of the sums (KiB)."""

    def __init__(self) -> None:
        self.anon = self.file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(0.02):
            anon = file = 0
            for p in _tree(me):
                a, f = _status(p)
                anon, file = anon + a, file + f
            self.anon, self.file = max(self.anon, anon), max(self.file, file)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        return {"peak_anon_mib": self.anon / 1024, "peak_file_mib": self.file / 1024}


# ---- children ----------------------------------------------------------------------------------


def _consume(batch: dict) -> int:
    import torch

    vec = batch["vec"]
    if not isinstance(vec, torch.Tensor):
        vec = torch.from_numpy(vec)  # tbl's batches arrive as fresh writable numpy arrays: zero-copy
    float(vec.sum())
    len(batch["name"])
    return int(batch["id"].shape[0])


def child(config: str, workdir: Path, rows: int, epochs: int) -> dict:
    rss = PeakRss()
    info: dict = {}
    if config == "tbl":
        from torch.utils.data import DataLoader

        from tbl_loader.pytree import PyTreeDataset, collate_identity

        ds = PyTreeDataset(workdir / f"tbl-{rows}")
        # numpy batches cross the worker pipe pickled (cheaper than torch's per-tensor shared-memory
        # segments); the consumer wraps them with torch.from_numpy.
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, collate_fn=collate_identity,
                            multiprocessing_context="spawn", persistent_workers=True)
    elif config == "litdata":
        import litdata

        info["litdata"] = litdata.__version__
        ds = litdata.StreamingDataset(input_dir=str(workdir / f"litdata-{rows}"), shuffle=True, seed=0)
        loader = litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS,
                                             multiprocessing_context="spawn", persistent_workers=True)
    else:
        raise ValueError(f"unknown configuration {config!r}")

    def run(epoch: int) -> int:
        n = 0
        for batch in loader:
            n += _consume(batch)
        return n

    t = time.perf_counter()
    seen = run(0)  # warm-up: worker start-up and first touch of the pages
    warm_s = time.perf_counter() - t
    rates = []
    for e in range(1, epochs + 1):
        t = time.perf_counter()
        n = run(e)
        rates.append(n / (time.perf_counter() - t))
    return {"config": config, "rows_per_epoch": seen, "warmup_s": warm_s, "median": statistics.median(rates),
            "rates": rates, **rss.stop(), **info}


def _litdata_sample(i: int) -> dict:
    return sample(i)


def prepare_litdata(workdir: Path, rows: int) -> None:
    import litdata

    litdata.optimize(fn=_litdata_sample, inputs=list(range(rows)), output_dir=str(workdir / f"litdata-{rows}"),
                     chunk_bytes="64MB", num_workers=WORKERS, verbose=False, mode="overwrite")


# ---- parent ------------------------------------------------------------------------------------


def prepare_tbl(workdir: Path, rows: int) -> None:
    import functools

    from tbl_loader.pytree import write_parallel

    path = workdir / f"tbl-{rows}"
    if not path.exists():
        write_parallel(functools.partial(part_samples, rows=rows), PARTS, path, workers=WORKERS,
                       shard_bytes=64 << 20)


def _run_child(python: str, config: str, args: argparse.Namespace) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--child", config, "--workdir", str(args.workdir),
           "--rows", str(args.rows), "--epochs", str(args.epochs)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"config": config, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "tbl-bench-pytree")
    parser.add_argument("--peer-python", help="interpreter with litdata installed (runs the litdata row)")
    parser.add_argument("--configs", nargs="*", default=list(CONFIGS), choices=CONFIGS)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        if args.child == "prepare-litdata":
            prepare_litdata(args.workdir, args.rows)
            print(json.dumps({"ok": True}))
        else:
            print(json.dumps(child(args.child, args.workdir, args.rows, args.epochs)))
        return 0

    args.workdir.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    prepare_tbl(args.workdir, args.rows)
    print(f"tbl data ready in {time.perf_counter() - t:.1f}s", file=sys.stderr)
    peer = args.peer_python
    if peer and "litdata" in args.configs and not (args.workdir / f"litdata-{args.rows}").exists():
        t = time.perf_counter()
        prep = _run_child(peer, "prepare-litdata", args)
        print(f"litdata data ready in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        if "error" in prep:
            print(f"litdata: preparing the data failed ({prep['error']}); skipping litdata", file=sys.stderr)
            peer = None
    results = []
    for config in args.configs:
        if config == "litdata":
            if not peer:
                print("litdata: skipped (pass --peer-python with litdata installed)", file=sys.stderr)
                continue
            results.append(_run_child(peer, config, args))
        else:
            results.append(_run_child(sys.executable, config, args))

    print(f"\nDataLoader, {WORKERS} spawn workers, batch {BATCH}, {args.rows:,} rows of "
          f"{{(64,) float32, str, int}}; median of {args.epochs} epochs")
    print(f"{'config':<10}{'rows/s':>12}{'warm-up s':>11}{'peak anon MiB':>15}{'peak file MiB':>15}")
    for r in results:
        if "error" in r:
            print(f"{r['config']:<10}{'error':>12}  {r['error']}")
            continue
        print(f"{r['config']:<10}{r['median']:>12,.0f}{r['warmup_s']:>11.1f}{r['peak_anon_mib']:>15.0f}"
              f"{r['peak_file_mib']:>15.0f}")
    by = {r["config"]: r for r in results if "median" in r}
    ratios = {}
    if "tbl" in by and "litdata" in by:
        ratios["throughput tbl / litdata"] = by["tbl"]["median"] / by["litdata"]["median"]
        ratios["peak anon litdata / tbl"] = by["litdata"]["peak_anon_mib"] / max(by["tbl"]["peak_anon_mib"], 1e-9)
        for name, value in ratios.items():
            print(f"ratio {name}: {value:.2f}x")
    report = {"suite": "pytree_dataloader", "rows": args.rows, "epochs": args.epochs, "results": results,
              "ratios": ratios}
    print(json.dumps(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
