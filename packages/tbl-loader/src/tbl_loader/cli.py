"""`tbl convert` and `tbl tokenize`: the command-line faces of `tbl_loader.convert` and
`tbl_loader.conversion.tokenize`, registered on the `tbl.commands` entry point.

    tbl tokenize SRC DST --tokenizer tokenizer.json [--text-field text] [--eos ID] [--workers N]
                 [--on-error fail|skip] [--part i/n] [--from jsonl|parquet|hf] [--force] [--report PATH] [--quiet]
    tbl tokenize --merge PART [PART ...] DST

``tbl tokenize`` exits with the same codes as ``tbl convert`` below (1: published with records skipped by
``--on-error skip``; 2: refused before tokenizing, e.g. no tokenizers library, a tokenizer without an eos
and no ``--eos``, an unusable source or destination; 3: a bad record with ``--on-error fail``, a worker
crash, an I/O error; nothing published). A killed run, run again with the same arguments, keeps the parts
it finished (`tbl_loader.conversion.tokenize`).

    tbl convert SRC DST (--size S [--mode center_crop|squash] | --max-size N [--store raw|jpeg] [--quality Q])
                [--workers N]
                [--on-error fail|skip] [--shard-rows N | --shards N] [--part i/n]
                [--report PATH] [--quiet] [--label-file F] [--resample R] [--no-draft]
                [--force] [--max-image-bytes N] [--engine local|ray [--address A]] [--allow-empty-classes]
                [--from FORMAT] [--image-key K] [--label-key K]
    tbl convert --merge PART [PART ...] DST

DST may be a URL (``s3://bucket/prefix/`` with --shard-rows or --shards, or
``.../name.tbl``; needs ``tbl-loader[remote]``): the dataset is converted in a
temporary local folder, then its shards are uploaded and the manifest last.
The store is configured by its standard environment variables (for S3:
``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ...).

Exit status and outcome (every error is one line on stderr naming the path and the cause):

    0    published; every image converted, the report written
    1    published, with something to look at: images left out (--on-error skip), folders or
         second names of a file skipped by the listing, or the report could not be written
    2    refused before converting, nothing written or removed: a usage error, a bad option,
         an unusable source (missing, a FIFO or device, no images, a bad label file, a class
         folder without images unless --allow-empty-classes), a refused
         destination (a link, FIFO or device; the source itself; a folder for a file or the
         reverse; an existing dataset without --force) or report path
    3    the conversion failed, nothing published: a bad image with --on-error fail, a worker
         crash, an I/O error (a full disk, no permission), out of memory
    130  interrupted (Ctrl-C, SIGINT); nothing published
    143  terminated (SIGTERM); nothing published
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .conversion.decode import MODES, RESAMPLE
from .conversion.formats import FORMATS
from .conversion.variable import DEFAULT_QUALITY, STORES
from .source.storage import is_url, redact

__all__ = ["register_convert", "register_tokenize", "run_convert", "run_tokenize"]

EXIT_OK, EXIT_INCOMPLETE, EXIT_REFUSED, EXIT_FAILED, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 3, 130, 143
CONVERT_SCHEMA = "tbl.convert/1"  # --json: the report file's fields plus "schema" (docs/cli-json.md)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

EPILOG = """\
sources: a TAR (plain or gzip/bzip2/xz) in ImageNet layout (class_name/x.JPEG), a folder tree
(root/class_name/x.jpg, labels as torchvision ImageFolder: sorted class folders -> 0..K-1), or either
one flat with --label-file (rows "name,label" or "name<TAB>label"; name relative to the source root).
record sources (detected from SRC, or named with --from): WebDataset shards ('shards/{000000..000099}.tar',
a folder of .tar), Parquet (a .parquet file or a folder of them), Arrow (.arrow), a HuggingFace datasets
save_to_disk folder, a CSV / JSONL manifest of image paths relative to it; their other members / columns
are stored as fields; --image-key and --label-key name the image and label member or column.
parts: run 'tbl convert SRC PART_i --part i/n ...' for i = 0..n-1 anywhere (same options), then
'tbl convert --merge PART_0 ... PART_n-1 DST' joins them in that order (== converting in one go).
"""


def register_convert(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``convert`` subcommand (the ``tbl.commands`` entry point)."""
    p = subparsers.add_parser(
        "convert",
        help="convert images (TAR or folder) to a .tbl dataset",
        usage=("tbl convert SRC DST --size S [options]\n       tbl convert SRC DST --max-size N [--store raw|jpeg] "
               "[options]\n       tbl convert --merge PART [PART ...] DST"),
        description="Decode, resize and store images with their labels as a .tbl dataset.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="SRC DST, or with --merge: PART... DST")
    p.add_argument("--size", type=int, help="stored side S: images become S x S x 3 uint8 (or give --max-size)")
    p.add_argument("--max-size", type=int, default=None, metavar="N",
                   help="keep each image's aspect, longer side capped at N (variable size; excludes --size)")
    p.add_argument("--store", choices=STORES, default=None,
                   help="with --max-size: raw pixels (default) or jpeg bytes (source JPEGs within the cap kept as is)")
    p.add_argument("--quality", type=int, default=None, metavar="Q",
                   help=f"with --store jpeg: quality of re-encoded images (default {DEFAULT_QUALITY})")
    p.add_argument("--mode", choices=MODES, default=None, help="with --size: center_crop (default) or squash")
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
    p.add_argument("--json", action="store_true",
                   help=f"print the report as one JSON object on stdout (schema {CONVERT_SCHEMA!r}, docs/cli-json.md)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing dataset at DST (only its own TBL shard files are removed)")
    p.add_argument("--max-image-bytes", type=_byte_count, default=None, metavar="N",
                   help="encoded size cap on one image, e.g. 64M (default 256M); a bigger one is a bad image")
    p.add_argument("--keep-path", action="store_true",
                   help="store each image's source path and original size as columns path, orig_size")
    p.add_argument("--sidecar", default=None, metavar="FILE",
                   help="JSON / CSV / TSV of per-image fields keyed by path, stored as columns")
    p.add_argument("--geometry", action="append", default=[], metavar="FIELD=xyxy",
                   help="a sidecar field of boxes in source pixels, stored mapped into stored pixels "
                        "(through the resize and crop); repeatable")
    p.add_argument("--allow-empty-classes", action="store_true",
                   help="keep a class folder without images as a class with its label (default: refuse it)")
    p.add_argument("--from", dest="source_format", choices=FORMATS, default=None,
                   help="the source's format (default: detected from SRC)")
    p.add_argument("--image-key", default=None, metavar="K",
                   help="record sources: the image member (WebDataset extension) or column")
    p.add_argument("--label-key", default=None, metavar="K",
                   help="record sources: the label member or column (default: cls for WebDataset, else label)")
    p.add_argument("--merge", action="store_true", help="join part outputs PART... into DST instead of converting")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local (default): worker processes here; ray: Ray tasks on a Ray cluster (the ray extra); "
                        "DST is a dataset folder")
    p.add_argument("--address", default=None, help="with --engine ray: the Ray cluster to join (default: as ray.init)")
    p.set_defaults(func=run_convert)
    return p


