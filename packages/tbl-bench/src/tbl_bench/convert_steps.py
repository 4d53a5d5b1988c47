"""Where a `tbl convert` worker's time goes beyond the decode limit's, one step at a time, on the same images.

    python -m tbl_bench.convert_steps photos.tar [--size 160] [--images N] [--scratch DIR] [--json OUT.json]

The convert suite gives whole conversions against the decode limit; this
splits the difference. One process on one core reads each image of the TAR
and runs it through five variants, each adding one step of a worker's
squash conversion to the one before:

- ``decode-limit``: the convert suite's ceiling (`suites.convert.decode_resize`:
  Pillow's draft decode and Pillow's resize);
- ``prepare in place``: `tbl_loader.conversion.decode.preprocess_into`, what a worker
  stores, made in a row of its own (the same decode, EXIF orientation and
  RGB rule, and Pillow's resize through tbl-kernels where it gives Pillow's
  bytes, `tbl_loader.conversion.fast_resize`);
- ``+ checksums``: `tbl_format.row_crcs` of the row;
- ``+ direct write``: the rows made at their slots in the buffer of
  `tbl_loader.conversion.chunk_writer.ChunkWriter` and written to a scratch file (around
  the page cache where the file system allows it, as in `tbl convert`);
- ``+ cached write``: the same through the page cache.

Every chunk of 64 images runs all five, in an order that rotates from chunk
to chunk, so that the machine's drift over minutes falls on every variant
alike. Figures are per image: user and system CPU of the process (the
writer's helper thread included) and wall time; each variant's CPU over the
decode limit's. The scratch file (in ``--scratch``, by default the system's
temporary directory) is checked against the pixels and removed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main", "measure_steps"]

CHUNK = 64  # images per chunk, as `tbl convert` hands them to its workers
VARIANTS = ("decode-limit", "prepare in place", "+ checksums", "+ direct write", "+ cached write")


def measure_steps(tar: str, size: int, images: int | None = None, scratch: str | None = None) -> dict[str, Any]:
    """Per-image user, system and wall microseconds of each of `VARIANTS`, and the write mode that ran."""
    import numpy as np

    import tbl_format
    from tbl_bench.peers.pil import index_tar
    from tbl_bench.suites.convert import decode_resize
    from tbl_loader.conversion.chunk_writer import ChunkWriter
    from tbl_loader.conversion.decode import preprocess_into

    spans = index_tar(tar)[0][:images]
    if not spans:
        raise SystemExit(f"{tar}: no images")
    row = size * size * 3
    tar_fd = os.open(tar, os.O_RDONLY)
    scratch_row = np.empty((size, size, 3), np.uint8)

    def read(off: int, n: int) -> bytes:  # as a worker reads a TAR member, by positioned read
        return os.pread(tar_fd, n, off)

    def prepare(data: bytes, slot: int, view: memoryview) -> list[int]:  # a worker's work on one image
        preprocess_into(data, size, "squash", "bilinear", True, view)
        return tbl_format.row_crcs(slot, view)

    def limit(first: int, chunk: Sequence[tuple[int, int]]) -> None:
        for off, n in chunk:
            decode_resize(read(off, n), size)

    def in_place(first: int, chunk: Sequence[tuple[int, int]]) -> None:
        for off, n in chunk:
            preprocess_into(read(off, n), size, "squash", "bilinear", True, scratch_row)

    def checksummed(first: int, chunk: Sequence[tuple[int, int]]) -> None:
        with memoryview(scratch_row).cast("B") as view:
            for k, (off, n) in enumerate(chunk):
                prepare(read(off, n), first + k, view)

    def written(writer: ChunkWriter) -> Callable[[int, Sequence[tuple[int, int]]], None]:
        def run(first: int, chunk: Sequence[tuple[int, int]]) -> None:
            writer.begin(first, len(chunk))
            for k, (off, n) in enumerate(chunk):
                data = read(off, n)
                writer.fill(k, lambda view, data=data, slot=first + k: prepare(data, slot, view))
            writer.finish()

        return run

    fd, path = tempfile.mkstemp(prefix="tbl-convert-steps-", dir=scratch)
    writers: list[ChunkWriter] = []
    try:
        os.ftruncate(fd, row * len(spans))  # both writers write the same bytes at the same slots
        writers = [ChunkWriter(path, 0, row, CHUNK, direct=True), ChunkWriter(path, 0, row, CHUNK, direct=False)]
        direct = writers[0].direct
        runs = [limit, in_place, checksummed, written(writers[0]), written(writers[1])]
        totals = np.zeros((len(runs), 3))
        for c, first in enumerate(range(0, len(spans), CHUNK)):
            chunk = spans[first : first + CHUNK]
            for j in range(len(runs)):
                v = (c + j) % len(runs)
                before, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                runs[v](first, chunk)
                wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
                totals[v] += (after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, wall)
        last = len(spans) - 1
        preprocess_into(read(*spans[last]), size, "squash", "bilinear", True, scratch_row)
        with open(path, "rb") as f:
            f.seek(last * row)
            if f.read(row) != scratch_row.tobytes():
                raise RuntimeError("the scratch file does not hold the last image's pixels: a write went wrong")
    finally:
        for w in writers:
            w.close()
        os.close(fd)
        os.unlink(path)
        os.close(tar_fd)
    per_image = totals / len(spans) * 1e6
    cpu = per_image[:, 0] + per_image[:, 1]
    steps = {name: {"user_us": round(u, 1), "sys_us": round(s, 1), "wall_us": round(w, 1),
                    "cpu_vs_limit": round(float(cpu[i] / cpu[0]), 3)}
             for i, (name, (u, s, w)) in enumerate(zip(VARIANTS, per_image.tolist(), strict=True))}
    return {"tar": tar, "size": size, "images": len(spans), "direct_writes": direct, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.convert_steps", description=__doc__.split("\n\n")[0])
    p.add_argument("tar", help="an ImageNet-layout TAR of JPEGs (as `tbl bench` generates)")
    p.add_argument("--size", type=int, default=160, help="stored side in pixels (default 160)")
    p.add_argument("--images", type=int, default=None, help="the first N images only (default all)")
    p.add_argument("--scratch", default=None, help="directory of the scratch file written (default: temp dir)")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    out = measure_steps(args.tar, args.size, args.images, args.scratch)
    print(f"{out['images']} images at {out['size']} px, one core; direct writes: {out['direct_writes']}")
    print(f"{'variant':22s} {'user us':>8s} {'sys us':>7s} {'wall us':>8s}  CPU vs decode-limit")
    for name, s in out["steps"].items():
        print(f"{name:22s} {s['user_us']:8.1f} {s['sys_us']:7.1f} {s['wall_us']:8.1f}  {s['cpu_vs_limit']:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
