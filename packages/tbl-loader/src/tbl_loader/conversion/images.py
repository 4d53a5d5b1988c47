"""Convert images (TAR, folder tree or list) into a .tbl dataset of raw S x S x 3 images and labels.

What is stored
--------------
Each sample is ``{"image": uint8 (S, S, 3), "label": int64}``; the image is
exactly `tbl_loader.conversion.decode.reference_preprocess` of the source file (see that
module for the rule). Dataset metadata::

    {"classes": [name of label 0, name of label 1, ...],
     "preprocess": {"size": S, "mode": "center_crop" | "squash",
                    "resample": "bilinear" | "bicubic" | "lanczos", "draft": bool,
                    "alpha_background": [255, 255, 255], "exif_transpose": true,
                    "converter": "tbl-loader <version>", "pillow": <version>,
                    "libjpeg": <libjpeg API version>,
                    "libjpeg_turbo": <libjpeg-turbo version or null>}}

With ``max_size=N`` instead of ``size``, images keep their aspect ratio with
the longer side capped at N, as raw pixels of their own size or as JPEG bytes,
with ``height`` and ``width`` columns: see `tbl_loader.conversion.variable`.

Order
-----
Samples are stored in the source's order (`tbl_loader.conversion.sources`: TAR and
folder sources sorted by relative path, a list as given), whatever the number
of workers. ``part=(i, n)`` converts the contiguous range
``[i * N // n, (i + 1) * N // n)`` of that order (N = images in the whole
source; class names always come from the whole source), so parts 0..n-1
merged in index order (`merge_parts`) equal the unsplit conversion.

Parallelism and memory
----------------------
Worker processes (``forkserver`` on Linux, ``spawn`` elsewhere: the parent
may run threads, which fork does not survive) read their own bytes (files by
path, TAR members by offset with ``pread``), decode and resize. With ``size``
into one file (no ``shard_rows`` / ``shards``, ``keep_path`` or ``sidecar``),
each worker writes the pixels of image i straight into slot i of the output's
temp file (`tbl_format.PlacedWriter`), around the page cache where the file
system allows it (`tbl_loader.conversion.chunk_writer`): every image is written once, and the
parent only commits rows in order (labels, checksums) and moves later rows
down over a skipped image's slot. Otherwise workers return raw pixels and the
parent writes them in order through `tbl_format.Writer`. The parent keeps at
most ``4 * workers`` chunks in flight, so memory stays bounded whatever the
dataset size (about 16 MiB of decoded pixels in flight per worker when they
travel back; written in place, a worker holds one chunk's rows for direct
writes: 4.7 MiB at 160 px, never over 64 MiB). The fork server starts while
the source is listed.
``workers=1`` runs in the calling process with the same code. As with any
``spawn``/``forkserver`` pool, a script calling `convert` with workers > 1
needs the usual ``if __name__ == "__main__":`` guard.

Failures
--------
A bad image is never stored: one Pillow cannot decode (corrupt, truncated, not
an image, empty), one that is not a regular file (a FIFO, a device node, a
broken link: never opened, see `tbl_loader.conversion.sources`) or one over
``max_image_bytes`` (never read). ``on_error="fail"`` (default) raises
`ImageDecodeError` naming the first bad file in order and publishes nothing;
``on_error="skip"`` leaves it out and lists it. Folders and second names of
one file that the listing skipped are listed in the report too
(`ConvertReport.skipped`). The output is published by the writer's temp file
+ atomic rename, so an exception or Ctrl-C leaves no dataset at ``dst``. A
worker process that dies (killed, out of memory) raises `WorkerCrashError`;
nothing is published either. Workers end with the converting process however
it ends (SIGKILL included): none is left behind.

Destination
-----------
Checked before the source is read, refused with `DestinationError` (nothing
is written or removed): a ``dst`` that is a symbolic link, a FIFO, a device
node or a socket (it is never replaced); a ``dst`` that is the source or the
label file; a directory where a file is written (no ``shard_rows`` /
``shards``) or a file where a directory is; an existing ``dst`` unless
``overwrite=True``. An empty directory is not "existing". With ``overwrite=True`` an
existing ``.tbl`` file is replaced, and a dataset directory is replaced only
if each shard file its manifest lists is a regular TBL file the directory
itself holds (no link on the way): the writer removes those after
publishing and nothing else; otherwise the dataset is refused and left as
it is. A non-empty directory that is not a dataset takes the new dataset
with ``overwrite=True`` and loses nothing. A file that is not a TBL dataset is
never replaced.

Report
------
A JSON report (``dst + ".report.json"`` unless ``report`` says otherwise)
records counts, every failed and skipped file with why, timings and
images/s; it is written on failure too, with ``"status": "failed"``. A report
path that is not a regular file, is the source, the label file or ``dst``,
or exists and is not a conversion report, is refused up front. If writing the report fails at the end (no
space, no permission), the dataset is published anyway and
`ConvertReport.report_error` says why; on a failed conversion the exception
carries that as a note.
"""

from __future__ import annotations

import ctypes
import json
import math
import multiprocessing
import os
import select
import signal
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from multiprocessing import forkserver, resource_tracker
from pathlib import Path
from typing import Any

import numpy as np
import PIL
from PIL import features

import tbl_format