def _byte_count(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)i?[bB]?\s*", text)
    if m is None or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive byte count such as 1000000, 64M or 1G, got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread so the conversion unwinds like a Ctrl-C (the writer aborts)."""


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _one_line(e: BaseException) -> str:
    notes = getattr(e, "__notes__", None) or []
    return "; ".join(" ".join(str(x).split()) for x in [e, *notes] if str(x))


def _error(message: str) -> None:
    print(f"tbl convert: {redact(message)}", file=sys.stderr)  # a URL's credentials never reach the terminal


def run_convert(args: argparse.Namespace) -> int:
    dst = args.paths[-1] if args.paths else "DST"
    try:
        with _sigterm_unwinds():
            return _run(args)
    except KeyboardInterrupt:
        _error(f"interrupted; nothing was published at {dst}")
        return EXIT_SIGINT
    except _Terminated:
        _error(f"terminated (SIGTERM); nothing was published at {dst}")
        return EXIT_SIGTERM


def _run(args: argparse.Namespace) -> int:
    from .conversion.images import convert, merge_parts
    from .errors import DestinationError, ImageDecodeError, SourceError, WorkerCrashError

    if args.merge:
        if len(args.paths) < 2:
            _error("--merge: give at least one PART and a DST")
            return EXIT_REFUSED
        try:
            dst = merge_parts(args.paths[:-1], args.paths[-1])
        except ValueError as e:
            _error(f"--merge: error: {_one_line(e)}; nothing was published")
            return EXIT_REFUSED
        except OSError as e:
            _error(f"--merge: error: {_one_line(e)}; nothing was published")
            return EXIT_FAILED
        if not args.quiet:
            print(f"merged {len(args.paths) - 1} part(s) -> {redact(dst)}", file=sys.stderr)
        return EXIT_OK
    if len(args.paths) != 2:
        _error(f"expected SRC DST, got {len(args.paths)} path(s)")
        return EXIT_REFUSED
    if (args.size is None) == (args.max_size is None):
        _error("give exactly one of --size S (fixed S x S images) and --max-size N (variable size, aspect kept)")
        return EXIT_REFUSED
    if args.max_size is None and (args.store is not None or args.quality is not None):
        _error("--store and --quality go with --max-size")
        return EXIT_REFUSED
    if args.max_size is not None and args.mode is not None:
        _error("--mode goes with --size (--max-size keeps the aspect ratio: nothing is cropped or squashed)")
        return EXIT_REFUSED
    args.mode = args.mode or "center_crop"
    if args.store != "jpeg" and args.quality is not None:
        _error("--quality goes with --store jpeg")
        return EXIT_REFUSED
    src, dst = args.paths
    options: dict[str, Any] = {} if args.max_image_bytes is None else {"max_image_bytes": args.max_image_bytes}
    geometry = dict(g.partition("=")[::2] for g in args.geometry)
    if any("=" not in g for g in args.geometry) or (geometry and args.sidecar is None):
        _error("--geometry takes FIELD=KIND (e.g. boxes=xyxy) and goes with --sidecar")
        return EXIT_REFUSED
    if geometry:
        options["geometry"] = geometry
    if args.max_size is not None:
        options.update(max_size=args.max_size, store=args.store or "raw")
        if args.quality is not None:
            options["quality"] = args.quality
    if args.engine == "ray" or args.address is not None:
        return _run_on_ray(args, src, dst, options)
    if is_url(dst):  # convert locally, upload the shards, publish the manifest last
        from .conversion.remote import convert_to_url

        convert = functools.partial(convert_to_url, convert)  # the store's settings: its environment variables
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
            overwrite=args.force,
            keep_path=args.keep_path,
            sidecar=args.sidecar,
            allow_empty_classes=args.allow_empty_classes,
            source_format=args.source_format,
            image_key=args.image_key,
            label_key=args.label_key,
            **options,
        )
    except (ImageDecodeError, WorkerCrashError) as e:
        _error(f"error: {_one_line(e)}; nothing was published at {dst}")
        return EXIT_FAILED
    except (SourceError, DestinationError, ValueError, ImportError) as e:  # refused up front; ValueError: bad option
        # values; ImportError: an optional piece the options need (the jpeg extra; the remote extra for a URL,
        # RemoteSupportMissingError), named with its pip command
        _error(f"error: {_one_line(e)}; nothing was written")
        return EXIT_REFUSED
    except OSError as e:  # a full disk, no permission, an I/O error while writing; the store failing
        _error(f"I/O error: {_one_line(e)}; nothing was published at {dst}")
        return EXIT_FAILED
    except MemoryError:
        _error(f"out of memory (fewer --workers, or a smaller --max-image-bytes); nothing was published at {dst}")
        return EXIT_FAILED
    return _outcome(args, rep)


def _outcome(args: argparse.Namespace, rep: Any) -> int:
    if getattr(args, "json", False):
        print(json.dumps({"schema": CONVERT_SCHEMA, **rep.to_json()}))
    incomplete = bool(rep.failed or rep.skipped or rep.report_error)
    if not args.quiet or incomplete:
        print(rep.summary(), file=sys.stderr)
    if rep.report_error is not None:
        _error(f"{rep.report_error} (the dataset was published)")
    return EXIT_INCOMPLETE if incomplete else EXIT_OK


def _run_on_ray(args: argparse.Namespace, src: str, dst: str, options: dict[str, Any]) -> int:
    """``--engine ray``: the conversion as Ray tasks (`tbl_loader.ray.convert`)."""
    if args.engine != "ray":
        _error("--address needs --engine ray")
        return EXIT_REFUSED
    for flag, value in (("--part", args.part), ("--force", args.force), ("--workers", args.workers)):
        if value:
            _error(f"{flag} does not apply with --engine ray (Ray spreads the work; an existing dataset is "
                   "never replaced); nothing was written")
            return EXIT_REFUSED
    try:
        from . import ray as tbl_ray
    except ImportError as e:
        _error(f"{e}; nothing was written")
        return EXIT_REFUSED
    from .errors import DestinationError, ImageDecodeError, SourceError

    try:
        rep = tbl_ray.convert(
            src, dst, args.size, mode=args.mode, on_error=args.on_error, shard_rows=args.shard_rows,
            shards=args.shards, report=args.report, progress=not args.quiet, label_file=args.label_file,
            resample=args.resample, draft=args.draft, address=args.address,
            allow_empty_classes=args.allow_empty_classes, keep_path=args.keep_path, sidecar=args.sidecar,
            source_format=args.source_format, image_key=args.image_key, label_key=args.label_key, **options,
        )
    except (SourceError, DestinationError, FileExistsError, ValueError) as e:
        if isinstance(e, ImageDecodeError):
            _error(f"error: {_one_line(e)}; nothing was published at {dst}")
            return EXIT_FAILED
        _error(f"error: {_one_line(e)}; nothing was written")
        return EXIT_REFUSED
    except (OSError, RuntimeError) as e:  # an I/O error, a failed Ray task or cluster
        _error(f"error: {type(e).__name__}: {_one_line(e)}; nothing was published at {dst}")
        return EXIT_FAILED
    return _outcome(args, rep)


TOKENIZE_EPILOG = """\
sources: a JSON Lines file (.jsonl / .json, plain, .gz or .zst) or a folder of them, a Parquet file or
folder, a HuggingFace datasets save_to_disk folder; each record's --text-field is one document.
parts: run 'tbl tokenize SRC PART_i --part i/n ...' for i = 0..n-1 anywhere (same options), then
'tbl tokenize --merge PART_0 ... PART_n-1 DST' joins them in that order (== tokenizing in one go).
"""


def register_tokenize(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``tokenize`` subcommand (the ``tbl.commands`` entry point)."""
    p = subparsers.add_parser(
        "tokenize",
        help="tokenize a text corpus (JSONL, Parquet, datasets folder) into a token dataset",
        usage=("tbl tokenize SRC DST --tokenizer tokenizer.json [--text-field text] [options]\n"
               "       tbl tokenize --merge PART [PART ...] DST"),
        description="Encode every record's text with a HuggingFace tokenizers file and store the documents, "
                    "an end-of-document id after each, as a token dataset that TokenLoader serves.",
        epilog=TOKENIZE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="SRC DST, or with --merge: PART... DST")
    p.add_argument("--tokenizer", default=None, metavar="FILE", help="a tokenizer.json of the tokenizers library")
    p.add_argument("--text-field", default="text", metavar="NAME", help="the field / column of the text (default text)")
    p.add_argument("--eos", type=int, default=None, metavar="ID",
                   help="the id appended after every document (default: the tokenizer's own end-of-text token)")
    p.add_argument("--workers", type=int, default=None, help="worker processes (default: all usable cores)")
    p.add_argument("--on-error", choices=("fail", "skip"), default="fail", help="bad record: fail (default) or skip")
    p.add_argument("--part", default=None, metavar="i/n", help="tokenize only part i of n (contiguous, 0-based)")
    p.add_argument("--from", dest="source_format", choices=("jsonl", "parquet", "hf"), default=None,
                   help="the source's format (default: detected from SRC)")
    p.add_argument("--dtype", choices=("uint16", "uint32"), default=None,
                   help="stored token dtype (default: uint16 when the vocabulary fits, else uint32)")
    p.add_argument("--part-size", type=_byte_count, default=None, metavar="BYTES",
                   help="source text per resumable part of a whole run, e.g. 64M (default 64M)")
    p.add_argument("--report", default=None, help="JSON report path (default: DST.report.json)")
    p.add_argument("--quiet", action="store_true", help="print the summary only on failures or skipped records")
    p.add_argument("--force", action="store_true", help="replace an existing dataset at DST")
    p.add_argument("--merge", action="store_true", help="join part outputs PART... into DST instead of tokenizing")
    p.set_defaults(func=run_tokenize)
    return p


