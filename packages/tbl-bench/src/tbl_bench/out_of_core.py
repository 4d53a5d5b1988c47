"""Out-of-core serving: images/s of ImageLoader on a local dataset several times the memory it may use.

    python -m tbl_bench.out_of_core [--images 8000] [--size 160] [--limit-mb 160] [--epochs 3]
                                    [--serve copy|train] [--crop-size PX]

One dataset of random uint8 images (``--images`` of ``--size``^2 x 3, shards of
``--shard-rows``) is written once; then each configuration runs in its own
subprocess, in this order, in the same run:

- ``in-RAM``: global shuffle, no memory limit (the dataset stays in the page cache),
  and ``in-RAM (block)``: ``shuffle="block"``, no limit (the order's own effect);
- ``disk read, limited``: the disk's own rate in the limit below (every shard
  file read whole with large ``preadv`` calls, in the block order's shard
  sequence): what a perfectly sequential reader gets;
- ``block, limited``: ``shuffle="block"`` inside a cgroup (v1 ``memory`` or v2)
  whose limit (``--limit-mb``, page cache included) is about a quarter of the
  dataset;
- ``global, limited``: ``shuffle=True`` in the same limit.

Before each limited run the dataset's pages are dropped from the page cache
(``posix_fadvise(DONTNEED)`` on its files), so what the child reads comes from
disk and is charged to its own cgroup. Each child times ``--epochs`` epochs of
batches of 128 (numpy output, so torch is not loaded; the limit covers the
process's own memory as well as the page cache; the in-RAM child reports its own)
and the report gives the median images/s of the epochs after the first. A batch
is the stored uint8 pixels as they are (``--serve copy``: a memory copy, so the
disk's rate shows most) or what a training step is fed (``--serve train``:
RandomResizedCrop + flip, normalized float16 CHW).
``--dataset`` serves an existing dataset instead (e.g. ``tbl convert --max-size 256
--store jpeg --shard-rows 100``: JPEG bytes decoded per batch, served resized
and centre-cropped).
Creating a cgroup needs root; without it the limited runs are reported as
skipped, not run unlimited.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, os, sys, time
path, shuffle, epochs, cgroup = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if cgroup != "-":
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
    for name in sorted(os.listdir(path)):
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
from tbl_loader import ImageLoader
shuffle = "block" if shuffle == "block" else True
serving = json.loads(sys.argv[5])  # ImageLoader keywords: dtype, layout, crop, flip or resize + center_crop
if "random_resized_crop" in serving:
    from tbl_loader import RandomResizedCrop
    serving["random_resized_crop"] = RandomResizedCrop(serving["random_resized_crop"])
rates = []
with ImageLoader(path, batch_size=128, shuffle=shuffle, seed=0, backend="numpy", **serving) as loader:
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        t, n = time.perf_counter(), 0
        for batch in loader:
            n += batch.images.shape[0]
        rates.append(n / (time.perf_counter() - t))
with open("/proc/self/status") as f:  # the process's own memory, apart from the page cache
    anon = next((int(line.split()[1]) for line in f if line.startswith("RssAnon:")), 0)
print(json.dumps({"rates": rates, "rss_anon_mb": anon / 1024}))
"""

# The disk's own rate in the same limit: every shard file read whole, in the block order's shard sequence,
# with large positioned reads into one reused buffer (what a perfectly sequential reader gets).
DISK_CHILD = r"""
import json, os, sys, time
path, epochs, cgroup = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))
import tbl_format
from tbl_loader.stream.order import block_shards
ds = tbl_format.open(path)
files, rows = [e["file"] for e in ds.shard_entries], ds.segment_rows
ds.close()
for name in files:
    fd = os.open(os.path.join(path, name), os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
buf = bytearray(8 << 20)
rates = []
for epoch in range(epochs):
    t = time.perf_counter()
    for block in block_shards(rows, 0, epoch):
        for k in block:
            fd = os.open(os.path.join(path, files[k]), os.O_RDONLY)
            offset = 0
            while (got := os.preadv(fd, [buf], offset)) > 0:
                offset += got
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    rates.append(sum(rows) / (time.perf_counter() - t))
print(json.dumps({"rates": rates, "rss_anon_mb": 0}))
"""


