"""Where the fused JPEG pass spends its time: the parts of ``decode_crop_resize_jpegs`` timed apart, on one
thread, in CPU seconds of that thread (so a busy machine moves them less than wall time would).

    python -m tbl_bench.jpeg_fused_parts DATASET [--rows 600] [--size 224] [--rounds 5] [--transform eval]

DATASET is JPEG storage (``tbl convert --max-size N --store jpeg``). Every row gets one RandomResizedCrop box
(scale 0.08-1, ratio 3/4-4/3, seed 0): the distribution of the loader's default
``RandomResizedCrop``, drawn by numpy here, so not the loader's own boxes. With ``--transform eval`` every row
gets instead the window of the evaluation transform, torchvision's Resize(round(size * 256 / 224)) +
CenterCrop(size), and the resize-crop kernels time it (``resize_crop_images``, ``decode_resize_crop_jpegs``);
the region decoded alone is then the window's enclosing pixel box. Printed per image, the best of ``--rounds``:

- ``simplejpeg full decode``: the decode-only ceiling of the ``variable_images`` suite (simplejpeg, whole image);
- ``kernels full decode``: the same rows decoded whole by the kernels' decoder (``decode_jpeg_region``, the
  libjpeg-turbo they were built with);
- ``kernels region decode``: only each box's region (what the fused pass decodes);
- ``crop-resize from decoded, <dtype>``: ``crop_resize_images`` on the decoded images, no decode
  (``resize-crop from decoded``, ``resize_crop_images``, for eval);
- ``fused, <dtype>``: ``decode_crop_resize_jpegs`` (``decode_resize_crop_jpegs`` for eval), the whole pass;

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

from tbl_bench.peers.transforms import EVAL_CROP_RATIO

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


def _eval_windows(sizes: np.ndarray, size: int) -> np.ndarray:
    """float64 windows (top, left, height, width) of the loader's evaluation transform, Resize(round(size /
    EVAL_CROP_RATIO)) + CenterCrop(size), on images of (height, width) ``sizes``: the crop in source pixels."""
    from tbl_loader.image import resized_center_crop_windows

    return resized_center_crop_windows(sizes[:, 0], sizes[:, 1], round(size / EVAL_CROP_RATIO), size, size)


def _enclosing_boxes(windows: np.ndarray) -> np.ndarray:
    """The int32 pixel boxes (top, left, height, width) that enclose float64 ``windows``."""
    start = np.floor(windows[:, :2])
    return np.concatenate([start, np.ceil(windows[:, :2] + windows[:, 2:]) - start], axis=1).astype(np.int32)


def _best(fn: Any, rounds: int, count: int) -> float:
    """Microseconds of this thread's CPU time per item, the best of ``rounds``."""
    best = math.inf
    for _ in range(rounds):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best / count * 1e6


def measure(path: str, rows: int, size: int, rounds: int, batch: int = 64, transform: str = "crop") -> dict[str, float]:
    import simplejpeg

    import tbl_format
    import tbl_kernels as K

    K.set_num_threads(1)
    with tbl_format.open(path) as ds:
        n = min(rows, len(ds))
        blobs = [np.frombuffer(bytes(b), np.uint8) for b in ds.values("image", list(range(n)))]
    sizes = np.array([K.jpeg_header(b)[:2] for b in blobs], np.int64)
    if transform not in ("crop", "eval"):
        raise ValueError(f"transform must be 'crop' or 'eval', got {transform!r}")
    if transform == "eval":
        geometry = _eval_windows(sizes, size)
        boxes = _enclosing_boxes(geometry)
        resample, fused, label = K.resize_crop_images, K.decode_resize_crop_jpegs, "resize-crop"
    else:
        geometry = boxes = _boxes(sizes, 0)
        resample, fused, label = K.crop_resize_images, K.decode_crop_resize_jpegs, "crop-resize"
    decoded = [simplejpeg.decode_jpeg(b, "RGB") for b in blobs]
    batch = min(batch, n)
    n_batched = (n // batch) * batch
    spans = [(s, s + batch) for s in range(0, n_batched, batch)]
    # Every decode writes into one preallocated buffer: allocating each image's array would time the page
    # faults of fresh memory too, which moved these figures by up to 2x between runs.
    scratch = np.empty(int(sizes.prod(axis=1).max()) * 3, np.uint8)

    def into(hw: Any) -> np.ndarray:
        return scratch[: int(hw[0]) * int(hw[1]) * 3].reshape(int(hw[0]), int(hw[1]), 3)

    def simplejpeg_full() -> None:
        for b, hw in zip(blobs, sizes, strict=True):
            simplejpeg.decode_jpeg(b, "RGB", buffer=into(hw))

    def kernels_full() -> None:
        for b, hw in zip(blobs, sizes, strict=True):
            K.decode_jpeg_region(b, (int(hw[0]), int(hw[1])), out=into(hw))

    def kernels_region() -> None:
        for b, hw, bx in zip(blobs, sizes, boxes, strict=True):
            K.decode_jpeg_region(b, (int(hw[0]), int(hw[1])), 1, tuple(int(v) for v in bx), out=into(bx[2:]))

    res = {
        "simplejpeg full decode": _best(simplejpeg_full, rounds, n),
        "kernels full decode": _best(kernels_full, rounds, n),
        "kernels region decode": _best(kernels_region, rounds, n),
    }
    for dtype in ("uint8", "float16", "float32"):
        out = np.empty((batch, 3, size, size), dtype)
        table = None if dtype == "uint8" else K.normalization_table(MEAN, STD, dtype)
        res[f"{label} from decoded, {dtype}"] = _best(
            lambda out=out, table=table: [resample(decoded[a:b], geometry[a:b], out, table, layout="CHW")
                                          for a, b in spans],
            rounds, n_batched)
        res[f"fused, {dtype}"] = _best(
            lambda out=out, table=table: [fused(blobs[a:b], sizes[a:b], geometry[a:b], out, table, layout="CHW")
                                          for a, b in spans], rounds, n_batched)
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.jpeg_fused_parts", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--rows", type=int, default=600)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--transform", choices=("crop", "eval"), default="crop",
                   help="RandomResizedCrop boxes (default) or the evaluation transform's windows")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    import tbl_kernels

    res = measure(args.dataset, args.rows, args.size, args.rounds, transform=args.transform)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"{args.dataset}, {args.transform}: µs of one thread's CPU per image ({tbl_kernels.jpeg_decoder()}, "
          f"SIMD {tbl_kernels.simd_level()}, best of {args.rounds})")
    for name, us in res.items():
        print(f"  {name:34s} {us:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
