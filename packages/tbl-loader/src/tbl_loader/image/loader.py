"""ImageLoader: batches of normalized (optionally flipped / cropped) images straight from a mapped dataset.

Serves datasets written by ``tbl convert`` (leaves ``"image"``: uint8 ``(H, W, C)``
and ``"label"``: int64 scalar) and TurboLoader v2 RAW_U8 files, through
``tbl_format.open``. Each batch is one fused kernel call that reads the mapped
image column directly (gather, flip, crop-resize, normalization table, layout)
into a preallocated ring buffer, plus one row-gather call for the labels.
Datasets without a label leaf yield ``labels=None``.

The loader is a :class:`~tbl_loader.stream.cursor.StreamCursor` (order, epochs,
resume, sharding) plus a :class:`~tbl_loader.host.pipeline.HostPipeline` (producer
thread, buffer ring, output) around the batch source below; what it serves is
one :class:`~tbl_loader.image.spec.ImageSpec`.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

import tbl_format

from .._kernels import kernels, per_sample_kernels
from ..errors import UnsupportedCombinationError
from ..host.batch import Batch, host_indices
from ..host.output import HostArray, OutputSpec, allocate_host
from ..host.pipeline import HostLoader, HostPipeline
from ..host.stats import StageStats
from ..host.transforms import TransformStage
from ..source.fetcher import warn_if_shuffle_thrashes
from ..source.local import LocalShards
from ..source.storage import is_url, redact
from ..source.verify import verify_mode
from ..stream import order
from ..stream.cursor import StreamCursor, StreamOptions
from ..stream.keys import sample_keys
from ..stream.order import BatchPlan
from ..stream.subset import resolve_rows
from . import gpu_decode, variable_source
from .fields import FieldReader
from .geometry import check_geometry_leaves, served_geometry, whole_image_boxes
from .spec import IMAGENET_MEAN, IMAGENET_STD, ImageColumns, ImageSpec, RandomResizedCrop, view_seed

__all__ = ["Batch", "ImageLoader"]


# An ImageLoader keeps every shard it reads open: fixed-size images are read through column views of every
# shard (which keep every map alive whatever the dataset's bound), and variable-size rows in random order
# touch most shards in every batch, so a bound below the shard count re-opened (re-parsed) shards batch
# after batch: 2.6x slower on a 300-shard JPEG dataset in the global order.
_EVERY_SHARD = sys.maxsize


def _row_views(segments: list[np.ndarray], rows: np.ndarray) -> list[np.ndarray]:
    """Each of ``rows`` (positions in the segments' concatenation) as a view of its segment: ``(H, W, C)``."""
    starts = np.cumsum([0] + [s.shape[0] for s in segments])
    which = np.searchsorted(starts, rows, side="right") - 1
    return [segments[k][r - starts[k]] for k, r in zip(which.tolist(), rows.tolist(), strict=True)]


def _label_rows(seg: np.ndarray) -> np.ndarray:
    """An int64 label column as the ``(rows, 8)`` uint8 row source the row-gather kernel reads."""
    return seg.view(np.uint8).reshape(seg.shape[0], seg.dtype.itemsize)


class _ImageSource:
    """Fills ring slots for one ImageLoader. Holds the mapped columns, never the loader."""

    def __init__(self, columns: ImageColumns, spec: ImageSpec, seed: int, shards: Any, verify_rows: Any = None,
                 fields: FieldReader | None = None, batch_size: int = 1, stats: StageStats | None = None) -> None:
        # shards: the shard source (tbl_loader.source.local.LocalShards, or a RemoteDataset for a URL): a batch
        # reads the columns it hands for the batch's rows. verify_rows(rows, leaves): its lazy block check
        # (verify="lazy"), else None.
        self.shards = shards
        self.stats = stats if stats is not None else StageStats()  # read time
        self.verify_rows = verify_rows
        self.image_key, self.label_key = spec.image_key, spec.label_key
        self.batch_size = batch_size
        self.verified_leaves = [spec.image_key] + ([] if columns.labels is None else [spec.label_key])
        self.fields = fields  # extra leaves (and a label leaf of another kind than int64), or None
        self.label_field = spec.label_key if columns.label_field else None
        if fields is not None:
            self.verified_leaves += [p for p in fields.paths if p not in self.verified_leaves]
        self.leaves = [self.image_key] + ([] if columns.labels is None else [self.label_key])
        self.has_labels = columns.labels is not None
        self._label_sources: tuple[list[np.ndarray], list[np.ndarray]] | None = None  # see _label_rows_of
        self.seed = seed
        self.hflip = spec.hflip
        self.crop = spec.random_resized_crop
        self.center_box = columns.center_box
        # The evaluation transform (resize + center_crop): one window on every image, resized as torchvision
        # resizes the whole image then crops (resize_crop_images, the same call as for variable-size rows).
        self.center_window = columns.center_window
        self.resize_crop = None if self.center_window is None else per_sample_kernels().resize_crop_images
        self.out_shape = columns.out_shape(spec.layout)
        self.out_hw = columns.out_hw
        self._whole_image = whole_image_boxes(1, columns.height, columns.width)  # the crop box without a crop
        self.geometry = spec.geometry_fields  # fields whose boxes follow the first view (image.geometry)
        self.dtype = spec.dtype
        self.layout = spec.layout
        self.table = kernels.normalization_table(spec.mean, spec.std, spec.dtype) if spec.normalized else None
        self.height, self.width = columns.height, columns.width
        self.num_samples = columns.num_samples
        self._center_boxes: np.ndarray | None = None
        self._flips: tuple[int, np.ndarray] | None = None  # (epoch, flip of every sample id)
        # Multi-crop: views 1.. as (buffer name, crop, view seed, served shape); view 0 is "images" above.
        self.extra_views = [
            (f"images_{v}", crop, view_seed(seed, v),
             (columns.channels, *crop.output_size) if spec.layout == "CHW" else (*crop.output_size, columns.channels))
            for v, crop in enumerate(spec.extra_crops, start=1)
        ]

    def _flip_mask(self, epoch: int, ids: np.ndarray) -> np.ndarray | None:
        """This batch's flips, from a table of the whole epoch's draws (one vectorized pass per epoch
        keeps the per-batch cost at one fancy index)."""
        if self.hflip == 0.0:
            return None
        if self._flips is None or self._flips[0] != epoch:
            all_ids = np.arange(self.num_samples, dtype=np.int64)
            self._flips = (epoch, order.flip_draws(self.seed, epoch, all_ids, self.hflip))
        return self._flips[1][ids]

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]:
        buffers = {"images": allocate_host((capacity, *self.out_shape), self.dtype, output)}
        for name, _, _, shape in self.extra_views:
            buffers[name] = allocate_host((capacity, *shape), self.dtype, output)
        if self.has_labels:
            buffers["labels"] = allocate_host((capacity,), "int64", output, as_rows=True)
        if self.center_box is not None and (self._center_boxes is None or len(self._center_boxes) < capacity):
            self._center_boxes = np.ascontiguousarray(np.broadcast_to(self.center_box, (capacity, 4)))
        if self.fields is not None:
            buffers.update(self.fields.allocate(capacity, output))
        return buffers

    def batch(self, outputs: dict[str, Any], payload: Any, plan: BatchPlan, backend: str,
              torch_device: Any = False) -> Batch:
        """The Batch of one plan from its exported buffers and payload (the fields' variable-size columns).

        ``torch_device``: where variable-size field arrays go (False: numpy output; None: host)."""
        indices = host_indices(plan.sample_ids, backend)
        views = (outputs["images"], *(outputs[name] for name, _, _, _ in self.extra_views))
        labels = outputs.get("labels")
        served, columns = payload
        fields = {}
        if self.fields is not None:
            fields = self.fields.values(outputs, columns, torch_device if backend == "torch" else False)
            if self.label_field is not None:
                labels = fields.pop(self.label_field)
        fields, crop_boxes, flips = served.finish(fields, self.geometry, backend)
        return Batch(views[0], labels, indices, keys=sample_keys(self.seed, plan.epoch, plan.sample_ids),
                     views=views, fields=fields, crop_boxes=crop_boxes, flips=flips)

    def begin_pass(self, epoch_order: Any) -> None:
        self.shards.begin_pass(epoch_order, self.image_key, self.batch_size)

    def close(self) -> None:
        self.shards.end_pass()

    def _label_rows_of(self, columns: list[np.ndarray]) -> list[np.ndarray]:
        """The row sources of a batch's label columns; kept while the shard source hands the same list back
        (a local dataset's, and a warm cache that maps every shard, batch after batch)."""
        if self._label_sources is None or self._label_sources[0] is not columns:
            self._label_sources = (columns, [_label_rows(s) for s in columns])
        return self._label_sources[1]

    def fill(self, buffers: dict[str, np.ndarray], plan: BatchPlan) -> Any:
        """Fills the slot; the payload: (the first view's ServedGeometry, the fields' variable-size columns)."""
        ids = plan.sample_ids  # sample ids: what every draw (flip, crop) depends on
        n = ids.shape[0]
        t0 = self.stats.clock()
        self.shards.before_batch(plan.number)
        if self.verify_rows is not None:
            # Before any byte of these rows is read, and before their columns are taken: a URL's check may
            # replace a cached shard that fails it (RemoteDataset.verify_rows), and the columns are the new map's.
            self.verify_rows(ids.tolist(), self.verified_leaves)
        # Only the columns of this batch's shards are read (a remote source maps them first); rows: the
        # batch's positions in their concatenation.
        found, rows = self.shards.batch_columns(self.leaves, ids)
        self.stats.read_s += self.stats.clock() - t0
        images = found[self.image_key]
        labels = self._label_rows_of(found[self.label_key]) if self.has_labels else None
        out = buffers["images"][:n]
        flip = self._flip_mask(plan.epoch, ids)
        if self.crop is not None:
            boxes = order.random_resized_crop_boxes(
                self.seed, plan.epoch, ids, self.height, self.width, self.crop.scale, self.crop.ratio
            )
            kernels.gather_crop_resize(images, rows, boxes, out, self.table, flip, self.layout)
        elif self.center_box is not None:
            boxes = self._center_boxes[:n]
            kernels.gather_crop_resize(images, rows, boxes, out, self.table, flip, self.layout)
        elif self.center_window is not None:
            boxes = np.broadcast_to(self.center_window, (n, 4))
            self.resize_crop(_row_views(images, rows), np.ascontiguousarray(boxes), out, self.table,
                             None if flip is None else flip.view(np.uint8), self.layout)
        else:
            boxes = self._whole_image
            if self.table is None:
                kernels.gather_u8(images, rows, out, flip, self.layout)
            else:
                kernels.gather_normalize(images, rows, out, self.table, flip, self.layout)
        served = served_geometry(boxes, flip, n, self.out_hw)
        for name, crop, seed, _ in self.extra_views:
            boxes = order.random_resized_crop_boxes(seed, plan.epoch, ids, self.height, self.width, crop.scale,
                                                    crop.ratio)
            flip = order.flip_draws(seed, plan.epoch, ids, self.hflip) if self.hflip else None
            kernels.gather_crop_resize(images, rows, boxes, buffers[name][:n], self.table, flip, self.layout)
        if labels is not None:
            kernels.gather_rows(labels, rows, buffers["labels"][:n])
        return served, None if self.fields is None else self.fields.fill(buffers, ids)