def _tok_error(message: str) -> None:
    print(f"tbl tokenize: {message}", file=sys.stderr)


def run_tokenize(args: argparse.Namespace) -> int:
    dst = args.paths[-1] if args.paths else "DST"
    try:
        with _sigterm_unwinds():
            return _run_tokenize(args)
    except KeyboardInterrupt:
        _tok_error(f"interrupted; nothing was published at {dst}")
        return EXIT_SIGINT
    except _Terminated:
        _tok_error(f"terminated (SIGTERM); nothing was published at {dst}")
        return EXIT_SIGTERM


def _run_tokenize(args: argparse.Namespace) -> int:
    from .conversion.tokenize import DEFAULT_PART_BYTES, merge_parts, tokenize_corpus
    from .errors import (
        DestinationError,
        SourceError,
        TextRecordError,
        TokenError,
        TokenizerFileError,
        WorkerCrashError,
    )

    if args.merge:
        if len(args.paths) < 2:
            _tok_error("--merge: give at least one PART and a DST")
            return EXIT_REFUSED
        try:
            dst = merge_parts(args.paths[:-1], args.paths[-1], overwrite=args.force)
        except (ValueError, DestinationError) as e:
            _tok_error(f"--merge: error: {_one_line(e)}; nothing was published")
            return EXIT_REFUSED
        except OSError as e:
            _tok_error(f"--merge: error: {_one_line(e)}; nothing was published")
            return EXIT_FAILED
        if not args.quiet:
            print(f"merged {len(args.paths) - 1} part(s) -> {dst}", file=sys.stderr)
        return EXIT_OK
    if len(args.paths) != 2:
        _tok_error(f"expected SRC DST, got {len(args.paths)} path(s)")
        return EXIT_REFUSED
    if args.tokenizer is None:
        _tok_error("--tokenizer FILE is required (a tokenizer.json of the tokenizers library)")
        return EXIT_REFUSED
    src, dst = args.paths
    try:
        rep = tokenize_corpus(
            src, dst, tokenizer=args.tokenizer, text_field=args.text_field, eos=args.eos, workers=args.workers,
            part=args.part, on_error=args.on_error, source_format=args.source_format, dtype=args.dtype,
            part_bytes=args.part_size or DEFAULT_PART_BYTES, overwrite=args.force, report=args.report)
    except (TextRecordError, WorkerCrashError) as e:  # found while tokenizing
        _tok_error(f"error: {type(e).__name__}: {_one_line(e)}; nothing was published at {dst}")
        return EXIT_FAILED
    except (SourceError, DestinationError, TokenizerFileError, TokenError, ValueError, ImportError) as e:
        # refused up front: the source, the destination, the tokenizer, an option; ImportError: a missing
        # library (TokenizerUnavailableError and the parquet / hf extras), named with its pip command
        _tok_error(f"error: {type(e).__name__}: {_one_line(e)}; nothing was written")
        return EXIT_REFUSED
    except OSError as e:
        _tok_error(f"I/O error: {_one_line(e)}; nothing was published at {dst}")
        return EXIT_FAILED
    except MemoryError:
        _tok_error(f"out of memory (fewer --workers); nothing was published at {dst}")
        return EXIT_FAILED
    incomplete = bool(rep.skipped or rep.report_error)
    if not args.quiet or incomplete:
        print(rep.summary(), file=sys.stderr)
    if rep.report_error is not None:
        _tok_error(f"{rep.report_error} (the dataset was published)")
    return EXIT_INCOMPLETE if incomplete else EXIT_OK
