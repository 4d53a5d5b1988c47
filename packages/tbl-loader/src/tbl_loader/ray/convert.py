"""`tbl convert --engine ray`: image conversion with decode and resize as Ray tasks.

The output has the rows of `tbl_loader.convert` for the same options, in
the same order, with the same schema and metadata; only the shard layout
differs (shards do not span Ray write tasks). Order: the source's
(`tbl_loader.conversion.sources`: TAR and folder sources sorted by relative path, a
list as given), as in the local converter.

How it runs:

1. A Ray actor lists the source with the local converter's code
   (`conversion.open_any_source`: a TAR or folder, WebDataset shards,
   Parquet / Arrow, a `datasets` folder, a CSV / JSONL manifest), so both
   engines agree on names, labels, order, fields, skipped and ignored files;
   it holds the listing open until the job ends (a compressed TAR's
   decompressed copy, or a record source's image bytes, in a hidden temp
   file next to the destination, read by the decode tasks and removed at the
   end). A list of (path, label) pairs or a `datasets.Dataset` object is
   listed on the driver: it is given in memory, and its relative paths are
   the driver's.
2. One Ray dataset row per image (index, where to read it, label), split into
   blocks of ``images_per_task`` images; each block is one Ray task that
   reads its files (by path, TAR members by offset), decodes and resizes
   with the local converter's decoder (`conversion.Decoder`), makes the
   image's extra columns (``keep_path``, ``sidecar``, a record source's
   fields, ``geometry``: `conversion.ExtraColumns`, the local converter's),
   and writes its rows as shards through `TblDatasink`, in the same task
   (Ray Data fuses the stages; pixels never pass through the driver). Names
   stay on the driver, which names bad images: a file name that is not UTF-8
   never has to pass through Arrow.
3. The driver publishes the manifest once every task succeeded. Parts are
   ordered by their first image index, and each task checks that its rows
   are consecutive in that index, so the published order is the source's
   whatever order Ray ran the tasks in (`OrderError` otherwise; nothing is
   published).

With ``max_size`` (``tbl convert --max-size N [--store raw|jpeg]``) a task
prepares each image by the local converter's variable-size recipe
(`conversion.VariableRecipe`) and its rows carry the stored bytes with their
``height`` and ``width``; the rows, schema and metadata are again the local
converter's.

Bad images follow ``on_error`` exactly as locally: with ``"fail"`` the first
bad image in source order is raised as `ImageDecodeError` and nothing is
published; with ``"skip"`` it is left out and listed in the report.
Every worker checks that its Pillow, libjpeg and tbl-loader versions are the
driver's (the ones the metadata records; decoded pixels depend on them):
`DecoderMismatchError` otherwise.

Paths (source, destination, sidecar) must be visible to every node at the same
path; on one machine any local path is. Not supported with this engine: ``part``
(Ray spreads the work itself) and ``overwrite`` (an existing dataset is never
replaced; remove it first).

Signals: a local Ray instance this call starts installs its own SIGTERM
handler (it exits at once, leaving the staging folder); the caller's SIGINT
and SIGTERM handlers are put back after ``ray.init``, so an interrupt
unwinds like any other error: nothing is published, the staging folder is
removed, and the Ray instance is shut down (``tbl convert`` then exits 130 or
143, as with the local engine).
"""

from __future__ import annotations

import math
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.data import DataContext
from ray.data.block import Block, BlockAccessor
from ray.exceptions import RayTaskError

from .. import conversion
from ..conversion import ConvertReport, ImageError
from ..conversion.decode import check_params, check_strict
from ..conversion.sources import DEFAULT_MAX_IMAGE_BYTES, Listing, check_empty_classes
from ..errors import DecoderMismatchError, DestinationError, ImageDecodeError, OrderError
from ..source.storage import is_url
from .sink import TblDatasink

__all__ = ["convert"]

# Images per Ray task: a task must be long enough (~1 s of decoding) for Ray's per-task
# overhead (~10-50 ms) not to matter, and the tasks many enough to keep every CPU busy.
MIN_IMAGES_PER_TASK = 16
MAX_IMAGES_PER_TASK = 512
TASKS_PER_CPU = 4
_VERSION_KEYS = ("converter", "pillow", "libjpeg", "libjpeg_turbo", "decoder")  # decoder: JPEG storage only