class ImageLoader(HostLoader):
    """Batches ``Batch(images, labels, indices)`` from a converted image dataset.

    ``path``: a ``.tbl`` file, a dataset directory or a TurboLoader v2 file (opened
    with ``tbl_format.open`` and closed with the loader), or an already open
    dataset (left open). Augmentation draws come from :mod:`tbl_loader.stream.order`:
    ``hflip`` is the flip probability; ``random_resized_crop`` (a
    :class:`RandomResizedCrop`) or ``center_crop`` (int or (h, w): the centred box
    of that size, no resize) set the output size, otherwise the stored size.
    ``dtype``: ``"float32"``, ``"float16"``, ``"bfloat16"`` (normalized through
    the mean/std table) or ``"uint8"`` (raw bytes; mean/std unused).
    ``backend``: ``"torch"`` (default when torch is installed) or ``"numpy"``.
    ``device`` (torch only): batches are copied there with ``non_blocking=True``
    from the ring (pinned when ``pin_memory``); indices stay on the host.
    ``pin_memory`` without CUDA is a no-op with a RuntimeWarning. ``num_threads``
    sets the kernels' process-wide thread pool. ``rank`` / ``world_size`` default
    to torch.distributed's when it is initialized. ``padding`` ("wrap" or "drop")
    evens out the ranks' shards. ``verify`` (``"never"``, ``"open"`` or
    ``"lazy"``): when data-block checksums are checked, see :mod:`tbl_loader.source.verify`.
    ``rows`` (dataset rows: an index array or a range) and ``subsample`` (a fraction):
    serve a subset, see :mod:`tbl_loader.stream.subset`; ``num_samples`` is then its size.
    ``transform`` (on the producer thread, on the host batch) and ``device_transform``
    (after the copy to ``device``): see :mod:`tbl_loader.host.transforms`; each batch carries
    per-sample keys (``batch.keys``, :mod:`tbl_loader.stream.keys`) for their randomness.
    ``random_resized_crop`` may be a list of crop specs (multi-crop): ``batch.views``
    holds one image batch per spec, ``batch.images`` the first (on fixed- and variable-size images).
    ``fields`` (leaf paths) serves other leaves of the sample in ``batch.fields`` by the
    pytree loader's rules (``var``: ``"list"`` or ``"pad"``), see :mod:`tbl_loader.image.fields`;
    a label leaf may be an int, a float, a fixed-shape array or optional. ``geometry``
    (``{field path: "xyxy"}``) declares fields of boxes that follow the first view's crop, resize and
    flip; every batch carries ``batch.crop_boxes`` and ``batch.flips`` (:mod:`tbl_loader.image.geometry`).
    ``shuffle``: True (one global permutation per epoch), False, or ``"block"``
    (shards, then samples within blocks of ``block_window`` shards; see
    :func:`tbl_loader.stream.order.block_permutation`). ``path`` may be a URL
    (``s3://bucket/prefix/``, ``gs://``, ``az://``, ``http(s)://``; needs
    ``tbl-loader[remote]``): served through the shard cache (``cache_dir``,
    ``cache_limit``), ``storage_options`` passed to the storage library; see
    :mod:`tbl_loader.source.remote`. Datasets of variable-size images
    (``tbl convert --max-size``) take ``resize`` with ``center_crop`` (the
    evaluation transform) and are served through :mod:`tbl_loader.image.variable_source`;
    ``jpeg_dct`` (``"accurate"``, default, or ``"fast"``: FFCV's faster, less exact
    IDCT) is the IDCT of JPEG storage's serve-time decode, see :mod:`tbl_loader.image.jpeg`;
    ``decode_device="cuda"`` (with ``device="cuda"``) decodes it with nvJPEG, see :mod:`tbl_loader.image.gpu_decode`.
    See :mod:`tbl_loader.stream.cursor` for epochs and resume, :mod:`tbl_loader.host.pipeline` for the producer's lifetime, and
    :mod:`tbl_loader.host.ring` for buffer lifetime: a batch's memory is reused only
    after every view of it has been dropped.
    """

    def __init__(
        self,
        path: Any,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        mean: tuple[float, ...] = IMAGENET_MEAN,
        std: tuple[float, ...] = IMAGENET_STD,
        hflip: float = 0.0,
        random_resized_crop: RandomResizedCrop | None = None,
        center_crop: int | tuple[int, int] | None = None,
        resize: int | None = None,
        dtype: str = "float32",
        layout: str = "CHW",
        device: Any = None,
        pin_memory: bool = False,
        prefetch: int = 2,
        num_threads: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        padding: str = "wrap",
        backend: str | None = None,
        image_key: str = "image",
        label_key: str = "label",
        verify: str | bool = "never",
        rows: Any = None,
        subsample: float | None = None,
        transform: Any = None,
        device_transform: Any = None,
        fields: Any = (),
        var: str = "list",
        cache_dir: Any = None,
        cache_limit: Any = None,
        storage_options: dict[str, Any] | None = None,
        block_window: int = order.DEFAULT_BLOCK_WINDOW,
        jpeg_dct: str = "accurate",
        decode_device: Any = None,
        geometry: dict[str, str] | None = None,
    ) -> None:
        spec = ImageSpec(mean=mean, std=std, hflip=hflip, random_resized_crop=random_resized_crop,
                         center_crop=center_crop, dtype=dtype, layout=layout, image_key=image_key,
                         label_key=label_key, resize=resize, geometry=geometry or {})
        options = StreamOptions(batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
                                world_size=world_size, padding=padding, block_window=block_window)
        if num_threads is not None:
            if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
                raise ValueError(f"num_threads must be an int >= 1 or None, got {num_threads!r}")
        gpu = gpu_decode.resolve(decode_device, device, backend)  # None unless asked; GpuDecodeUnavailableError first
        output = OutputSpec.create(backend, device, pin_memory)
        verify = verify_mode(verify)

        shards, closers, counters = _shard_source(path, verify, cache_dir, cache_limit, storage_options, shuffle)
        stats = StageStats(prefetch=prefetch, cache=counters)
        if is_url(path):
            warn_if_shuffle_thrashes(shuffle, shards.shard_entries, cache_limit, redact(path))
        try:
            bound = bind_source(shards, spec, seed=options.seed, verify=verify, closers=closers, fields=fields,
                                var=var, jpeg_dct=jpeg_dct, gpu=gpu, num_threads=num_threads,
                                batch_size=options.batch_size, stats=stats, counters=counters)
            columns, source = bound.columns, bound.source
            subset = resolve_rows(columns.num_samples, rows, subsample)
            cursor = StreamCursor(columns.num_samples if subset is None else subset.shape[0], options,
                                  dataset_fingerprint=shards.fingerprint, settings=bound.settings, rows=subset,
                                  shard_rows=shards.segment_rows)
            host_batch = functools.partial(source.batch, backend=output.backend, torch_device=None)
            stage = TransformStage(host_batch, output, transform, device_transform)
            pipeline = HostPipeline(source, output, capacity=options.batch_size, prefetch=prefetch, closers=closers,
                                    stage=stage if transform is not None or device_transform is not None else None,
                                    stats=stats)
        except BaseException:
            for close in closers:
                close()
            raise
        self._compose(cursor, pipeline)
        self.fields, self.var = tuple(fields or ()), var
        if num_threads is not None:
            kernels.set_num_threads(num_threads)
        # The dataset read: a tbl_format.Dataset (for a URL's heap reads, one over the shard cache), or the
        # RemoteDataset of a URL's fixed-size images. The loader's path and remote settings, for ImageDataset.
        self.dataset = bound.heaps if bound.variable else shards.dataset
        self.shards = shards
        self.path = path
        self.remote_options = {"cache_dir": cache_dir, "cache_limit": cache_limit, "storage_options": storage_options}
        self.spec = spec
        self.image_shape = getattr(columns, "image_shape", None)  # None: images of variable size
        self.has_labels = columns.labels is not None
        self.verify = verify
        self.jpeg_dct = jpeg_dct
        self.gpu_decode = gpu is not None  # an ImageDataset twin would decode elsewhere: from_loader refuses

    def _make_batch(self, outputs: dict[str, Any], payload: None, plan: BatchPlan) -> Batch:
        # The pipeline's source (never kept on the loader: close() must drop it, and with it the maps).
        return self._pipeline.source.batch(outputs, payload, plan, self.output.backend, self.output.device)