from ..errors import DestinationError, ImageDecodeError, PillowConfigError, WorkerCrashError
from ..image.jpeg import decoder_info
from ..source.storage import is_url, redact
from ..version import __version__
from .chunk_writer import ChunkWriter
from .decode import ALPHA_BACKGROUND, check_params, check_strict, preprocess_image, preprocess_into
from .extra_columns import ExtraColumns
from .formats import open_any_source
from .sources import (
    DEFAULT_MAX_IMAGE_BYTES,
    Listing,
    Locator,
    TarReader,
    check_empty_classes,
    read_file,
)
from .variable import DEFAULT_QUALITY, VariableRecipe

__all__ = [
    "ON_ERROR",
    "ConvertReport",
    "Decoder",
    "FixedRecipe",
    "ImageError",
    "check_destination",
    "check_report_path",
    "convert",
    "dataset_metadata",
    "finish_report",
    "fixed_schema",
    "merge_parts",
    "parse_part",
    "part_range",
]

ON_ERROR = ("fail", "skip")
# Images per task: enough to amortise inter-process overhead (a task costs the
# converting process ~0.5 ms: 64 rather than 32 took its CPU for 10,000 images
# from 0.58 to 0.47 s), few enough that a small dataset still spreads over every
# worker and that the last tasks end close together. When the pixels travel back
# (not written in place), a chunk's pixels also stay under CHUNK_BYTES: with
# CHUNKS_IN_FLIGHT_PER_WORKER chunks queued or returned per worker, decoded
# pixels in flight stay under about 16 MiB per worker.
MAX_CHUNK = 64
CHUNK_BYTES = 4 << 20
CHUNKS_IN_FLIGHT_PER_WORKER = 4
SUMMARY_ERRORS = 20  # failed files named in the printed summary; the report file lists all
PR_SET_PDEATHSIG = 1  # linux/prctl.h
REPORT_MAX_BYTES = 1 << 30  # an existing report is read to check it is one before it is replaced


@dataclass(frozen=True)
class ImageError:
    """One image left out of a conversion: its name in the source and what Pillow said."""

    name: str
    message: str


@dataclass
class ConvertReport:
    """What a conversion did; `to_json` is the report file's content."""

    source: str
    destination: str
    status: str  # "ok" or "failed"
    size: int | None  # None for a variable-size conversion (max_size)
    mode: str
    resample: str
    draft: bool
    workers: int
    part: tuple[int, int] | None
    part_range: tuple[int, int]  # [start, stop) in the whole source's order
    source_images: int  # images in the whole source
    total: int  # images in this part
    written: int
    failed: int
    errors: list[ImageError]
    ignored_files: int  # non-image / hidden / unlisted files in the source
    classes: int
    skipped: list[ImageError] = field(default_factory=list)  # folders / second names the listing left out
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    timings: dict[str, float] = field(default_factory=dict)  # scan_s, convert_s, total_s
    images_per_s: float = 0.0  # images processed / total_s (end to end)
    error: str | None = None  # why a failed conversion stopped
    report_error: str | None = None  # why the report file could not be written (then it is not there)
    max_size: int | None = None  # variable-size conversion: the cap on the longer side
    store: str | None = None  # variable-size conversion: "raw" or "jpeg"
    empty_classes: list[str] = field(default_factory=list)  # class folders kept without images (their label stays)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["part"] = list(self.part) if self.part else None
        out["part_range"] = list(self.part_range)
        return out

    def summary(self) -> str:
        lines = [
            f"{self.status}: {self.written}/{self.total} images -> {self.destination} "
            f"({self.images_per_s:.0f} images/s, {self.timings.get('total_s', 0.0):.1f} s, "
            f"{self.workers} workers)"
        ]
        if self.failed:
            lines.append(f"{self.failed} image(s) failed:")
            lines.extend(f"  {e.name}: {e.message}" for e in self.errors[:SUMMARY_ERRORS])
            if self.failed > SUMMARY_ERRORS:
                lines.append(f"  ... and {self.failed - SUMMARY_ERRORS} more (all are in the report file)")
        if self.skipped:
            lines.append(f"{len(self.skipped)} folder(s) or file name(s) skipped:")
            lines.extend(f"  {e.name}: {e.message}" for e in self.skipped[:SUMMARY_ERRORS])
            if len(self.skipped) > SUMMARY_ERRORS:
                lines.append(f"  ... and {len(self.skipped) - SUMMARY_ERRORS} more (all are in the report file)")
        if self.ignored_files:
            lines.append(f"{self.ignored_files} non-image file(s) ignored")
        if self.empty_classes:
            lines.append(f"{len(self.empty_classes)} empty class folder(s) kept with their label: "
                         + ", ".join(self.empty_classes[:SUMMARY_ERRORS])
                         + (" ..." if len(self.empty_classes) > SUMMARY_ERRORS else ""))
        return "\n".join(lines)


# ---------------------------------------------------------------- worker side


