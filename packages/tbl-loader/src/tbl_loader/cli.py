"""`tbl convert`: the command-line face of `tbl_loader.convert`, registered on the `tbl.commands` entry point.

    tbl convert SRC DST --size S [--mode center_crop|squash] [--workers N]
                [--on-error fail|skip] [--shard-rows N | --shards N] [--part i/n]
                [--report PATH] [--quiet] [--label-file F] [--resample R] [--no-draft]
    tbl convert --merge PART [PART ...] DST

Exit status: 0 on success, 1 when the source or an image is bad (the message
names it; nothing is published), 2 for usage errors, 130 on Ctrl-C (nothing is
published).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .decode import MODES, RESAMPLE

__all__ = ["register_convert", "run_convert"]

EPILOG = """\
sources: a TAR (plain or gzip/bzip2/xz) in ImageNet layout (class_name/x.JPEG), a folder tree
(root/class_name/x.jpg, labels as torchvision ImageFolder: sorted class folders -> 0..K-1), or either
one flat with --label-file (rows "name,label" or "name<TAB>label"; name relative to the source root).
parts: run 'tbl convert SRC PART_i --part i/n ...' for i = 0..n-1 anywhere (same options), then
'tbl convert --merge PART_0 ... PART_n-1 DST' joins them in that order (== converting in one go).
"""


def register_convert(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``convert`` subcommand (the ``tbl.commands`` entry point)."""
    p = subparsers.add_parser(
        "convert",
        help="convert images (TAR or folder) to a .tbl dataset",
        usage="tbl convert SRC DST --size S [options]\n       tbl convert --merge PART [PART ...] DST",
        description="Decode, resize and store images with their labels as a .tbl dataset.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="SRC DST, or with --merge: PART... DST")
    p.add_argument("--size", type=int, help="stored side S: images become S x S x 3 uint8 (required unless --merge)")
    p.add_argument("--mode", choices=MODES, default="center_crop", help="center_crop (default) or squash")
    p.add_argument("--resample", choices=tuple(RESAMPLE), default="bilinear", help="resize filter (default bilinear)")
    p.add_argument("--no-draft", dest="draft", action="store_false", help="decode JPEGs at full scale")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: all usable cores)")
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail", help="bad image: fail (default) or skip")
    shard = p.add_mutually_exclusive_group()
    shard.add_argument("--shard-rows", type=int, default=None, help="write a directory of shards of N rows")
    shard.add_argument("--shards", type=int, default=None, help="write a directory of about N shards")
    p.add_argument("--part", default=None, metavar="i/n", help="convert only part i of n (contiguous, 0-based)")
    p.add_argument("--label-file", default=None, help="CSV/TSV of name,label for a flat TAR or folder")
    p.add_argument("--report", default=None, help="JSON report path (default: DST.report.json)")
    p.add_argument("--quiet", action="store_true", help="no progress bar; print the summary only on failures")
    p.add_argument("--merge", action="store_true", help="join part outputs PART... into DST instead of converting")
    p.set_defaults(func=run_convert)
    return p


def run_convert(args: argparse.Namespace) -> int:
    from .conversion import ImageDecodeError, SourceError, WorkerCrashError, convert, merge_parts

    if args.merge:
        if len(args.paths) < 2:
            print("tbl convert --merge: give at least one PART and a DST", file=sys.stderr)
            return 2
        try:
            dst = merge_parts(args.paths[:-1], args.paths[-1])
        except (ValueError, OSError) as e:
            print(f"tbl convert --merge: error: {e}", file=sys.stderr)
            return 1
        if not args.quiet:
            print(f"merged {len(args.paths) - 1} part(s) -> {dst}", file=sys.stderr)
        return 0
    if len(args.paths) != 2:
        print(f"tbl convert: expected SRC DST, got {len(args.paths)} path(s)", file=sys.stderr)
        return 2
    if args.size is None:
        print("tbl convert: --size is required", file=sys.stderr)
        return 2
    src, dst = args.paths
    try:
        rep = convert(
            src,
            dst,
            args.size,
            mode=args.mode,
            workers=args.workers,
            on_error=args.on_error,
            shard_rows=args.shard_rows,
            shards=args.shards,
            part=args.part,
            report=args.report,
            progress=not args.quiet,
            label_file=args.label_file,
            resample=args.resample,
            draft=args.draft,
        )
    except KeyboardInterrupt:
        print(f"tbl convert: interrupted; nothing was written to {dst}", file=sys.stderr)
        return 130
    except (ImageDecodeError, SourceError, WorkerCrashError) as e:
        print(f"tbl convert: error: {e}\nnothing was written to {dst}", file=sys.stderr)
        return 1
    except ValueError as e:  # bad option values (size, part, workers, ...)
        print(f"tbl convert: error: {e}", file=sys.stderr)
        return 2
    if not args.quiet or rep.failed:
        print(rep.summary(), file=sys.stderr)
    return 0
