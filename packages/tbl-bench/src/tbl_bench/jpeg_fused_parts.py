"""Where the fused JPEG pass spends its time: the parts of ``decode_crop_resize_jpegs`` timed apart, on one
thread, in CPU seconds of that thread (so a busy machine moves them less than wall time would).

    python -m tbl_bench.jpeg_fused_parts DATASET [--rows 600] [--size 224] [--rounds 5]

DATASET is JPEG storage (``tbl convert --max-size N --store jpeg``). Every row gets one RandomResizedCrop box
(scale 0.08-1, ratio 3/4-4/3, seed 0): the distribution of the loader's default
``RandomResizedCrop``, drawn by numpy here, so not the loader's own boxes. Printed per image, the best of ``--rounds``:

- ``simplejpeg full decode``: the decode-only ceiling of the ``variable_images`` suite (simplejpeg, whole image);
- ``kernels full decode``: the same rows decoded whole by the kernels' decoder (``decode_jpeg_region``, the
  libjpeg-turbo they were built with);
- ``kernels region decode``: only each box's region (what the fused pass decodes);
- ``crop-resize from decoded, <dtype>``: ``crop_resize_images`` on the decoded images, no decode;
- ``fused, <dtype>``: ``decode_crop_resize_jpegs``, the whole pass;

for uint8, float16 and float32 output (normalized through the ImageNet table), CHW. The fused pass goes past
the decode-only ceiling only when the region decode saves more than the crop-resize and the output cost.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

import numpy as np

__all__ = ["main"]

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _boxes(sizes: np.ndarray, seed: int) -> np.ndarray:
    """One RandomResizedCrop box (top, left, height, width) per (height, width) of ``sizes``."""
    rng = np.random.default_rng(seed)
    out = np.empty((len(sizes), 4), np.int32)
    for i, (H, W) in enumerate(sizes):
        for _ in range(10):
            area = H * W * rng.uniform(0.08, 1.0)
            ratio = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
            w, h = round(math.sqrt(area * ratio)), round(math.sqrt(area / ratio))
            if 0 < w <= W and 0 < h <= H:
                out[i] = (rng.integers(0, H - h + 1), rng.integers(0, W - w + 1), h, w)
                break
        else:
            s = min(H, W)
            out[i] = ((H - s) // 2, (W - s) // 2, s, s)
    return out


def _best(fn: Any, rounds: int, count: int) -> float:
    """Microseconds of this thread's CPU time per item, the best of ``rounds``."""
    best = math.inf
    for _ in range(rounds):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best / count * 1e6


def measure(path: str, rows: int, size: int, rounds: int, batch: int = 64) -> dict[str, float]:
    import simplejpeg

    import tbl_format
    import tbl_kernels as K

    K.set_num_threads(1)
    with tbl_format.open(path) as ds:
        n = min(rows, len(ds))
        blobs = [np.frombuffer(bytes(b), np.uint8) for b in ds.values("image", list(range(n)))]
    sizes = np.array([K.jpeg_header(b)[:2] for b in blobs], np.int64)
    boxes = _boxes(sizes, 0)
    decoded = [simplejpeg.decode_jpeg(b, "RGB") for b in blobs]
    batch = min(batch, n)
    n_batched = (n // batch) * batch
    spans = [(s, s + batch) for s in range(0, n_batched, batch)]
    res = {
        "simplejpeg full decode": _best(lambda: [simplejpeg.decode_jpeg(b, "RGB") for b in blobs], rounds, n),
        "kernels full decode": _best(lambda: [K.decode_jpeg_region(b, tuple(hw)) for b, hw in zip(blobs, sizes, strict=True)],
                                     rounds, n),
        "kernels region decode": _best(lambda: [K.decode_jpeg_region(b, tuple(hw), 1, tuple(int(v) for v in bx))
                                                for b, hw, bx in zip(blobs, sizes, boxes, strict=True)], rounds, n),
    }
    for dtype in ("uint8", "float16", "float32"):
        out = np.empty((batch, 3, size, size), dtype)
        table = None if dtype == "uint8" else K.normalization_table(MEAN, STD, dtype)
        res[f"crop-resize from decoded, {dtype}"] = _best(
            lambda out=out, table=table: [K.crop_resize_images(decoded[a:b], boxes[a:b], out, table, layout="CHW")
                                          for a, b in spans],
            rounds, n_batched)
        res[f"fused, {dtype}"] = _best(
            lambda out=out, table=table: [
                K.decode_crop_resize_jpegs(blobs[a:b], sizes[a:b], boxes[a:b], out, table, layout="CHW")
                for a, b in spans], rounds, n_batched)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.jpeg_fused_parts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--rows", type=int, default=600)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    import tbl_kernels

    res = measure(args.dataset, args.rows, args.size, args.rounds)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{args.dataset}: µs of one thread's CPU per image ({tbl_kernels.jpeg_decoder()}, "
          f"SIMD {tbl_kernels.simd_level()}, best of {args.rounds})")
    for name, us in res.items():
        print(f"  {name:34s} {us:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
