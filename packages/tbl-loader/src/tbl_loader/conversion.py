"""Convert images (TAR, folder tree or list) into a .tbl dataset of raw S x S x 3 images and labels.

What is stored
--------------
Each sample is ``{"image": uint8 (S, S, 3), "label": int64}``; the image is
exactly `tbl_loader.decode.reference_preprocess` of the source file (see that
module for the rule). Dataset metadata::

    {"classes": [name of label 0, name of label 1, ...],
     "preprocess": {"size": S, "mode": "center_crop" | "squash",
                    "resample": "bilinear" | "bicubic" | "lanczos", "draft": bool,
                    "alpha_background": [255, 255, 255], "exif_transpose": true,
                    "converter": "tbl-loader <version>", "pillow": <version>,
                    "libjpeg": <libjpeg API version>,
                    "libjpeg_turbo": <libjpeg-turbo version or null>}}

Order
-----
Samples are stored in the source's order (`tbl_loader.sources`: TAR and
folder sources sorted by relative path, a list as given), whatever the number
of workers. ``part=(i, n)`` converts the contiguous range
``[i * N // n, (i + 1) * N // n)`` of that order (N = images in the whole
source; class names always come from the whole source), so parts 0..n-1
merged in index order (`merge_parts`) equal the unsplit conversion.

Parallelism and memory
----------------------
Worker processes (``forkserver`` on Linux, ``spawn`` elsewhere: the parent
may run threads, which fork does not survive) read their own bytes (files by
path, TAR members by offset with ``pread``), decode and resize, and return raw
pixels. The parent keeps at most ``4 * workers`` chunks in flight and writes
results in order, so memory stays bounded whatever the dataset size (about
16 MiB of decoded pixels in flight per worker).
``workers=1`` runs in the calling process with the same code. As with any
``spawn``/``forkserver`` pool, a script calling `convert` with workers > 1
needs the usual ``if __name__ == "__main__":`` guard.

Failures
--------
A file Pillow cannot decode (corrupt, truncated, not an image, empty) is never
stored. ``on_error="fail"`` (default) raises `ImageDecodeError` naming the
first bad file in order and publishes nothing; ``on_error="skip"`` leaves it
out and lists it. The output is published by the writer's temp file + atomic
rename, so an exception or Ctrl-C leaves no dataset at ``dst``. A JSON report
(``dst + ".report.json"`` unless ``report`` says otherwise) records counts,
every failed file with its error, timings and images/s; it is written on
failure too, with ``"status": "failed"``. A worker process that dies (killed,
out of memory) raises `WorkerCrashError`; nothing is published either.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import PIL
from PIL import features

import tbl_format

from .decode import ALPHA_BACKGROUND, PillowConfigError, check_params, check_strict, preprocess_image
from .sources import Listing, Locator, SourceError, TarReader, open_source, read_file
from .version import __version__

__all__ = [
    "ConvertReport",
    "ImageDecodeError",
    "ImageError",
    "SourceError",
    "WorkerCrashError",
    "convert",
    "merge_parts",
    "parse_part",
    "part_range",
]

ON_ERROR = ("fail", "skip")
# Images per task: enough to amortise inter-process overhead, few enough that a
# small dataset still spreads over every worker and a chunk's pixels stay under
# CHUNK_BYTES. With CHUNKS_IN_FLIGHT_PER_WORKER chunks queued or returned per
# worker, decoded pixels in flight stay under about 16 MiB per worker.
MAX_CHUNK = 32
CHUNK_BYTES = 4 << 20
CHUNKS_IN_FLIGHT_PER_WORKER = 4
SUMMARY_ERRORS = 20  # failed files named in the printed summary; the report file lists all


class ImageDecodeError(ValueError):
    """An image of the source could not be decoded (``on_error="fail"``). ``name`` is the file."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"cannot convert image {name!r}: {message}")
        self.name = name
        self.message = message


class WorkerCrashError(RuntimeError):
    """A worker process died (killed, out of memory, crashed in a decoder); nothing is published."""


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
    size: int
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
    timings: dict[str, float] = field(default_factory=dict)  # scan_s, convert_s, total_s
    images_per_s: float = 0.0  # images processed / total_s (end to end)
    error: str | None = None  # why a failed conversion stopped

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
        if self.ignored_files:
            lines.append(f"{self.ignored_files} non-image file(s) ignored")
        return "\n".join(lines)


# ---------------------------------------------------------------- worker side