def convert(
    src: str | os.PathLike[str] | Sequence[tuple[str | os.PathLike[str], int | str]],
    dst: str | os.PathLike[str],
    size: int | None = None,
    *,
    max_size: int | None = None,
    store: str = "raw",
    quality: int | None = None,
    mode: str = "center_crop",
    on_error: str = "fail",
    shard_rows: int | None = None,
    shards: int | None = None,
    report: str | os.PathLike[str] | bool | None = None,
    progress: bool = False,
    label_file: str | os.PathLike[str] | None = None,
    resample: str = "bilinear",
    draft: bool = True,
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    address: str | None = None,
    images_per_task: int | None = None,
    allow_empty_classes: bool = False,
    keep_path: bool = False,
    sidecar: str | os.PathLike[str] | None = None,
    geometry: dict[str, str] | None = None,
    source_format: str | None = None,
    image_key: str | None = None,
    label_key: str | None = None,
) -> ConvertReport:
    """Convert ``src`` to the dataset folder ``dst`` on Ray; the options mean what they mean for
    `tbl_loader.convert` (``shard_rows`` / ``shards`` shape the shards only): ``size`` (S x S images) or
    ``max_size`` (variable size, stored ``store="raw"`` or ``"jpeg"`` at ``quality``; see
    `tbl_loader.conversion.variable`); ``keep_path``, ``sidecar``, ``geometry``, ``source_format``,
    ``image_key`` and ``label_key`` as there (a record source's fields and a sidecar's become the same columns).

    ``address``: the Ray cluster to connect to (``ray.init(address=...)``) when
    this process is not connected yet; None starts or joins as ``ray.init()``
    does. A cluster this call connected to is disconnected at the end.
    ``progress``: Ray Data's progress bars. ``images_per_task``: images per
    Ray task (default: about four tasks per cluster CPU, 16 to 512 images).
    """
    t0 = time.perf_counter()
    recipe = _recipe(size, max_size, store, quality, mode, resample, draft)
    check_strict()
    if on_error not in conversion.ON_ERROR:
        raise ValueError(f"on_error must be one of {conversion.ON_ERROR}, got {on_error!r}")
    if shard_rows is not None and shards is not None:
        raise ValueError("give at most one of shard_rows and shards")
    for name, value in (("shard_rows", shard_rows), ("shards", shards), ("images_per_task", images_per_task)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if isinstance(max_image_bytes, bool) or not isinstance(max_image_bytes, int) or max_image_bytes < 1:
        raise ValueError(f"max_image_bytes must be a positive int, got {max_image_bytes!r}")
    dst_path = Path(os.path.abspath(dst))
    report_path = None if report is False else Path(f"{dst_path}.report.json") if report in (None, True) \
        else Path(report)  # type: ignore[arg-type]
    inputs = [Path(p) for p in (src, label_file, sidecar) if isinstance(p, (str, os.PathLike)) and not is_url(p)]
    conversion.check_destination(dst_path, sharded=True, overwrite=False, inputs=inputs)
    if report_path is not None:
        conversion.check_report_path(report_path, [*inputs, dst_path])
    try:
        dst_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DestinationError(f"cannot create the folder {dst_path.parent} for {dst_path}: {e.strerror or e}") from e
    listed = {"source_format": source_format, "label_file": label_file, "image_key": image_key,
              "label_key": label_key, "on_error": on_error, "max_bytes": max_image_bytes}
    with _connected(address), _listed(src, listed, dst_path.parent) as listing:
        check_empty_classes(listing, allow_empty_classes)
        extra = conversion.ExtraColumns(
            listing.names, listing.locators, written=list(recipe.schema().tree), keep_path=keep_path,
            sidecar=sidecar, tar_path=listing.tar_path, max_bytes=max_image_bytes, fields=listing.fields,
            geometry=geometry, placement=recipe.stored_geometry)
        n = len(listing)
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        t_scan = time.perf_counter()
        rep = ConvertReport(
            source=os.fspath(src) if isinstance(src, (str, os.PathLike)) else f"<{listing.kind} of {n}>",
            destination=str(dst_path), status="failed", size=size, max_size=max_size,
            store=None if max_size is None else store, mode=mode, resample=resample, draft=draft,
            workers=cpus, part=None, part_range=(0, n), source_images=n, total=n, written=0, failed=0, errors=[],
            ignored_files=len(listing.ignored), classes=len(listing.classes),
            skipped=[ImageError(name, why) for name, why in listing.skipped], max_image_bytes=max_image_bytes,
            empty_classes=list(listing.empty_classes),
        )
        metadata = conversion.dataset_metadata(listing, recipe)
        per_task = images_per_task or min(MAX_IMAGES_PER_TASK,
                                          max(MIN_IMAGES_PER_TASK, math.ceil(n / (TASKS_PER_CPU * cpus))))
        sink = _ImageSink(dst_path, shard_rows=shard_rows or (math.ceil(n / shards) if shards else None),
                          schema=conversion.schema_with_extra(recipe.schema(), extra or None), metadata=metadata,
                          on_error=on_error, names=listing.names, recipe=recipe)
        try:
            _run(listing, sink, per_task, max_image_bytes, recipe, metadata, progress, extra or None)
            rep.written, rep.failed = sink.result["rows"], len(sink.errors)  # type: ignore[index]
            rep.errors = [ImageError(name, message) for _, name, message in sink.errors]
        except BaseException as e:
            rep.error = f"{type(e).__name__}: {e}"
            conversion.finish_report(rep, t0, t_scan, report_path)
            if rep.report_error is not None:
                e.add_note(rep.report_error)
            raise
        finally:
            extra.close()
        rep.status = "ok"
        conversion.finish_report(rep, t0, t_scan, report_path)
    return rep


def _recipe(size: int | None, max_size: int | None, store: str, quality: int | None, mode: str, resample: str,
            draft: bool) -> Any:
    """The local converter's recipe for these options (the same checks, the same errors)."""
    if (size is None) == (max_size is None):
        raise ValueError("give exactly one of size (fixed S x S images) and max_size (variable size, aspect kept)")
    if size is not None:
        check_params(size, mode, resample)
        return conversion.FixedRecipe(size, mode, resample, draft)
    more = {} if quality is None else {"quality": quality}
    return conversion.VariableRecipe(max_size, store, resample=resample, draft=draft, **more)


@contextmanager
def _connected(address: str | None) -> Iterator[None]:
    """Connected to Ray for the block; disconnected after only if this call connected."""
    if ray.is_initialized():
        yield
        return
    handlers = _signal_handlers()
    try:
        ray.init(address=address, log_to_driver=False)
    finally:
        # Ray's SIGTERM handler exits on the spot (the staging folder left, the instance half shut down):
        # the caller's handlers come back, so a signal unwinds through the cleanup below.
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    try:
        yield
    finally:
        ray.shutdown()


def _signal_handlers() -> dict[int, Any]:
    """The Python-level SIGINT / SIGTERM handlers now (none off the main thread, where none can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    return {s: h for s, h in handlers.items() if h is not None}  # None: set outside Python, not restorable


@ray.remote(num_cpus=0)  # idle after listing: it must not hold a CPU the decode tasks need
class _SourceLister:
    """Lists a source on a Ray worker and keeps it open (a compressed TAR's decompressed copy) until `close`."""

    def __init__(self) -> None:
        self._open: Any = None

    def list(self, src: str, listed: dict[str, Any], scratch_dir: str) -> Listing:
        self._open = conversion.open_any_source(src, scratch_dir=scratch_dir, **listed)
        return self._open.__enter__()

    def close(self) -> None:
        if self._open is not None:
            cm, self._open = self._open, None
            cm.__exit__(None, None, None)


@contextmanager
def _listed(src: Any, listed: dict[str, Any], scratch_dir: Path) -> Iterator[Listing]:
    """The source's listing for the block: by a Ray actor for a path or URL, here for what is in memory (a list
    of pairs or of shards, a `datasets.Dataset`)."""
    if not isinstance(src, (str, os.PathLike)):
        with conversion.open_any_source(src, scratch_dir=scratch_dir, **listed) as listing:
            yield listing
        return
    lister = _SourceLister.remote()  # type: ignore[attr-defined]
    try:
        label_file = listed["label_file"]
        listed = {**listed, "label_file": None if label_file is None else os.path.abspath(label_file)}
        where = os.fspath(src) if is_url(src) else os.path.abspath(src)  # the actor's working folder may differ
        try:
            listing = ray.get(lister.list.remote(where, listed, str(scratch_dir)))
        except RayTaskError as e:  # SourceError and the like, raised as themselves
            raise (e.cause if isinstance(e.cause, Exception) else e) from None
        yield listing
    finally:
        try:
            ray.get(lister.close.remote())
        finally:
            ray.kill(lister)


@contextmanager
def _ordered(progress: bool) -> Iterator[None]:
    """Ray Data hands blocks to the write stage in dataset order (and bars on or off) for the block."""
    ctx = DataContext.get_current()
    old = (ctx.execution_options.preserve_order, ctx.enable_progress_bars)
    ctx.execution_options.preserve_order = True
    ctx.enable_progress_bars = progress
    try:
        yield
    finally:
        ctx.execution_options.preserve_order, ctx.enable_progress_bars = old


def _run(listing: Any, sink: _ImageSink, per_task: int, max_bytes: int, recipe: Any, metadata: dict[str, Any],
         progress: bool, extra: Any) -> None:
    n = len(listing)
    items = [  # a path as bytes: a file name that is not UTF-8 is not Arrow text
        {"index": i, "path": os.fsencode(loc) if isinstance(loc, str) else b"",
         "offset": -1 if isinstance(loc, str) else loc[0], "nbytes": -1 if isinstance(loc, str) else loc[1],
         "label": label}
        for i, (loc, label) in enumerate(zip(listing.locators, listing.labels, strict=True))
    ]
    versions = {k: metadata["preprocess"][k] for k in _VERSION_KEYS if k in metadata["preprocess"]}
    with _ordered(progress):
        ds = ray.data.from_items(items, override_num_blocks=max(1, math.ceil(n / per_task)))
        ds = ds.map_batches(
            _decode_batch, batch_size=None, batch_format="numpy",
            fn_kwargs={"tar_path": listing.tar_path, "max_bytes": max_bytes, "recipe": recipe, "versions": versions,
                       "extra": extra},
        )
        try:
            ds.write_datasink(sink)
        except RayTaskError as e:
            sink.staging.discard()
            if sink.decode_error is not None:
                raise sink.decode_error from None
            # an error of ours raised in a task (a sidecar's bad boxes, a decoder mismatch): raised as itself
            raise (e.cause if isinstance(e.cause, Exception) else e) from None
        except BaseException:
            # Ray calls on_write_failed for an Exception only: a Ctrl-C must not leave the staging folder either.
            sink.staging.discard()
            # A bad image (on_error="fail") is found on the driver after every task ran; Ray may wrap
            # what on_write_complete raised: the named error is raised as it is.
            if sink.decode_error is not None:
                raise sink.decode_error from None
            raise


def _decode_batch(batch: dict[str, np.ndarray], *, tar_path: str | None, max_bytes: int, recipe: Any,
                  versions: dict[str, Any], extra: Any) -> dict[str, np.ndarray]:
    """One Ray task's images prepared by ``recipe`` (on a worker); a bad image gets a message instead of pixels.

    Fixed-size images come back as one ``(count, S, S, 3)`` array; variable-size ones as their stored bytes
    (raw pixels or JPEG) with their ``height`` and ``width``. With ``extra`` (`conversion.ExtraColumns`), each
    image's extra values pickled (``"extra"``): Arrow would otherwise guess at nested dicts and arrays."""
    meta = conversion.dataset_metadata(_NO_CLASSES, recipe)["preprocess"]
    here = {k: meta[k] for k in versions if k in meta}
    if here != versions:
        raise DecoderMismatchError(f"this Ray worker decodes with {here}, the driver records {versions}: "
                                   "install the same Pillow, simplejpeg and tbl-loader on every node")
    check_strict()
    count = len(batch["index"])
    fixed = isinstance(recipe, conversion.FixedRecipe)
    if fixed:
        images: np.ndarray = np.zeros((count, recipe.size, recipe.size, 3), np.uint8)
    else:
        images = np.empty(count, dtype=object)
        sizes = np.zeros((count, 2), np.int64)
    errors = np.empty(count, dtype=object)
    extras = np.empty(count, dtype=object)
    decoder = conversion.Decoder(tar_path, max_bytes, recipe)
    try:
        for i in range(count):
            path = os.fsdecode(bytes(batch["path"][i]))
            loc: Any = path if path else (int(batch["offset"][i]), int(batch["nbytes"][i]))
            prepared, err = decoder.one(loc)
            if extra is not None and err is None:
                k = int(batch["index"][i])
                err = extra.refusal(k)  # e.g. a name the path column cannot hold: a bad image, as locally
                extras[i] = b"" if err is not None else pickle.dumps(extra.row(k), pickle.HIGHEST_PROTOCOL)
            else:
                extras[i] = b""
            if fixed and err is None:
                images[i] = np.frombuffer(prepared, np.uint8).reshape(recipe.size, recipe.size, 3)
            elif not fixed:
                h, w, payload = prepared if err is None else (0, 0, b"")
                images[i], sizes[i] = payload, (h, w)
            errors[i] = err or ""
    finally:
        decoder.close()
        if extra is not None:
            extra.close()
    out = {"index": batch["index"], "label": batch["label"], "image": images, "error": errors, "extra": extras}
    if not fixed:
        out.update(height=sizes[:, 0], width=sizes[:, 1])
    return out


class _NoClasses:
    classes: list[str] = []


_NO_CLASSES = _NoClasses()


class _ImageSink(TblDatasink):
    """TblDatasink for decoded images: bad images are left out and reported; parts ordered by image index."""

    def __init__(self, path: Path, *, on_error: str, names: list[str], recipe: Any, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fixed = isinstance(recipe, conversion.FixedRecipe)
        self.recipe = recipe
        self.on_error = on_error
        self.total = len(names)
        self.names: list[str] | None = names  # the driver's: write tasks report indices
        self.errors: list[tuple[int, str, str]] = []  # (index, name, message), in source order
        self.decode_error: ImageDecodeError | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "names": None}  # what a write task gets: the names stay on the driver

    def _new_info(self) -> dict[str, Any]:
        return {"first": None, "last": None, "errors": []}

    def _samples(self, block: Block, info: dict[str, Any]) -> Iterator[Any]:
        batch = BlockAccessor.for_block(block).to_batch_format("numpy")
        index, images, labels = batch["index"], batch["image"], batch["label"]
        for i in range(len(index)):
            k = int(index[i])
            if info["last"] is not None and k != info["last"] + 1:
                raise OrderError(f"a write task received image {k} after image {info['last']}: rows out of "
                                 "source order; nothing was published")
            if info["first"] is None:
                info["first"] = k
            info["last"] = k
            if batch["error"][i]:
                info["errors"].append((k, str(batch["error"][i])))
                continue
            if self.fixed:
                row = {"image": images[i], "label": int(labels[i])}
            else:  # the local converter's row: (height, width, stored bytes)
                prepared = (int(batch["height"][i]), int(batch["width"][i]), bytes(images[i]))
                row = self.recipe.row(prepared, int(labels[i]))
            extra = bytes(batch["extra"][i])
            yield {**row, **pickle.loads(extra)} if extra else row

    def _order_key(self, ret: dict[str, Any]) -> Any:
        return -1 if ret["first"] is None else ret["first"]

    def _check_results(self, returns: list[dict[str, Any]]) -> None:
        expected = 0
        for r in returns:
            if r["first"] is None:
                continue
            if r["first"] != expected:
                raise OrderError(f"{self.path}: write tasks cover images from {r['first']}, expected {expected}; "
                                 "nothing was published")
            expected = r["last"] + 1
        if expected != self.total:
            raise OrderError(f"{self.path}: write tasks cover {expected} of {self.total} images; nothing was published")
        assert self.names is not None  # on the driver
        self.errors = sorted((k, self.names[k], message) for r in returns for k, message in r["errors"])
        if self.errors and self.on_error == "fail":
            _, name, message = self.errors[0]
            self.decode_error = ImageDecodeError(name, message)
            raise self.decode_error
