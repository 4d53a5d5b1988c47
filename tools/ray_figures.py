"""The figures of `tbl_loader.ray` (tbl-loader's `ray` extra), each configuration in its own process.

    python tools/ray_figures.py convert TAR WORKDIR [--size S] [--rounds R]
        `tbl convert TAR --engine ray` against plain `tbl convert` on the same machine, alternating,
        R rounds: every column compared byte for byte, images/s of each run (from the reports).
        Ray is timed twice: the CLI (it starts its own local cluster: start-up included) and the
        Python API on a cluster started before the clock starts (the cost of Ray Data itself).
    python tools/ray_figures.py sink WORKDIR [--rows N]
        N pytree rows from a ray.data.range pipeline written through TblDatasink while one map task's
        worker process dies midway (os._exit, once, guarded by a marker file; max_retries=3); the
        published dataset is read back and compared row for row, then `tbl verify` checks it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import tbl_format

HERE = Path(__file__).resolve()


def _tbl(*args: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tbl_format.cli", *args], check=True)
    return time.perf_counter() - t


def _images_per_s(dst: Path) -> float:
    return json.loads(Path(f"{dst}.report.json").read_text())["images_per_s"]


def _columns_equal(a_path: Path, b_path: Path) -> bool:
    with tbl_format.open(a_path) as a, tbl_format.open(b_path) as b:
        if a.schema != b.schema or a.metadata != b.metadata or len(a) != len(b):
            return False
        return all(np.array_equal(np.concatenate(a.segments(leaf)), np.concatenate(b.segments(leaf)))
                   for leaf in a.leaf_paths)


def convert_figure(tar: Path, work: Path, size: int, rounds: int) -> None:
    work.mkdir(parents=True, exist_ok=True)
    n = None
    runs: dict[str, list[float]] = {"local": [], "ray (CLI, cluster start included)": [], "ray (running cluster)": []}
    for r in range(rounds):
        local, cli, warm = work / f"local-{r}.tbl", work / f"ray-cli-{r}", work / f"ray-warm-{r}"
        for p in (local, cli, warm):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        _tbl("convert", str(tar), str(local), "--size", str(size), "--quiet")
        runs["local"].append(_images_per_s(local))
        _tbl("convert", str(tar), str(cli), "--size", str(size), "--quiet", "--engine", "ray")
        runs["ray (CLI, cluster start included)"].append(_images_per_s(cli))
        subprocess.run([sys.executable, str(HERE), "_warm", str(tar), str(warm), str(size)], check=True)
        runs["ray (running cluster)"].append(_images_per_s(warm))
        for other in (cli, warm):
            same = _columns_equal(local, other)
            print(f"round {r}: {other.name} equals {local.name} in every column: {same}", flush=True)
            if not same:
                raise SystemExit(1)
        with tbl_format.open(local) as ds:
            n = len(ds)
    print(f"\n{n} images, --size {size}, {os.cpu_count()} CPUs; images/s per round (median):")
    base = statistics.median(runs["local"])
    for name, values in runs.items():
        med = statistics.median(values)
        print(f"  {name:36s} {', '.join(f'{v:.0f}' for v in values):24s} median {med:.0f}  "
              f"(local / this = {base / med:.2f}x)")


def _warm(tar: str, dst: str, size: int) -> None:
    import ray

    from tbl_loader.ray import convert

    ray.init(log_to_driver=False)
    try:
        convert(tar, dst, size)
    finally:
        ray.shutdown()


def pytree_batch(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ids = batch["id"]
    names = np.empty(len(ids), dtype=object)
    meta = np.empty(len(ids), dtype=object)
    for k, i in enumerate(ids.tolist()):
        names[k] = f"row-{i}"
        meta[k] = {"even": i % 2 == 0, "half": i / 2}
    x = ids[:, None].astype(np.float32) + np.arange(4, dtype=np.float32)
    return {"id": ids, "x": x, "name": names, "meta": meta}


class CrashOnce:
    """pytree_batch, except that the worker process holding row ``at`` dies the first time (marker file)."""

    def __init__(self, marker: str, at: int) -> None:
        self.marker, self.at = marker, at

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids = batch["id"]
        if ids[0] <= self.at <= ids[-1]:
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass
            else:
                print(f"worker {os.getpid()}: dying at row {self.at} (os._exit)", file=sys.stderr, flush=True)
                os._exit(1)
        return pytree_batch(batch)


def sink_figure(work: Path, rows: int) -> None:
    import ray

    from tbl_loader.ray import TblDatasink

    work.mkdir(parents=True, exist_ok=True)
    dst, marker = work / "pytree", work / "crashed-once"
    shutil.rmtree(dst, ignore_errors=True)
    marker.unlink(missing_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = False
    t = time.perf_counter()
    sink = TblDatasink(dst, shard_rows=100_000)
    (ray.data.range(rows, override_num_blocks=20)
     .map_batches(CrashOnce(str(marker), at=rows * 3 // 5), batch_size=None, max_retries=3)
     .write_datasink(sink))
    took = time.perf_counter() - t
    ray.shutdown()
    print(f"written: {sink.result} in {took:.1f} s; a worker died midway: {marker.exists()}")
    t = time.perf_counter()
    with tbl_format.open(dst) as ds:
        assert len(ds) == rows, len(ds)
        ids = np.concatenate(ds.segments("id"))
        x = np.concatenate(ds.segments("x"))
        assert np.array_equal(ids, np.arange(rows))
        assert np.array_equal(x, np.arange(rows)[:, None].astype(np.float32) + np.arange(4, dtype=np.float32))
        for i, row in enumerate(ds):
            if row["name"] != f"row-{i}" or row["meta"] != {"even": i % 2 == 0, "half": i / 2} or row["id"] != i:
                raise SystemExit(f"row {i} differs: {row}")
        print(f"read back: {len(ds)} rows equal to the pipeline's, in order ({time.perf_counter() - t:.1f} s); "
              f"shards {ds.segment_rows}")
    leftovers = [p.name for p in work.iterdir() if ".tbl-tmp-" in p.name]
    print(f"staging leftovers: {leftovers}")
    _tbl("verify", str(dst))
    print("tbl verify: ok")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_warm":
        _warm(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    c = sub.add_parser("convert")
    c.add_argument("tar", type=Path)
    c.add_argument("work", type=Path)
    c.add_argument("--size", type=int, default=128)
    c.add_argument("--rounds", type=int, default=2)
    s = sub.add_parser("sink")
    s.add_argument("work", type=Path)
    s.add_argument("--rows", type=int, default=1_000_000)
    args = p.parse_args()
    if args.what == "convert":
        convert_figure(args.tar, args.work, args.size, args.rounds)
    else:
        sink_figure(args.work, args.rows)


if __name__ == "__main__":
    main()