@dataclass(frozen=True)
class FixedRecipe:
    """The fixed S x S conversion (``size=``): how a worker prepares one image and how its row is written."""

    size: int
    mode: str
    resample: str
    draft: bool

    def prepare(self, data: bytes) -> bytes:
        return preprocess_image(data, self.size, self.mode, self.resample, self.draft).tobytes()

    def prepare_into(self, data: bytes, slot: int, row: memoryview) -> list[int]:
        """The pixels of ``data`` made in ``row`` (the row of slot ``slot``); returns their `tbl_format.row_crcs`."""
        preprocess_into(data, self.size, self.mode, self.resample, self.draft, row)
        return tbl_format.row_crcs(slot, row)

    def pixel_bytes(self) -> int:
        return self.size * self.size * 3

    def schema(self) -> tbl_format.Schema:
        return fixed_schema(self.size)

    def row(self, prepared: bytes, label: int) -> dict[str, Any]:
        return {"image": np.frombuffer(prepared, np.uint8).reshape(self.size, self.size, 3), "label": label}

    def describe(self) -> dict[str, Any]:
        return {"size": self.size, "mode": self.mode, "resample": self.resample, "draft": self.draft}

    def stored_geometry(self, height: int, width: int) -> tuple[np.ndarray, tuple[int, int]]:
        """The region ``(top, left, height, width)`` (float64) of an upright ``height x width`` source that
        becomes the stored image, and the stored ``(H, W)``: `tbl_loader.conversion.decode`'s step 6."""
        if self.mode == "squash":
            return np.array([0.0, 0.0, height, width]), (self.size, self.size)
        side = min(height, width)  # center_crop: the central square, offsets kept fractional
        return np.array([(height - side) / 2, (width - side) / 2, side, side], dtype=np.float64), (self.size,
                                                                                                  self.size)


Recipe = FixedRecipe | VariableRecipe


@dataclass(frozen=True)
class _Placement:
    """Where prepared pixels go when they are written in place: slot i at ``base + i * row_bytes`` of ``path``
    (the output's temp file, see `tbl_format.PlacedWriter`)."""

    path: str
    base: int
    row_bytes: int


class Decoder:
    """Reads and preprocesses samples; one per worker process (or in-process for workers=1).

    With a placement, prepared pixels are written straight into the output file (`ChunkWriter`, a chunk of
    at most ``chunk_rows`` slots at a time) and only their CRCs or the error go back to the parent;
    otherwise the pixels themselves go back.
    """

    def __init__(self, tar_path: str | None, max_bytes: int, recipe: Recipe,
                 placement: _Placement | None = None, chunk_rows: int = 1) -> None:
        self.rows: ChunkWriter | None = None
        self.tar = TarReader(tar_path, max_bytes) if tar_path is not None else None
        self.max_bytes = max_bytes
        self.recipe = recipe
        if placement is not None:
            try:
                self.rows = ChunkWriter(placement.path, placement.base, placement.row_bytes, chunk_rows)
            except BaseException:
                self.close()
                raise

    def read(self, locator: Locator) -> tuple[bytes | None, str | None]:
        """The encoded bytes of one image, or the error that stopped reading them."""
        try:
            if isinstance(locator, str):
                return read_file(locator, self.max_bytes), None
            assert self.tar is not None
            return self.tar.read(*locator), None
        except MemoryError:
            raise
        except Exception as e:  # one bad file must not stop the others; it is reported by name
            return None, f"{type(e).__name__}: {e}"

    def one(self, locator: Locator) -> tuple[Any, str | None]:
        data, err = self.read(locator)
        if data is None:
            return None, err
        try:
            return self.recipe.prepare(data), None
        except (PillowConfigError, MemoryError):
            raise
        except Exception as e:  # one bad file must not stop the others; it is reported by name
            return None, f"{type(e).__name__}: {e}"

    def chunk(self, start: int, locators: Sequence[Locator]) -> list[tuple[Any, str | None]]:
        """The images of slots ``start ..``: prepared pixels or their CRCs (with a placement), or errors."""
        if self.rows is None:
            return [self.one(loc) for loc in locators]
        return self._place(start, locators)

    def _place(self, start: int, locators: Sequence[Locator]) -> list[tuple[list[int] | None, str | None]]:
        """Prepare each image in its slot of the chunk's buffer and write it there; per image (its
        `tbl_format.row_crcs`, None) or (None, error).

        The pixels are made where they are written (`ChunkWriter.fill`, `FixedRecipe.prepare_into`) and
        checksummed there while in this core's cache, so that the converting process need not read them
        back. The chunk is written when this returns. A bad image is an error message (its slot is left
        zero, never committed); a failed write (a full disk) raises: it fails the conversion.
        """
        assert self.rows is not None and isinstance(self.recipe, FixedRecipe)
        self.rows.begin(start, len(locators))
        out: list[tuple[list[int] | None, str | None]] = []
        for k, loc in enumerate(locators):
            data, err = self.read(loc)
            errors = [] if err is None else [err]
            # Only making the row is guarded (`_made_in`): a failed write (a full disk) raises out of fill.
            crcs = self.rows.fill(k, partial(self._made_in, data, start + k, errors))
            out.append((crcs, None) if crcs is not None else (None, errors[0]))
        self.rows.finish()
        return out

    def _made_in(self, data: bytes | None, slot: int, errors: list[str], row: memoryview) -> list[int] | None:
        """The row of ``data`` made in ``row``, and its CRCs; None for no row (its error appended to ``errors``)."""
        if data is None:
            return None
        try:
            return self.recipe.prepare_into(data, slot, row)
        except (PillowConfigError, MemoryError):
            raise
        except Exception as e:  # one bad file must not stop the others; it is reported by name
            errors.append(f"{type(e).__name__}: {e}")
            return None

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()
            self.tar = None
        if self.rows is not None:
            self.rows.close()
            self.rows = None