class _Decoder:
    """Reads and preprocesses samples; one per worker process (or in-process for workers=1)."""

    def __init__(self, tar_path: str | None, size: int, mode: str, resample: str, draft: bool) -> None:
        self.tar = TarReader(tar_path) if tar_path is not None else None
        self.params = (size, mode, resample, draft)

    def one(self, locator: Locator) -> tuple[bytes | None, str | None]:
        try:
            if isinstance(locator, str):
                data = read_file(locator)
            else:
                assert self.tar is not None
                data = self.tar.read(*locator)
            return preprocess_image(data, *self.params).tobytes(), None
        except (PillowConfigError, MemoryError):
            raise
        except Exception as e:  # one bad file must not stop the others; it is reported by name
            return None, f"{type(e).__name__}: {e}"

    def chunk(self, locators: Sequence[Locator]) -> list[tuple[bytes | None, str | None]]:
        return [self.one(loc) for loc in locators]

    def close(self) -> None:
        if self.tar is not None:
            self.tar.close()


_WORKER: _Decoder | None = None


def _init_worker(tar_path: str | None, size: int, mode: str, resample: str, draft: bool) -> None:
    global _WORKER
    # Ctrl-C reaches the whole process group: only the parent acts on it (it aborts the writer and
    # stops the pool); a worker finishes its chunk instead of dying with its own traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER = _Decoder(tar_path, size, mode, resample, draft)


def _worker_chunk(locators: Sequence[Locator]) -> list[tuple[bytes | None, str | None]]:
    assert _WORKER is not None, "worker not initialised"
    return _WORKER.chunk(locators)


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


def _results_in_order(
    listing: Listing,
    names: Sequence[str],
    locators: Sequence[Locator],
    workers: int,
    params: tuple[int, str, str, bool],
) -> Iterator[tuple[bytes | None, str | None]]:
    """Preprocessed images (or error messages) in the order of ``locators``, with a bounded window."""
    if workers == 1:
        decoder = _Decoder(listing.tar_path, *params)
        try:
            for loc in locators:
                yield decoder.one(loc)
        finally:
            decoder.close()
        return
    by_bytes = CHUNK_BYTES // (params[0] * params[0] * 3)
    by_spread = math.ceil(len(locators) / (workers * CHUNKS_IN_FLIGHT_PER_WORKER))
    chunk = max(1, min(MAX_CHUNK, by_bytes, by_spread))
    starts = iter(range(0, len(locators), chunk))
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=_mp_context(), initializer=_init_worker, initargs=(listing.tar_path, *params)
    )
    pending: deque[tuple[int, Future[list[tuple[bytes | None, str | None]]]]] = deque()

    def submit_next() -> None:
        start = next(starts, None)
        if start is not None:
            pending.append((start, pool.submit(_worker_chunk, locators[start : start + chunk])))

    try:
        for _ in range(workers * CHUNKS_IN_FLIGHT_PER_WORKER):
            submit_next()
        while pending:
            start, future = pending.popleft()
            try:
                results = future.result()
            except BrokenProcessPool as e:
                # The pool cannot tell which chunk killed it: name the range that was in flight.
                last_start = pending[-1][0] if pending else start
                last = names[min(last_start + chunk, len(names)) - 1]
                raise WorkerCrashError(
                    f"a worker process died with images {names[start]!r} .. {last!r} in flight (killed, out "
                    f"of memory, or crashed in a decoder; if it died at start-up: a script that calls "
                    f"convert() with workers > 1 needs an `if __name__ == '__main__':` guard and a file, not "
                    f"stdin); nothing was published. workers=1 converts in this process"
                ) from e
            submit_next()
            yield from results
    finally:
        # On an error or an early stop, drop queued chunks instead of decoding them.
        pool.shutdown(wait=True, cancel_futures=True)


def _metadata(listing: Listing, size: int, mode: str, resample: str, draft: bool) -> dict[str, Any]:
    return {
        "classes": list(listing.classes),
        "preprocess": {
            "size": size,
            "mode": mode,
            "resample": resample,
            "draft": draft,
            "alpha_background": list(ALPHA_BACKGROUND),
            "exif_transpose": True,
            "converter": f"tbl-loader {__version__}",
            "pillow": PIL.__version__,
            # JPEG decoding (and DCT-scaled drafts) can differ between libjpeg builds
            "libjpeg": features.version("jpg"),
            "libjpeg_turbo": features.version("libjpeg_turbo"),
        },
    }