@dataclass(frozen=True)
class BoundImages:
    """What one dataset serves under one ImageSpec: its columns, the stream settings, the batch source."""

    columns: ImageColumns | variable_source.VariableColumns
    settings: dict[str, Any]  # the stream settings the cursor fingerprints
    source: Any  # _ImageSource, VariableImageSource or (GPU decode) GpuJpegSource
    heaps: Any  # the tbl_format.Dataset of heap reads (variable-size images, fields), or None
    variable: bool  # images of variable size (tbl convert --max-size)


def bind_source(shards: Any, spec: ImageSpec, *, seed: int, verify: str, closers: list[Any], fields: Any = (),
                var: str = "list", jpeg_dct: str = "accurate", gpu: Any = None, num_threads: int | None = None,
                batch_size: int = 1, stats: StageStats | None = None, counters: Any = None) -> BoundImages:
    """The batch source of ``shards`` (a shard source) under ``spec``: fixed-size or variable-size (raw or
    JPEG) images, with their fields. The one place both ImageLoader and ImageDataset make it, so that a
    map-style twin fills its batches exactly as the loader does.

    Args:
        shards: the shard source (LocalShards or a RemoteDataset).
        spec: the image contract.
        seed: the stream seed (crop and flip draws).
        verify: "never", "open" or "lazy" (`tbl_loader.source.verify`).
        closers: what closes with the caller; the source's and heap dataset's closers are put first.
        fields: extra leaf paths served in ``batch.fields``; ``var``: their variable-size rule.
        jpeg_dct: the serve-time IDCT of JPEG storage.
        gpu: a `tbl_loader.image.gpu_decode.GpuDecode`, or None to decode on the CPU.
        num_threads: decode threads of JPEG storage (None: the kernels' pool size).
        batch_size: the batches read ahead of a fixed-size source.
        stats: the loader's stage counters the source adds its read and decode time to (None: its own).
        counters: the shard cache's counters of a URL (``loader.stats()["cache"]``), or None.
    """
    variable = variable_source.is_variable(shards, spec.image_key)  # tbl convert --max-size
    heaps = _heap_dataset(shards, verify, closers, counters) if variable else None
    if variable:
        columns = variable_source.bind_variable(spec, heaps)
        variable_source.check_jpeg_dct(jpeg_dct, columns)
        if gpu is not None:
            gpu.check_store(columns, jpeg_dct)
            if spec.extra_crops:
                raise UnsupportedCombinationError(
                    "several crop views (random_resized_crop as a list) with decode_device: the GPU decode "
                    "serves one view; decode on the CPU for several")
        settings = {**spec.stream_settings(), **(variable_source.stream_settings(columns) if gpu is None
                                                 else gpu.stream_settings(columns)),
                    **variable_source.jpeg_dct_settings(jpeg_dct)}
    else:  # binding reads shapes only: a remote source's layout maps no shard for it
        variable_source.check_jpeg_dct(jpeg_dct, None)
        if gpu is not None:
            gpu.check_store(None, jpeg_dct)
        columns = spec.bind(shards.layout(), any_label=True)
        settings = spec.stream_settings()
    field_paths = _field_paths(fields, spec, columns)
    if field_paths and heaps is None:
        heaps = _heap_dataset(shards, verify, closers, counters)
    check_geometry_leaves(spec.geometry_fields, field_paths, heaps)
    reader = FieldReader(heaps, field_paths, var) if field_paths else None
    if variable:
        lazy = heaps.verify_rows if verify == "lazy" else None
        if lazy is not None and heaps is not shards.dataset:  # a URL: heaps streams over its cache
            lazy = shards.evicting(lazy)
        make = variable_source.VariableImageSource if gpu is None else gpu.source
        source = make(heaps, columns, spec, seed, lazy, num_threads, reader, jpeg_dct, stats=stats)
        closers.insert(0, source.close)  # the decode threads stop before the dataset closes
    else:
        lazy = shards.verify_rows if verify == "lazy" else None
        if lazy is not None and heaps is not None and heaps is not shards.dataset:
            # a URL's fields are read through the streaming dataset, which may map a shard's old copy
            lazy = shards.evicting(functools.partial(shards.verify_rows, heal=False))
        source = _ImageSource(columns, spec, seed, shards, lazy, reader, batch_size, stats)
        closers.insert(0, source.close)  # its read-ahead stops before the dataset closes
    return BoundImages(columns, settings, source, heaps, variable)