_WORKER: Decoder | None = None


def _init_worker(parent_pid: int, tar_path: str | None, max_bytes: int, recipe: Recipe,
                 placement: _Placement | None, chunk_rows: int) -> None:
    global _WORKER
    # Ctrl-C reaches the whole process group: only the parent acts on it (it aborts the writer and
    # stops the pool); a worker finishes its chunk instead of dying with its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(parent_pid)
    _WORKER = Decoder(tar_path, max_bytes, recipe, placement, chunk_rows)


def _die_with(parent_pid: int) -> None:
    """End this worker when the converting process ends, however it ends (SIGKILL included).

    A pool worker's parent is the forkserver, not the converting process, and a worker blocked on
    its task queue never sees the parent go (other workers hold the queue's write end too).
    PR_SET_PDEATHSIG covers the forkserver ending; a thread waiting on a pidfd of the converting
    process (readable once it exits; a pid may be reused, a pidfd is not) covers the rest.
    """
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    try:
        pidfd: int | None = os.pidfd_open(parent_pid)
    except ProcessLookupError:
        os._exit(1)  # the converting process is gone already
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3: poll instead
        pidfd = None
    threading.Thread(target=_exit_when_gone, args=(parent_pid, pidfd), name="tbl-convert-parent", daemon=True).start()


def _exit_when_gone(pid: int, pidfd: int | None) -> None:
    if pidfd is not None:
        select.select([pidfd], [], [])
    else:
        while True:
            time.sleep(1.0)
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except PermissionError:
                pass
    os._exit(1)


def _worker_chunk(start: int, locators: Sequence[Locator]) -> list[tuple[Any, str | None]]:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.chunk(start, locators)


# ---------------------------------------------------------------- parent side


def parse_part(part: str | tuple[int, int] | None) -> tuple[int, int] | None:
    """``"i/n"`` or ``(i, n)`` with ``0 <= i < n`` -> ``(i, n)``; None stays None."""
    if part is None:
        return None
    if isinstance(part, str):
        pieces = part.split("/")
        if len(pieces) != 2 or not all(p.strip().isdigit() for p in pieces):
            raise ValueError(f"part must look like 'i/n' (e.g. '0/4'), got {part!r}")
        i, n = int(pieces[0]), int(pieces[1])
    else:
        i, n = part
    if not (isinstance(i, int) and isinstance(n, int)) or not 0 <= i < n:
        raise ValueError(f"part must satisfy 0 <= i < n, got {i}/{n}")
    return i, n


def part_range(n: int, part: tuple[int, int] | None) -> tuple[int, int]:
    """Rows ``[start, stop)`` of part ``(i, k)`` of ``n`` samples: ``[i * n // k, (i + 1) * n // k)``."""
    if part is None:
        return 0, n
    i, k = part
    return i * n // k, (i + 1) * n // k


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _mp_context() -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # Workers fork from a server that imported the decoder once, instead of each importing it (~0.3 s).
    ctx.set_forkserver_preload([__name__])
    return ctx


def _start_forkserver() -> None:
    """Start the fork server now (it returns at once; the server imports this module in the background), so
    that its start-up overlaps the source listing instead of delaying the first worker after it."""
    ctx = _mp_context()
    if ctx.get_start_method() == "forkserver":
        with _sigint_deferred():
            forkserver.ensure_running()


@contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Ctrl-C held back while the pool starts its processes, then raised as KeyboardInterrupt.

    Two things can go wrong without this. A KeyboardInterrupt raised inside the pool's start-up
    code (between starting a process and recording it) leaves a worker the pool never joins, which
    then dies with a traceback of its own. And the forkserver, started from this thread, inherits
    its signal mask (as every worker inherits the forkserver's): with SIGINT blocked here, neither
    can die of a Ctrl-C with a traceback before it ignores SIGINT.
    """
    caught: list[int] = []
    handler = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is (
        signal.default_int_handler
    ):
        handler = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    mask = None
    if hasattr(signal, "pthread_sigmask"):
        # The resource tracker starts first, outside the block: starting it unblocks SIGINT on its way out.
        resource_tracker.ensure_running()
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if handler is not None:
            signal.signal(signal.SIGINT, handler)
    if caught:
        raise KeyboardInterrupt


def _results_in_order(
    listing: Listing,
    names: Sequence[str],
    locators: Sequence[Locator],
    workers: int,
    max_bytes: int,
    recipe: Recipe,
    placement: _Placement | None = None,
) -> Iterator[tuple[Any, str | None]]:
    """Preprocessed images (or error messages) in the order of ``locators``, with a bounded window.

    With a placement the pixels are written in place by whoever decodes them and their CRCs stand for them.
    """
    by_spread = math.ceil(len(locators) / (workers * CHUNKS_IN_FLIGHT_PER_WORKER))
    chunk = min(MAX_CHUNK, by_spread)
    if placement is None:  # the pixels travel back: a chunk's stay under CHUNK_BYTES
        chunk = min(chunk, CHUNK_BYTES // recipe.pixel_bytes())
    chunk = max(1, chunk)
    if workers == 1:  # the same chunks, in this process
        decoder = Decoder(listing.tar_path, max_bytes, recipe, placement, chunk)
        try:
            for start in range(0, len(locators), chunk):
                yield from decoder.chunk(start, locators[start : start + chunk])
        finally:
            decoder.close()
        return
    starts = iter(range(0, len(locators), chunk))
    pool: ProcessPoolExecutor | None = None
    pending: deque[tuple[int, Future[list[tuple[Any, str | None]]]]] = deque()
    current = 0  # first image of the chunk being waited for

    def submit_next() -> None:
        assert pool is not None
        start = next(starts, None)
        if start is not None:
            pending.append((start, pool.submit(_worker_chunk, start, locators[start : start + chunk])))

    try:
        with _sigint_deferred():
            pool = ProcessPoolExecutor(
                max_workers=workers,
                mp_context=_mp_context(),
                initializer=_init_worker,
                initargs=(os.getpid(), listing.tar_path, max_bytes, recipe, placement, chunk),
            )
            for _ in range(workers * CHUNKS_IN_FLIGHT_PER_WORKER):
                submit_next()
        while pending:
            current, future = pending.popleft()
            results = future.result()
            submit_next()
            yield from results
    except BrokenProcessPool as e:
        # Raised by result() or submit(); the pool cannot tell which chunk killed it: name the range in flight.
        last_start = pending[-1][0] if pending else current
        last = names[min(last_start + chunk, len(names)) - 1]
        raise WorkerCrashError(
            f"a worker process died with images {names[current]!r} .. {last!r} in flight (killed, out "
            f"of memory, or crashed in a decoder; if it died at start-up: a script that calls "
            f"convert() with workers > 1 needs an `if __name__ == '__main__':` guard and a file, not "
            f"stdin); nothing was published. workers=1 converts in this process"
        ) from e
    finally:
        # On an error or an early stop, drop queued chunks instead of decoding them.
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def dataset_metadata(listing: Listing, recipe: Recipe) -> dict[str, Any]:
    return {
        "classes": list(listing.classes),
        "preprocess": {
            **recipe.describe(),
            "alpha_background": list(ALPHA_BACKGROUND),
            "exif_transpose": True,
            "converter": f"tbl-loader {__version__}",
            "pillow": PIL.__version__,
            # JPEG decoding (and DCT-scaled drafts) can differ between libjpeg builds
            "libjpeg": features.version("jpg"),
            "libjpeg_turbo": features.version("libjpeg_turbo"),
            **({"decoder": decoder_info()} if getattr(recipe, "store", None) == "jpeg" else {}),
        },
    }


def fixed_schema(size: int) -> tbl_format.Schema:
    return tbl_format.Schema({"image": tbl_format.Leaf("image", shape=(size, size, 3)), "label": tbl_format.Leaf("int")})


def schema_with_extra(schema: tbl_format.Schema, extra: ExtraColumns | None) -> tbl_format.Schema:
    """The recipe's schema plus the extra columns of --keep-path / --sidecar (ExtraColumns refused any name
    the recipe writes, so none replaces a recipe column)."""
    return schema if extra is None else tbl_format.Schema({**schema.tree, **extra.leaves})


def _write_report(report: ConvertReport, path: Path) -> None:
    """Atomic write (temp + rename) so a reader never sees half a report."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _identity(path: Path) -> tuple[int, int] | None:
    """(st_dev, st_ino) of what ``path`` names (links followed), None if nothing is there."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_destination(dst: Path, *, sharded: bool, overwrite: bool, inputs: Sequence[Path]) -> None:
    """Refuse a destination the conversion must not write (see the module docstring); DestinationError."""
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        return
    except OSError as e:  # a parent that is a file (ENOTDIR), no permission, a link loop
        raise DestinationError(f"{dst}: {e.strerror or e}") from e
    kind = tbl_format.file_kind(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        raise DestinationError(f"{dst} is a symbolic link; name the file or folder itself (a link is never replaced)")
    own = (st.st_dev, st.st_ino)
    for p in inputs:
        if _identity(p) == own:
            raise DestinationError(f"{dst} is the source {str(p)!r}; it is never overwritten")
    if stat.S_ISREG(st.st_mode):
        if sharded:
            raise DestinationError(f"{dst} is a file; a sharded dataset (--shards or --shard-rows) is a folder")
        if not overwrite:
            raise DestinationError(f"{dst} exists; pass --force (overwrite=True) to replace it")
        try:
            tbl_format.open(dst).close()
        except (tbl_format.FormatError, OSError, ValueError) as e:
            raise DestinationError(f"{dst} is not a TBL dataset ({e}); --force replaces only a TBL file") from e
        return
    if not stat.S_ISDIR(st.st_mode):
        raise DestinationError(f"{dst} is {kind}; a destination is a file or a folder, and {kind} is never replaced")
    if not sharded:
        raise DestinationError(f"{dst} is a folder; name a file, or pass --shards or --shard-rows for a sharded dataset")
    with os.scandir(dst) as it:
        empty = next(it, None) is None
    if empty:
        return
    if not overwrite:
        raise DestinationError(f"{dst} is a folder that is not empty; pass --force (overwrite=True) to write into it")
    if not os.path.lexists(dst / "manifest.json"):
        return  # not a dataset: written into, nothing in it is removed
    try:
        ds = tbl_format.open(dst)
        try:
            entries = ds.shard_entries
        finally:
            ds.close()
    except (tbl_format.FormatError, OSError, ValueError) as e:
        raise DestinationError(f"{dst} holds a manifest that does not open ({e}); it is not replaced") from e
    for entry in entries:
        why = tbl_format.foreign_shard(dst, entry["file"])
        if why is not None:
            raise DestinationError(
                f"{dst}: its dataset lists {entry['file']!r}, and {why}; --force replaces a dataset only "
                f"when every shard it lists is a TBL file the folder itself holds: nothing was changed"
            )


def check_report_path(path: Path, inputs: Sequence[Path]) -> None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise DestinationError(f"report {path}: {e.strerror or e}") from e
    if not stat.S_ISREG(st.st_mode):
        raise DestinationError(f"report {path} is {tbl_format.file_kind(st.st_mode)}; it is never replaced")
    for p in inputs:
        if _identity(p) == (st.st_dev, st.st_ino):
            raise DestinationError(f"report {path} is {str(p)!r}, an input or the destination; it is never overwritten")
    # Like a dataset, an existing file is replaced only by its own kind: a report of an earlier conversion.
    try:
        old = json.loads(read_file(path, REPORT_MAX_BYTES))
    except (OSError, ValueError):
        old = None
    if not (isinstance(old, dict) and {"source", "destination", "status"} <= old.keys()):
        raise DestinationError(f"report {path} exists and is not a conversion report; it is never replaced")


def convert(
    src: str | os.PathLike[str] | Sequence[tuple[str | os.PathLike[str], int | str]],
    dst: str | os.PathLike[str],
    size: int | None = None,
    *,
    max_size: int | None = None,
    store: str = "raw",
    quality: int = DEFAULT_QUALITY,
    mode: str = "center_crop",
    workers: int | None = None,
    on_error: str = "fail",
    shard_rows: int | None = None,
    shards: int | None = None,
    part: str | tuple[int, int] | None = None,
    report: str | os.PathLike[str] | bool | None = None,
    progress: bool = True,
    label_file: str | os.PathLike[str] | None = None,
    resample: str = "bilinear",
    draft: bool = True,
    overwrite: bool = False,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    keep_path: bool = False,
    sidecar: str | os.PathLike[str] | None = None,
    allow_empty_classes: bool = False,
    geometry: dict[str, str] | None = None,
    source_format: str | None = None,
    image_key: str | None = None,
    label_key: str | None = None,
) -> ConvertReport:
    """Convert ``src`` (TAR, folder tree, list of (path, label), or a record source) to a .tbl dataset at ``dst``.

    ``size``: stored side S. ``mode``: "center_crop" or "squash". Or, instead
    of ``size``, ``max_size``: images keep their aspect with the longer side
    capped at N, stored as ``store="raw"`` pixels or ``"jpeg"`` bytes (JPEGs
    within the cap kept as they are, others encoded at ``quality``); see
    `tbl_loader.conversion.variable`. ``workers``:
    processes (default: all usable cores). ``shard_rows`` / ``shards`` (at most
    one): write a directory of shards of that many rows / about that many
    shards. ``part``: ``"i/n"`` or ``(i, n)``, convert only that contiguous
    part (merge with `merge_parts`). ``report``: path of the JSON report,
    None for ``dst + ".report.json"``, False for none. ``progress``: tqdm bar
    on stderr. ``label_file``: see `tbl_loader.conversion.sources`. ``resample`` and
    ``draft``: see `tbl_loader.conversion.decode`. ``overwrite``: replace an existing
    dataset at ``dst`` (see the module docstring for what is removed).
    ``max_image_bytes``: encoded size cap on one image (a bigger one is a bad
    image, never read). ``keep_path`` (``path`` and ``orig_size`` columns) and
    ``sidecar`` (per-image fields from a JSON / CSV file keyed by path): see
    `tbl_loader.conversion.extra_columns`. ``allow_empty_classes``: keep a class folder
    without images as a class with its label index (otherwise `EmptyClassError`
    names it and nothing is written). ``geometry`` (``{field: "xyxy"}``): boxes in the
    upright source image's pixels, stored mapped through the conversion's resize and crop into stored
    pixels (`tbl_loader.conversion.extra_columns`). ``source_format``: one of ``FORMATS``
    (`tbl_loader.conversion.formats`), None to detect it from ``src``: WebDataset
    shards, Parquet / Arrow, a HuggingFace `datasets` Dataset or folder, a CSV /
    JSONL manifest, whose other members / columns become fields as a sidecar's
    do; ``image_key`` / ``label_key`` name their image and label member or
    column.
    """
    t0 = time.perf_counter()
    if (size is None) == (max_size is None):
        raise ValueError("give exactly one of size (fixed S x S images) and max_size (variable size, aspect kept)")
    recipe: Recipe
    if size is not None:
        check_params(size, mode, resample)
        recipe = FixedRecipe(size, mode, resample, draft)
    else:
        recipe = VariableRecipe(max_size, store, quality, resample, draft)
    # Checked here, not only where images are decoded: worker processes start with Pillow's
    # defaults, so without this the result would depend on the number of workers.
    check_strict()
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    if workers is None:
        workers = _default_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    if shard_rows is not None and shards is not None:
        raise ValueError("give at most one of shard_rows and shards")
    for name, value in (("shard_rows", shard_rows), ("shards", shards)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if isinstance(max_image_bytes, bool) or not isinstance(max_image_bytes, int) or max_image_bytes < 1:
        raise ValueError(f"max_image_bytes must be a positive int, got {max_image_bytes!r}")
    part_t = parse_part(part)
    if is_url(dst):  # (a scheme TBL does not read is refused by is_url itself, never made a local folder)
        raise ValueError(f"{redact(os.fspath(dst))}: convert writes a local path; to publish at a URL, run "
                         "`tbl convert SRC URL` (converted here, uploaded, the manifest published last) or "
                         "upload_dataset the converted folder")
    dst_path = Path(dst)
    report_path: Path | None
    if report is None or report is True:
        report_path = Path(f"{dst_path}.report.json")
    elif report is False:
        report_path = None
    else:
        report_path = Path(report)

    sharded = shard_rows is not None or shards is not None
    if not sharded and os.fspath(dst).endswith(("/", os.sep)):
        raise DestinationError(f"{os.fspath(dst)}: names a folder; a folder takes a sharded dataset (shards=/shard_rows=)")
    inputs = [Path(p) for p in (src, label_file) if isinstance(p, (str, os.PathLike))]
    check_destination(dst_path, sharded=sharded, overwrite=overwrite, inputs=inputs)
    if report_path is not None:
        check_report_path(report_path, [*inputs, dst_path])
    try:
        dst_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DestinationError(f"cannot create the folder {dst_path.parent} for {dst_path}: {e.strerror or e}") from e
    if workers > 1:
        _start_forkserver()  # it imports the decoder on another core while this one lists the source
    with open_any_source(src, source_format=source_format, label_file=label_file, scratch_dir=dst_path.parent,
                         image_key=image_key, label_key=label_key, on_error=on_error,
                         max_bytes=max_image_bytes) as listing:
        check_empty_classes(listing, allow_empty_classes)  # refused before anything is written
        n_all = len(listing)
        start, stop = part_range(n_all, part_t)
        names = listing.names[start:stop]
        labels = listing.labels[start:stop]
        locators = listing.locators[start:stop]
        extra = ExtraColumns(names, locators, written=list(recipe.schema().tree), keep_path=keep_path,
                             sidecar=sidecar, tar_path=listing.tar_path, max_bytes=max_image_bytes,
                             fields=listing.fields, geometry=geometry, placement=recipe.stored_geometry)
        workers = max(1, min(workers, len(locators)))
        t_scan = time.perf_counter()
        rep = ConvertReport(
            source=os.fspath(src) if isinstance(src, (str, os.PathLike)) else f"<{listing.kind} of {n_all}>",
            destination=str(dst_path),
            status="failed",
            size=size,
            max_size=max_size,
            store=None if max_size is None else store,
            mode=mode,
            resample=resample,
            draft=draft,
            workers=workers,
            part=part_t,
            part_range=(start, stop),
            source_images=n_all,
            total=len(names),
            written=0,
            failed=0,
            errors=[],
            ignored_files=len(listing.ignored),
            classes=len(listing.classes),
            skipped=[ImageError(name, why) for name, why in listing.skipped],
            max_image_bytes=max_image_bytes,
            empty_classes=list(listing.empty_classes),
        )
        if shards is not None:
            shard_rows = max(1, math.ceil(len(names) / shards))
        try:
            _convert_into(
                listing, names, labels, locators, dst_path, workers, max_image_bytes, recipe, on_error, shard_rows,
                overwrite, progress, rep, extra,
            )
        except BaseException as e:
            extra.close()
            rep.error = f"{type(e).__name__}: {e}"
            finish_report(rep, t0, t_scan, report_path)
            if rep.report_error is not None:
                e.add_note(rep.report_error)
            raise
        extra.close()
        rep.status = "ok"
        finish_report(rep, t0, t_scan, report_path)
    return rep


def finish_report(rep: ConvertReport, t0: float, t_scan: float, report_path: Path | None) -> None:
    t_end = time.perf_counter()
    rep.timings = {"scan_s": t_scan - t0, "convert_s": t_end - t_scan, "total_s": t_end - t0}
    done = rep.written + rep.failed
    rep.images_per_s = done / rep.timings["total_s"] if rep.timings["total_s"] > 0 else 0.0
    if report_path is not None:
        try:
            _write_report(rep, report_path)
        except OSError as e:  # the dataset stands (or the first error does): the report's failure is told, not raised
            rep.report_error = f"the report {report_path} could not be written: {e.strerror or e}"


class _NoBar:
    """The progress bar when there is none (progress off, or tqdm not installed): every call does nothing."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass


def _progress_bar(total: int, progress: bool) -> Any:
    """A tqdm bar on stderr when asked for and tqdm is installed (the `progress` extra), else a _NoBar."""
    if not progress:
        return _NoBar()
    try:
        from tqdm import tqdm  # optional: imported only when a bar is wanted
    except ImportError:
        return _NoBar()
    return tqdm(total=total, unit="img", desc="convert", file=sys.stderr)


def _convert_into(
    listing: Listing,
    names: list[str],
    labels: list[int],
    locators: list[Locator],
    dst: Path,
    workers: int,
    max_bytes: int,
    recipe: Recipe,
    on_error: str,
    shard_rows: int | None,
    overwrite: bool,
    progress: bool,
    rep: ConvertReport,
    extra: ExtraColumns | None = None,
) -> None:
    if isinstance(recipe, FixedRecipe) and not extra and shard_rows is None:
        _convert_placed(listing, names, labels, locators, dst, workers, max_bytes, recipe, on_error, overwrite,
                        progress, rep)
        return
    results = _results_in_order(listing, names, locators, workers, max_bytes, recipe)
    # Exit order on an exception: the pool stops (closing: now, not when the traceback is freed),
    # then the bar, then the writer aborts, removing its temp files; on success it publishes.
    with (
        tbl_format.Writer(
            dst, schema_with_extra(recipe.schema(), extra), metadata=dataset_metadata(listing, recipe), shard_rows=shard_rows,
            overwrite=overwrite,
        ) as writer,
        _progress_bar(len(names), progress) as bar,
        closing(results),
    ):
        for i, (pixels, err) in enumerate(results):
            if err is None and extra:
                err = extra.refusal(i)  # e.g. a name the path column cannot hold: an image error like any
            if err is not None:
                _record_failure(rep, bar, names[i], err, on_error)
            else:
                assert pixels is not None
                sample = recipe.row(pixels, labels[i])
                writer.write({**sample, **extra.row(i)} if extra else sample)
                rep.written += 1
            bar.update(1)
    # Old shards the writer did not remove (not provably the old dataset's own) are told, never silent.
    rep.skipped.extend(ImageError(str(p), "an old shard file left in place (not provably the dataset's own)")
                       for p in writer.kept)