def _schema(size: int) -> tbl_format.Schema:
    return tbl_format.Schema({"image": tbl_format.Leaf("image", shape=(size, size, 3)), "label": tbl_format.Leaf("int")})


def _write_report(report: ConvertReport, path: Path) -> None:
    """Atomic write (temp + rename) so a reader never sees half a report."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


def convert(
    src: str | os.PathLike[str] | Sequence[tuple[str | os.PathLike[str], int | str]],
    dst: str | os.PathLike[str],
    size: int,
    *,
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
) -> ConvertReport:
    """Convert ``src`` (TAR, folder tree or list of (path, label)) to a .tbl dataset at ``dst``.

    ``size``: stored side S. ``mode``: "center_crop" or "squash". ``workers``:
    processes (default: all usable cores). ``shard_rows`` / ``shards`` (at most
    one): write a directory of shards of that many rows / about that many
    shards. ``part``: ``"i/n"`` or ``(i, n)``, convert only that contiguous
    part (merge with `merge_parts`). ``report``: path of the JSON report,
    None for ``dst + ".report.json"``, False for none. ``progress``: tqdm bar
    on stderr. ``label_file``: see `tbl_loader.sources`. ``resample`` and
    ``draft``: see `tbl_loader.decode`.
    """
    t0 = time.perf_counter()
    check_params(size, mode, resample)
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
    part_t = parse_part(part)
    dst_path = Path(dst)
    report_path: Path | None
    if report is None or report is True:
        report_path = Path(f"{dst_path}.report.json")
    elif report is False:
        report_path = None
    else:
        report_path = Path(report)
    params = (size, mode, resample, draft)

    dst_path.parent.mkdir(parents=True, exist_ok=True)
    with open_source(src, label_file=label_file, scratch_dir=dst_path.parent) as listing:
        n_all = len(listing)
        start, stop = part_range(n_all, part_t)
        names = listing.names[start:stop]
        labels = listing.labels[start:stop]
        locators = listing.locators[start:stop]
        workers = max(1, min(workers, len(locators)))
        t_scan = time.perf_counter()
        rep = ConvertReport(
            source=os.fspath(src) if isinstance(src, (str, os.PathLike)) else f"<list of {n_all}>",
            destination=str(dst_path),
            status="failed",
            size=size,
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
        )
        if shards is not None:
            shard_rows = max(1, math.ceil(len(names) / shards))
        try:
            _convert_into(listing, names, labels, locators, dst_path, workers, params, on_error, shard_rows, progress, rep)
        except BaseException as e:
            rep.error = f"{type(e).__name__}: {e}"
            _finish(rep, t0, t_scan, report_path)
            raise
        rep.status = "ok"
        _finish(rep, t0, t_scan, report_path)
    return rep


def _finish(rep: ConvertReport, t0: float, t_scan: float, report_path: Path | None) -> None:
    t_end = time.perf_counter()
    rep.timings = {"scan_s": t_scan - t0, "convert_s": t_end - t_scan, "total_s": t_end - t0}
    done = rep.written + rep.failed
    rep.images_per_s = done / rep.timings["total_s"] if rep.timings["total_s"] > 0 else 0.0
    if report_path is not None:
        _write_report(rep, report_path)


def _convert_into(
    listing: Listing,
    names: list[str],
    labels: list[int],
    locators: list[Locator],
    dst: Path,
    workers: int,
    params: tuple[int, str, str, bool],
    on_error: str,
    shard_rows: int | None,
    progress: bool,
    rep: ConvertReport,
) -> None:
    from tqdm import tqdm

    size = params[0]
    shape = (size, size, 3)
    results = _results_in_order(listing, names, locators, workers, params)
    # Exit order on an exception: the pool stops (closing: now, not when the traceback is freed),
    # then the bar, then the writer aborts, removing its temp files; on success it publishes.
    with (
        tbl_format.Writer(dst, _schema(size), metadata=_metadata(listing, *params), shard_rows=shard_rows) as writer,
        tqdm(total=len(names), unit="img", desc="convert", file=sys.stderr, disable=not progress) as bar,
        closing(results),
    ):
        for i, (pixels, err) in enumerate(results):
            if err is not None:
                if on_error == "fail":
                    raise ImageDecodeError(names[i], err)
                rep.errors.append(ImageError(names[i], err))
                rep.failed += 1
                bar.set_postfix(failed=rep.failed, refresh=False)
            else:
                assert pixels is not None
                writer.write({"image": np.frombuffer(pixels, np.uint8).reshape(shape), "label": labels[i]})
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