def _field_paths(fields: Any, spec: ImageSpec, columns: ImageColumns | variable_source.VariableColumns) -> list[str]:
    """The leaves read through the field path: ``fields`` plus a label leaf that is not int64."""
    if isinstance(fields, str):
        raise TypeError(f"fields must be a sequence of leaf paths, not a single string ({fields!r})")
    paths = list(fields or ())
    for reserved in (spec.image_key, spec.label_key):
        if reserved in paths:
            raise ValueError(f"{reserved!r} is served as the batch's {'images' if reserved == spec.image_key else 'labels'}"
                             "; fields are the other leaves")
    return paths + ([spec.label_key] if columns.label_field else [])


def _shard_source(path: Any, verify: str, cache_dir: Any, cache_limit: Any,
                  storage_options: dict[str, Any] | None, shuffle: Any) -> tuple[Any, list[Any], Any]:
    """The shard source of ``path``, what closes it with the loader, and its cache counters (None: local).

    A URL: a RemoteDataset over the shard cache. A path: LocalShards over ``tbl_format.open``.
    An open ``tbl_format.Dataset`` or RemoteDataset of the caller's: used as it is, left open."""
    from ..source.cache import CacheCounters
    from ..source.remote import RemoteDataset

    if is_url(path):  # s3://, gs://, az://, http(s)://: served from the local shard cache
        remote = RemoteDataset(path, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options,
                               verify_data=verify == "open", counters=CacheCounters(),
                               shard_local=shuffle is not True)  # a global shuffle reads every shard at once
        return remote, [remote.close], remote.cache.counters
    if isinstance(path, (str, os.PathLike)):
        shards = LocalShards(tbl_format.open(path, verify=verify == "open", max_open=_EVERY_SHARD))
        return shards, [shards.close], None
    if isinstance(path, RemoteDataset):
        if verify == "open" and not path.verify_data:
            raise ValueError('verify="open" needs the RemoteDataset made with verify_data=True (its shards are '
                             "checked as they are downloaded)")
        return path, [], path.cache.counters
    if not isinstance(path, tbl_format.Dataset):
        raise TypeError(f"path must be a path, a URL, a tbl_format.Dataset or a RemoteDataset, "
                        f"got {type(path).__name__}")
    if verify == "open":
        path.verify()  # the caller's dataset: checked here, once
    return LocalShards(path, owned=False), [], None


def _heap_dataset(shards: Any, verify: str, closers: list[Any], counters: Any = None) -> Any:
    """The tbl_format.Dataset that variable-size rows and fields are read from: a local source's own, or for a
    URL one over the same shard cache whose shards are fetched as reads need them (closed first, in ``closers``)."""
    from ..source.remote import RemoteDataset, open_streaming

    if not isinstance(shards, RemoteDataset):
        return shards.dataset
    heaps = open_streaming(shards.url, **{**shards.options, "verify_data": verify == "open"}, counters=counters)
    closers.insert(0, heaps.close)
    return heaps