def _record_failure(rep: ConvertReport, bar: Any, name: str, err: str, on_error: str) -> None:
    """An image that did not decode: fatal under ``on_error="fail"``, else counted and named in the report."""
    if on_error == "fail":
        raise ImageDecodeError(name, err)
    rep.errors.append(ImageError(name, err))
    rep.failed += 1
    bar.set_postfix(failed=rep.failed, refresh=False)


def _convert_placed(
    listing: Listing,
    names: list[str],
    labels: list[int],
    locators: list[Locator],
    dst: Path,
    workers: int,
    max_bytes: int,
    recipe: FixedRecipe,
    on_error: str,
    overwrite: bool,
    progress: bool,
    rep: ConvertReport,
) -> None:
    """One file of S x S images: each image is written once, by its decoder, straight into its place in the
    output (`tbl_format.PlacedWriter`), and checksummed there (`tbl_format.row_crcs`); this process commits
    rows in order, folding those CRCs into the file's block checksums.

    Image i goes to slot i; a skipped image's slot is never committed, and later rows move down over it,
    so the file is the one the streaming writer would write from the same rows.
    """
    # Exit order on an exception: the pool stops (closing), then the bar, then the writer aborts,
    # removing its temp file (after the workers that write into it are gone); on success it publishes.
    with tbl_format.PlacedWriter(dst, recipe.schema(), placed="image", capacity=len(names),
                                 metadata=dataset_metadata(listing, recipe), overwrite=overwrite) as writer:
        placement = _Placement(writer.path, writer.offset(0) if names else 0, writer.row_bytes)
        results = _results_in_order(listing, names, locators, workers, max_bytes, recipe, placement)
        with _progress_bar(len(names), progress) as bar, closing(results):
            for i, (crcs, err) in enumerate(results):
                if err is not None:
                    _record_failure(rep, bar, names[i], err, on_error)
                else:
                    writer.commit(i, {"label": labels[i]}, crcs)
                    rep.written += 1
                bar.update(1)


