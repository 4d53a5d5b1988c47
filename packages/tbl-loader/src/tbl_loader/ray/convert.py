"""`tbl convert --engine ray`: image conversion with decode and resize as Ray tasks.

The output has the rows of `tbl_loader.convert` for the same options, in
the same order, with the same schema and metadata; only the shard layout
differs (shards do not span Ray write tasks). Order: the source's
(`tbl_loader.conversion.sources`: TAR and folder sources sorted by relative path, a
list as given), as in the local converter.

How it runs:

1. A Ray actor lists a TAR or folder source with the local converter's code
   (`sources.open_source`), so both engines agree on names, labels, order,
   skipped and ignored files; it holds the listing open until the job ends
   (a compressed TAR is decompressed, by that actor, into a hidden temp file
   next to the destination, read by the decode tasks and removed at the
   end). A list of (path, label) pairs is listed on the driver: it is given
   in memory, and its relative paths are the driver's.
2. One Ray dataset row per image (index, name, where to read it, label),
   split into blocks of ``images_per_task`` images; each block is one Ray
   task that reads its files (by path, TAR members by offset), decodes and
   resizes with the local converter's decoder (`conversion.Decoder`), and
   writes its rows as shards through `TblDatasink`, in the same task (Ray
   Data fuses the stages; pixels never pass through the driver).
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

Paths (source, destination) must be visible to every node at the same path;
on one machine any local path is. Not supported with this engine: ``part``
(Ray spreads the work itself) and ``force`` (an existing dataset is never
replaced; remove it first).
"""

from __future__ import annotations

import math
import os
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
from ..conversion.sources import DEFAULT_MAX_IMAGE_BYTES, Listing, check_empty_classes, open_source
from ..errors import DecoderMismatchError, DestinationError, ImageDecodeError, OrderError
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
) -> ConvertReport:
    """Convert ``src`` to the dataset folder ``dst`` on Ray; the options mean what they mean for
    `tbl_loader.convert` (``shard_rows`` / ``shards`` shape the shards only): ``size`` (S x S images) or
    ``max_size`` (variable size, stored ``store="raw"`` or ``"jpeg"`` at ``quality``; see
    `tbl_loader.conversion.variable`).

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
    inputs = [Path(p) for p in (src, label_file) if isinstance(p, (str, os.PathLike))]
    conversion.check_destination(dst_path, sharded=True, force=False, inputs=inputs)
    if report_path is not None:
        conversion.check_report_path(report_path, [*inputs, dst_path])
    try:
        dst_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DestinationError(f"cannot create the folder {dst_path.parent} for {dst_path}: {e.strerror or e}") from e
    with _connected(address), _listed(src, label_file, dst_path.parent) as listing:
        check_empty_classes(listing, allow_empty_classes)
        n = len(listing)
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        t_scan = time.perf_counter()
        rep = ConvertReport(
            source=os.fspath(src) if isinstance(src, (str, os.PathLike)) else f"<list of {n}>",
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
                          schema=recipe.schema(), metadata=metadata, on_error=on_error, total=n, recipe=recipe)
        try:
            _run(listing, sink, per_task, max_image_bytes, recipe, metadata, progress)
            rep.written, rep.failed = sink.result["rows"], len(sink.errors)  # type: ignore[index]
            rep.errors = [ImageError(name, message) for _, name, message in sink.errors]
        except BaseException as e:
            rep.error = f"{type(e).__name__}: {e}"
            conversion.finish_report(rep, t0, t_scan, report_path)
            if rep.report_error is not None:
                e.add_note(rep.report_error)
            raise
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
    ray.init(address=address, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0)  # idle after listing: it must not hold a CPU the decode tasks need
class _SourceLister:
    """Lists a source on a Ray worker and keeps it open (a compressed TAR's decompressed copy) until `close`."""

    def __init__(self) -> None:
        self._open: Any = None

    def list(self, src: str, label_file: str | None, scratch_dir: str) -> Listing:
        self._open = open_source(src, label_file=label_file, scratch_dir=scratch_dir)
        return self._open.__enter__()

    def close(self) -> None:
        if self._open is not None:
            cm, self._open = self._open, None
            cm.__exit__(None, None, None)


@contextmanager
def _listed(src: Any, label_file: Any, scratch_dir: Path) -> Iterator[Listing]:
    """The source's listing for the block: by a Ray actor for a TAR or folder, here for a list of pairs."""
    if not isinstance(src, (str, os.PathLike)):
        with open_source(src, label_file=label_file, scratch_dir=scratch_dir) as listing:
            yield listing
        return
    lister = _SourceLister.remote()  # type: ignore[attr-defined]
    try:
        label = None if label_file is None else os.path.abspath(label_file)
        try:
            listing = ray.get(lister.list.remote(os.path.abspath(src), label, str(scratch_dir)))
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
         progress: bool) -> None:
    n = len(listing)
    items = [
        {"index": i, "name": name, "path": loc if isinstance(loc, str) else "",
         "offset": -1 if isinstance(loc, str) else loc[0], "nbytes": -1 if isinstance(loc, str) else loc[1],
         "label": label}
        for i, (name, loc, label) in enumerate(zip(listing.names, listing.locators, listing.labels, strict=True))
    ]
    versions = {k: metadata["preprocess"][k] for k in _VERSION_KEYS if k in metadata["preprocess"]}
    with _ordered(progress):
        ds = ray.data.from_items(items, override_num_blocks=max(1, math.ceil(n / per_task)))
        ds = ds.map_batches(
            _decode_batch, batch_size=None, batch_format="numpy",
            fn_kwargs={"tar_path": listing.tar_path, "max_bytes": max_bytes, "recipe": recipe, "versions": versions},
        )
        try:
            ds.write_datasink(sink)
        except BaseException:
            # Ray calls on_write_failed for an Exception only: a Ctrl-C must not leave the staging folder either.
            sink.staging.discard()
            # A bad image (on_error="fail") is found on the driver after every task ran; Ray may wrap
            # what on_write_complete raised: the named error is raised as it is.
            if sink.decode_error is not None:
                raise sink.decode_error from None
            raise