def _make_cgroup(limit_bytes: int) -> Path | None:
    """A fresh memory cgroup with ``limit_bytes`` (page cache included), or None where it cannot be made."""
    name = f"tbl-bench-ooc-{os.getpid()}"
    for root, limit_file in ((Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
                             (Path("/sys/fs/cgroup"), "memory.max")):
        if not (root / limit_file).exists() and not (root / "cgroup.controllers").exists():
            continue
        try:
            group = root / name
            group.mkdir()
            (group / limit_file).write_text(str(limit_bytes))
            return group
        except OSError:
            continue
    return None


def _run_child(path: Path, shuffle: str, epochs: int, cgroup: Path | None, serving: dict) -> dict:
    if shuffle == "disk":
        argv = [sys.executable, "-c", DISK_CHILD, str(path), str(epochs), str(cgroup)]
    else:
        argv = [sys.executable, "-c", CHILD, str(path), shuffle, str(epochs), str(cgroup or "-"), json.dumps(serving)]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{shuffle} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tbl_bench.out_of_core", description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=8000)
    ap.add_argument("--size", type=int, default=160)
    ap.add_argument("--shard-rows", type=int, default=250)
    ap.add_argument("--limit-mb", type=int, default=160)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workdir", default=None, help="where the dataset is written (kept, and reused when there)")
    ap.add_argument("--skip", default="", help="comma-separated configurations not to run: ram-block, disk, block, global")
    ap.add_argument("--dataset", default=None,
                    help="serve this dataset directory instead of writing random images (e.g. the output of "
                         "tbl convert --max-size 256 --store jpeg --shard-rows 100)")
    ap.add_argument("--resize", type=int, default=256, help="with images of variable size: resize R ...")
    ap.add_argument("--center-crop", type=int, default=224, help="... then the centred C x C crop")
    ap.add_argument("--serve", choices=("copy", "train"), default="copy",
                    help="what each batch is: 'copy' (default): the stored uint8 pixels as they are, HWC, so the "
                         "disk's rate shows most; 'train': RandomResizedCrop(--crop-size) + flip 0.5, normalized "
                         "float16 CHW, what a training step is fed (fixed-size images)")
    ap.add_argument("--crop-size", type=int, default=None, help="with --serve train: the crop's output size "
                                                                   "(default: the stored size)")
    args = ap.parse_args(argv)

    import numpy as np

    import tbl_format

    work = Path(args.workdir or tempfile.mkdtemp(prefix="tbl-ooc-"))
    path = Path(args.dataset) if args.dataset else work / "ds"
    if args.dataset is None and not (path / "manifest.json").exists():
        rng = np.random.default_rng(0)
        shape = (args.size, args.size, 3)
        samples = ({"image": rng.integers(0, 256, shape, dtype=np.uint8), "label": np.int64(i % 1000)}
                   for i in range(args.images))
        tbl_format.write(samples, path, shard_rows=args.shard_rows)
    data_mb = sum(p.stat().st_size for p in path.iterdir()) / 2**20
    with tbl_format.open(path) as ds:
        rows, image = len(ds), ds.schema.leaves["image"]
    variable = image.kind in ("var_array", "encoded_image")  # tbl convert --max-size: decoded or resized per batch
    if variable:
        serving = {"dtype": "uint8", "layout": "HWC", "resize": args.resize, "center_crop": args.center_crop}
    elif args.serve == "train":
        crop = args.crop_size or int(image.shape[0])
        serving = {"dtype": "float16", "layout": "CHW", "random_resized_crop": crop, "hflip": 0.5}
    else:
        serving = {"dtype": "uint8", "layout": "HWC"}
    what = (f"{image.kind} ({image.format or 'raw'}) images of variable size, served resized to {args.resize} "
            f"and centre-cropped to {args.center_crop}" if variable else
            f"images {tuple(image.shape)} served as " + ", ".join(f"{k}={v}" for k, v in serving.items()))
    print(f"dataset: {rows} {what}, {data_mb:.0f} MiB in {len(list(path.glob('*.tbl')))} shards; memory limit "
          f"{args.limit_mb} MiB ({data_mb / args.limit_mb:.1f}x smaller than the dataset), page cache and the "
          f"process's own memory together")
    results: dict[str, float | None] = {}
    in_ram = _run_child(path, "global", args.epochs, None, serving)
    results["in-RAM (global, no limit)"] = statistics.median(in_ram["rates"][1:])
    print(f"(the in-RAM child's own anonymous memory at the end: {in_ram['rss_anon_mb']:.0f} MiB)")
    if "ram-block" not in args.skip.split(","):  # the block order's own effect, apart from the limit
        results["in-RAM (block, no limit)"] = statistics.median(
            _run_child(path, "block", args.epochs, None, serving)["rates"][1:])
    for label, shuffle in (("disk read, limited", "disk"), ("block, limited", "block"),
                           ("global, limited", "global")):
        if shuffle in args.skip.split(","):
            continue
        group = _make_cgroup(args.limit_mb << 20)
        if group is None:
            results[label] = None
            continue
        try:
            results[label] = statistics.median(_run_child(path, shuffle, args.epochs, group, serving)["rates"][1:])
        finally:
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)
    base = results["in-RAM (global, no limit)"]
    for label, rate in results.items():
        if rate is None:
            print(f"{label:28s} skipped (no memory cgroup could be created; run as root)")
        else:
            print(f"{label:28s} {rate:10.0f} images/s  {rate / base:5.2f}x in-RAM")
    return 0


if __name__ == "__main__":
    sys.exit(main())