def _check_part_reports(parts: Sequence[str | os.PathLike[str]]) -> None:
    """When every part still has its default report file, check they are parts 0..n-1 of one source, in order."""
    reports = []
    for p in parts:
        path = Path(f"{os.fspath(p)}.report.json")
        if not path.is_file():
            return  # reports are optional: moved parts are merged on the caller's word
        try:
            reports.append(json.loads(path.read_text()))
        except ValueError as e:
            raise ValueError(f"report {str(path)!r} of part {os.fspath(p)!r} is not JSON: {e}") from e
    expected_start = 0
    for k, (p, rep) in enumerate(zip(parts, reports, strict=True)):
        part, part_range = rep.get("part"), rep.get("part_range")
        if rep.get("status") != "ok" or part is None or part_range is None:
            raise ValueError(f"part {os.fspath(p)!r}: its report is not a successful --part conversion")
        if part != [k, len(parts)]:
            raise ValueError(
                f"part {os.fspath(p)!r} is part {part[0]}/{part[1]} but was given at position {k} of "
                f"{len(parts)}; give parts 0..n-1 in order"
            )
        if part_range[0] != expected_start or rep.get("source_images") != reports[0].get("source_images"):
            raise ValueError(f"part {os.fspath(p)!r}: its range {part_range} does not continue the previous part")
        expected_start = part_range[1]
    if expected_start != reports[0].get("source_images"):
        raise ValueError(f"the parts cover {expected_start} of {reports[0].get('source_images')} source images")


def merge_parts(parts: Sequence[str | os.PathLike[str]], dst: str | os.PathLike[str]) -> Path:
    """Join the outputs of ``convert(..., part="i/n")`` for i = 0..n-1, given in that order, into directory ``dst``.

    `tbl_format.merge_manifests` links the parts' files into ``dst`` (no
    copy) and refuses parts whose schema or metadata differ (other classes,
    preprocessing or Pillow version). When each part's default report file
    (``PART.report.json``) is present, the parts are also checked to be
    0..n-1 of one source, in order, with no range missing.
    """
    if not parts:
        raise ValueError("merge_parts needs at least one part")
    _check_part_reports(parts)
    return tbl_format.merge_manifests(list(parts), dst)