def _decode_batch(batch: dict[str, np.ndarray], *, tar_path: str | None, max_bytes: int, recipe: Any,
                  versions: dict[str, Any]) -> dict[str, np.ndarray]:
    """One Ray task's images prepared by ``recipe`` (on a worker); a bad image gets a message instead of pixels.

    Fixed-size images come back as one ``(count, S, S, 3)`` array; variable-size ones as their stored bytes
    (raw pixels or JPEG) with their ``height`` and ``width``."""
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
    decoder = conversion.Decoder(tar_path, max_bytes, recipe)
    try:
        for i in range(count):
            path = str(batch["path"][i])
            loc: Any = path if path else (int(batch["offset"][i]), int(batch["nbytes"][i]))
            prepared, err = decoder.one(loc)
            if fixed and err is None:
                images[i] = np.frombuffer(prepared, np.uint8).reshape(recipe.size, recipe.size, 3)
            elif not fixed:
                h, w, payload = prepared if err is None else (0, 0, b"")
                images[i], sizes[i] = payload, (h, w)
            errors[i] = err or ""
    finally:
        decoder.close()
    out = {"index": batch["index"], "name": batch["name"], "label": batch["label"], "image": images, "error": errors}
    if not fixed:
        out.update(height=sizes[:, 0], width=sizes[:, 1])
    return out


class _NoClasses:
    classes: list[str] = []


_NO_CLASSES = _NoClasses()


class _ImageSink(TblDatasink):
    """TblDatasink for decoded images: bad images are left out and reported; parts ordered by image index."""

    def __init__(self, path: Path, *, on_error: str, total: int, recipe: Any, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fixed = isinstance(recipe, conversion.FixedRecipe)
        self.recipe = recipe
        self.on_error = on_error
        self.total = total
        self.errors: list[tuple[int, str, str]] = []  # (index, name, message), in source order
        self.decode_error: ImageDecodeError | None = None

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
                info["errors"].append((k, str(batch["name"][i]), str(batch["error"][i])))
                continue
            if self.fixed:
                yield {"image": images[i], "label": int(labels[i])}
            else:  # the local converter's row: (height, width, stored bytes)
                prepared = (int(batch["height"][i]), int(batch["width"][i]), bytes(images[i]))
                yield self.recipe.row(prepared, int(labels[i]))

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
        self.errors = sorted(e for r in returns for e in r["errors"])
        if self.errors and self.on_error == "fail":
            _, name, message = self.errors[0]
            self.decode_error = ImageDecodeError(name, message)
            raise self.decode_error
