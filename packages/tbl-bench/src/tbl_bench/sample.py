"""Write a small ImageNet-layout TAR of real photographs, to try `tbl convert` and the loaders on.

    python -m tbl_bench.sample train.tar                # 256 JPEGs in 10 classes
    python -m tbl_bench.sample train.tar --images 5000 --classes 100

The photos are the benchmark data of `tbl_bench.data.make_image_tar`: random
crops, resizes, flips and JPEG re-encodes of the photographs shipped inside
scikit-image and scikit-learn (no download; `pip install 'tbl-bench[photos]'`
installs them); the same arguments give the same bytes.
"""

from __future__ import annotations

import argparse
import sys

from .data import PhotosUnavailableError, make_image_tar

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.sample", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dst", help="TAR file to write (replaced atomically)")
    p.add_argument("--images", type=int, default=256, help="number of JPEGs (default: 256)")
    p.add_argument("--classes", type=int, default=10, help="number of class directories (default: 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw (default: 0)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: up to 8 usable cores)")
    args = p.parse_args(argv)
    try:
        info = make_image_tar(args.dst, args.images, num_classes=args.classes, seed=args.seed, workers=args.workers)
    except PhotosUnavailableError as e:  # one line naming the pip command, not a traceback
        print(f"python -m tbl_bench.sample: {e}", file=sys.stderr)
        return 2
    print(f"{info.path}: {info.count} JPEGs in {info.num_classes} classes, {info.bytes / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
