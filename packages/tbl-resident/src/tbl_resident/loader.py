"""ResidentImageLoader: the whole uint8 dataset on the device, every batch produced there.

At construction the image column (and the labels) are uploaded once into device
tensors (see :mod:`tbl_resident.upload`), after a check that they fit; the map
is then closed if the loader opened it. From there on the CPU never touches a
pixel: per pass it computes the rank's sample ids and flip draws with
:mod:`tbl_loader.stream.order` (a few bytes per sample) and uploads them; per batch the
device gathers the images (``index_select``), mirrors the flipped ones, crops
and resizes (exact fixed-point rule, :mod:`tbl_resident.resample`) and looks
the bytes up in the normalization table (:mod:`tbl_resident.normalize`).

Order, sharding, resume and epochs are a :class:`tbl_loader.stream.StreamCursor`, and
what is served is a :class:`tbl_loader.image.ImageSpec`, the same two objects
:class:`tbl_loader.ImageLoader` is made of, so a ``state_dict`` saved by one
loader resumes the other on the same dataset.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

import tbl_format
from tbl_loader import IMAGENET_MEAN, IMAGENET_STD, Batch, RandomResizedCrop
from tbl_loader.errors import ImageGeometryError, LoaderClosedError, UnsupportedCombinationError
from tbl_loader.image import VARIABLE_IMAGE_KINDS, ImageColumns, ImageSpec
from tbl_loader.image import variable_source as variable
from tbl_loader.image.gpu_decode import resample_batch
from tbl_loader.stream import (
    BatchPlan,
    EpochOrder,
    Resumable,
    StreamCursor,
    StreamOptions,
    order,
    resolve_rows,
)

from . import device as _device
from .device import DeviceMemoryError, DeviceQueue, resolve_device
from .normalize import OUTPUT_DTYPES, Normalizer
from .order_ahead import OrderAhead
from .resample import AxisTable, crop_resize_u8, crop_taps
from .upload import DEFAULT_CHUNK_BYTES, UploadStats, upload_rows

__all__ = ["ResidentImageLoader", "variable_workspace_bytes", "workspace_bytes"]


def _offsets(columns: Any) -> tuple[np.ndarray, int]:
    """Where each row's (h, w, 3) pixels start in the flat tensor, and its size in bytes."""
    sizes = columns.heights * columns.widths * 3
    ends = np.cumsum(sizes)
    return ends - sizes, int(ends[-1])


def workspace_bytes(batch_size: int, prefetch: int, image_shape: tuple[int, int, int],
                    out_hw: tuple[int, int], dtype: str, crop: bool) -> int:
    """Upper estimate of the device memory the batches in flight use (outputs and temporaries).

    Per sample: the no-crop path holds the gathered bytes, the mirrored copy,
    int32 table indices and the output; the crop path holds the vertical pass's
    uint8 rows, int32 products and sums over the full width, the transposed
    copy, the horizontal pass's equivalents, the indices and the output.
    ``prefetch + 2`` batches may be alive at once (produced ahead, handed out, in use).
    """
    h, w, c = image_shape
    oh, ow = out_hw
    item = torch.empty((), dtype=OUTPUT_DTYPES[dtype]).element_size()
    out_elems = oh * ow * c
    if crop:
        per_sample = oh * w * c * (1 + 4 + 4 + 1 + 1) + ow * oh * c * (1 + 4 + 4 + 1) + out_elems * (4 + item)
    else:
        per_sample = h * w * c * 3 + out_elems * (4 + item)
    return (prefetch + 2) * batch_size * (per_sample + 16)


class _Serving:
    """Everything that lives on the device for one loader, and the per-batch recipe."""

    def __init__(self, *, images: torch.Tensor, labels: torch.Tensor | None, normalizer: Normalizer,
                 queue: DeviceQueue, seed: int, spec: ImageSpec, columns: ImageColumns,
                 rows: np.ndarray | None = None) -> None:
        self.images = images
        self.labels = labels
        self.normalizer = normalizer
        self.queue = queue
        self.seed = seed
        self.crop = crop = spec.random_resized_crop
        self.center_box = columns.center_box
        self.out_hw = out_hw = columns.out_hw
        self.orders = OrderAhead(seed, spec.hflip, rows)
        _, self.height, self.width, _ = images.shape
        self.axes: tuple[AxisTable, AxisTable] | None = None
        if crop is not None:
            self.axes = (AxisTable.build(self.height, out_hw[0]), AxisTable.build(self.width, out_hw[1]))

    def pass_inputs(self, plan_order: EpochOrder) -> tuple[torch.Tensor, np.ndarray | None, torch.Tensor | None]:
        """This rank's sample ids and flip draws for the rest of the epoch, uploaded once per pass."""
        ids_host, flips = self.orders.get(plan_order)
        dev = self.images.device
        ids = torch.from_numpy(ids_host).to(dev)
        flip_dev = None if flips is None or self.crop is not None else torch.from_numpy(flips).to(dev)
        return ids, flips, flip_dev

    def produce(self, plan: BatchPlan, lo: int, ids: torch.Tensor, flips: np.ndarray | None,
                flip_dev: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Images and labels of ``plan`` (positions ``lo:lo + B`` of the pass), enqueued on the device."""
        n = plan.sample_ids.shape[0]
        batch_ids = ids[lo : lo + n]
        if self.crop is not None:
            boxes = order.random_resized_crop_boxes(self.seed, plan.epoch, plan.sample_ids, self.height,
                                                    self.width, self.crop.scale, self.crop.ratio)
            taps = crop_taps(plan.sample_ids, boxes, None if flips is None else flips[lo : lo + n],
                             self.height, self.width, *self.axes, self.images.device)
            pixels = crop_resize_u8(self.images, taps, *self.out_hw)
        else:
            pixels = self.images.index_select(0, batch_ids)
            if self.center_box is not None:
                top, left, h, w = (int(v) for v in self.center_box)
                pixels = pixels[:, top : top + h, left : left + w]
            if flip_dev is not None:
                mask = flip_dev[lo : lo + n].view(n, 1, 1, 1)
                pixels = torch.where(mask, pixels.flip(2), pixels)
        images = self.normalizer(pixels)
        labels = None if self.labels is None else self.labels.index_select(0, batch_ids)
        return images, labels


def variable_workspace_bytes(batch_size: int, prefetch: int, max_hw: tuple[int, int], out_hw: tuple[int, int],
                             dtype: str) -> int:
    """Upper estimate of the device memory the batches in flight use over images of variable size: per
    sample the float64 padded image (largest size), the vertical pass, the output and its indices."""
    (h, w), (oh, ow) = max_hw, out_hw
    item = torch.empty((), dtype=OUTPUT_DTYPES[dtype]).element_size()
    per_sample = 3 * (h * w * 8 + oh * w * 8 * 2 + oh * ow * (8 + 1 + 4 + item))
    return (prefetch + 2) * batch_size * (per_sample + 64)


class _VariableServing:
    """The device side of a dataset of variable-size raw images (tbl convert --max-size): every image's
    pixels in one flat uint8 tensor, at host-known offsets; per batch each sample's box (drawn on its own
    size, `tbl_loader.image.variable_source.sample_boxes`) is cropped and resized by
    `tbl_loader.image.gpu_decode.resample_batch`, the CPU kernel's fixed-point rule in exact float64 sums."""

    def __init__(self, *, images: torch.Tensor, offsets: np.ndarray, labels: torch.Tensor | None,
                 normalizer: Normalizer, queue: DeviceQueue, seed: int, spec: ImageSpec,
                 columns: variable.VariableColumns, rows: np.ndarray | None = None) -> None:
        self.images = images  # uint8 (total bytes,)
        self.offsets = offsets  # int64 (N,): where row k's (h, w, 3) pixels start in images
        self.labels = labels
        self.normalizer = normalizer
        self.queue = queue
        self.seed = seed
        self.spec = spec
        self.columns = columns
        self.orders = OrderAhead(seed, spec.hflip, rows)

    def pass_inputs(self, plan_order: EpochOrder) -> tuple[torch.Tensor, np.ndarray | None, None]:
        ids_host, flips = self.orders.get(plan_order)
        return torch.from_numpy(ids_host).to(self.images.device), flips, None

    def produce(self, plan: BatchPlan, lo: int, ids: torch.Tensor, flips: np.ndarray | None,
                flip_dev: None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Images and labels of ``plan`` (positions ``lo:lo + B`` of the pass), enqueued on the device."""
        rows = plan.sample_ids
        n = rows.shape[0]
        boxes = variable.sample_boxes(self.spec, self.seed, self.columns, plan.epoch, rows)
        heights, widths = self.columns.heights[rows].tolist(), self.columns.widths[rows].tolist()
        views = [self.images[o : o + h * w * 3].view(h, w, 3).permute(2, 0, 1)
                 for o, h, w in zip(self.offsets[rows].tolist(), heights, widths, strict=True)]
        pixels = resample_batch(views, boxes, self.columns.out_hw, flip=None if flips is None else flips[lo : lo + n])
        images = self.normalizer(pixels.permute(0, 2, 3, 1))  # (B, C, H, W) bytes, read as (B, H, W, C)
        labels = None if self.labels is None else self.labels.index_select(0, ids[lo : lo + n])
        return images, labels


class _ResidentIterator:
    """One pass over the rest of an epoch. Produces up to ``prefetch`` batches ahead of the one handed out.

    A pass ends at the epoch's last batch, or early (StopIteration) once the
    loader moved elsewhere (new ``iter``, a jump of the cursor, ``close``: each
    calls :meth:`finish`). Batches produced ahead but never handed out are
    dropped and do not count as consumed.
    """

    def __init__(self, cursor: StreamCursor, serving: _Serving, plan_order: EpochOrder, plans, *,
                 prefetch: int) -> None:
        self._cursor = cursor
        self._serving: _Serving | None = serving
        self._batch_size = cursor.options.batch_size
        self._plans = plans
        self._depth = prefetch + 1
        self._pending: deque = deque()
        serving.queue.wait_for_consumer()
        with serving.queue.producing():
            self._ids, self._flips, self._flip_dev = serving.pass_inputs(plan_order)

    def __iter__(self) -> _ResidentIterator:
        return self

    def _fill(self) -> None:
        serving = self._serving
        while len(self._pending) < self._depth:
            plan = next(self._plans, None)
            if plan is None:
                return
            lo = plan.number * self._batch_size
            with serving.queue.producing():
                images, labels = serving.produce(plan, lo, self._ids, self._flips, self._flip_dev)
                event = serving.queue.produced()
            self._pending.append((plan, images, labels, event))

    def __next__(self) -> Batch:
        if self._serving is None:
            raise StopIteration
        self._fill()
        if not self._pending:
            self.finish()
            raise StopIteration
        plan, images, labels, event = self._pending.popleft()
        self._serving.queue.hand_over(event, [images, labels])
        self._cursor.advance(plan)
        if plan.last:
            self.finish()
        return Batch(images, labels, torch.from_numpy(plan.sample_ids.copy()))

    def finish(self) -> None:
        # Drop every device reference now: a finished or abandoned pass must not keep the
        # resident dataset alive after the loader was closed.
        self._serving = None
        self._ids = self._flips = self._flip_dev = None
        self._pending.clear()
        self._plans = iter(())


class _ActivePass:
    """The one running pass of a loader; ``stop()`` (the cursor's jump listener) ends it."""

    def __init__(self) -> None:
        self.iterator: _ResidentIterator | None = None

    def stop(self) -> None:
        iterator, self.iterator = self.iterator, None
        if iterator is not None:
            iterator.finish()


class ResidentImageLoader(Resumable):
    """Batches ``Batch(images, labels, indices)`` produced on ``device`` from a dataset kept there.

    Arguments as :class:`tbl_loader.ImageLoader` (``path``, ``batch_size``,
    ``shuffle``, ``seed``, ``drop_last``, ``mean``, ``std``, ``hflip``,
    ``random_resized_crop``, ``center_crop``, ``dtype``, ``layout``, ``prefetch``,
    ``rank``, ``world_size``, ``padding``, ``image_key``, ``label_key``, ``rows``,
    ``subsample``) with the same outputs, determinism, resume and sharding, plus:

    ``device``: ``"cuda"`` (or ``"cuda:N"``), ``"mps"`` or ``"cpu"`` (the same
    code on CPU tensors). ``channels_last``: with ``layout="CHW"``, return
    ``(B, C, H, W)`` tensors in ``torch.channels_last`` memory format.
    ``chunk_bytes``: staging buffer size of the upload. ``progress``: upload
    progress bar (None: only for datasets of 1 GiB or more).

    Not taken (they have no meaning here): ``pin_memory``, ``num_threads`` and
    ``backend`` (batches are always torch tensors on ``device``).

    Outputs: images on ``device`` (float32 / float16 / bfloat16 normalized through
    ``tbl_kernels.normalization_table``, or uint8), labels int64 on ``device``
    (None without a label leaf), indices int64 on the host. No-crop and
    center-crop batches are bit-identical to ImageLoader's; random-resized-crop
    batches too (the crop-resize runs the CPU kernel's fixed-point rule in
    integers).

    Batch lifetime: every batch is a set of new tensors; nothing is ever
    overwritten, so a batch stays valid for as long as it is referenced. On CUDA
    batches are produced on a side stream, ``prefetch`` batches ahead; when one
    is handed out, the consumer's current stream waits for its event and the
    tensors are recorded on that stream, so the caching allocator reuses their
    memory only after they are dropped *and* the consumer's queued work on them
    has run. Device memory in flight: about ``prefetch + 2`` batches.

    Threads: one background thread computes the next epoch's sample ids and
    flip draws while an epoch is served (:mod:`tbl_resident.order_ahead`);
    ``close()`` (or collection of the loader) joins it.

    Images of variable size stored raw (``tbl convert --max-size N``) are served
    too, with ``random_resized_crop`` or ``center_crop``: their pixels are kept in
    one flat device tensor and each batch is cropped and resized from each
    image's own size, bit-identical to ImageLoader's. JPEG storage
    (``--store jpeg``) is refused with
    :class:`~tbl_loader.errors.UnsupportedCombinationError`: a resident loader
    keeps decoded pixels, so it would decode every image at construction, i.e.
    hold the raw dataset; convert with ``--store raw`` (or serve the JPEGs with
    ``ImageLoader(..., decode_device="cuda")``).

    Raises :class:`DeviceMemoryError` (bytes needed vs free) when the dataset and
    the batch workspace do not fit on the device.
    """

    def __init__(
        self,
        path: Any,
        batch_size: int,
        *,
        device: Any = "cuda",
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        mean: tuple[float, ...] = IMAGENET_MEAN,
        std: tuple[float, ...] = IMAGENET_STD,
        hflip: float = 0.0,
        random_resized_crop: RandomResizedCrop | None = None,
        center_crop: int | tuple[int, int] | None = None,
        dtype: str = "float32",
        layout: str = "CHW",
        channels_last: bool = False,
        prefetch: int = 2,
        rank: int | None = None,
        world_size: int | None = None,
        padding: str = "wrap",
        image_key: str = "image",
        label_key: str = "label",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        progress: bool | None = None,
        rows: Any = None,
        subsample: float | None = None,
    ) -> None:
        spec = ImageSpec(mean=mean, std=std, hflip=hflip, random_resized_crop=random_resized_crop,
                         center_crop=center_crop, dtype=dtype, layout=layout, image_key=image_key,
                         label_key=label_key)
        if spec.extra_crops:
            raise UnsupportedCombinationError("several random_resized_crop views (multi-crop) are served by tbl_loader.ImageLoader; "
                             "ResidentImageLoader takes one RandomResizedCrop")
        if channels_last and layout != "CHW":
            raise ValueError('channels_last=True applies to layout="CHW" (HWC batches are channels-last already)')
        options = StreamOptions(batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
                                world_size=world_size, padding=padding)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"prefetch must be an int >= 0, got {prefetch!r}")
        dev = resolve_device(device)

        if isinstance(path, (str, os.PathLike)):
            dataset, opened = tbl_format.open(path), True
        else:
            dataset, opened = path, False
        self._serving: _Serving | None = None
        self._active = _ActivePass()
        try:
            leaf = dataset.schema.leaves.get(spec.image_key)
            is_variable = leaf is not None and leaf.kind in VARIABLE_IMAGE_KINDS
            if is_variable:
                if dev.type == "mps":
                    raise UnsupportedCombinationError(
                        "ResidentImageLoader over images of variable size on MPS: their exact resample sums in "
                        "float64, which MPS lacks; serve them with device='cuda' or 'cpu', or with ImageLoader")
                columns = variable.bind_variable(spec, dataset)
                if columns.store != "raw":
                    raise UnsupportedCombinationError(
                        "ResidentImageLoader over JPEG storage (tbl convert --store jpeg): the resident loader keeps "
                        "decoded pixels on the device, so it would decode the whole dataset at construction; "
                        "convert with --store raw, or serve the JPEGs with ImageLoader(..., decode_device='cuda')")
                settings = {**spec.stream_settings(), **variable.stream_settings(columns)}
            else:
                columns = spec.bind(dataset)
                settings = spec.stream_settings()
            normalizer = Normalizer(spec.mean, spec.std, dtype, layout, bool(channels_last), columns.channels, dev)
            subset = resolve_rows(columns.num_samples, rows, subsample)
            self.cursor = StreamCursor(columns.num_samples if subset is None else subset.shape[0], options,
                                       dataset_fingerprint=dataset.fingerprint, settings=settings, rows=subset)
            self.cursor.on_jump(self._active.stop)
            self.spec = spec
            self.prefetch = prefetch
            self.device = dev
            self.channels_last = bool(channels_last)
            self.image_shape = None if is_variable else columns.image_shape  # None: images of variable size
            self.has_labels = columns.labels is not None
            name = str(path) if opened else type(dataset).__name__
            if is_variable:
                offsets, image_bytes = _offsets(columns)
                self._check_fits(name, columns, image_bytes)
                resident, label_tensor, self.upload_stats = self._upload_variable(dataset, columns, image_bytes,
                                                                                  chunk_bytes, progress)
            else:
                self._check_fits(name, columns)
                resident, label_tensor, self.upload_stats = self._upload(columns, chunk_bytes, progress)
        finally:
            if opened:
                dataset.close()  # everything the loader needs is on the device now (or it failed)
        queue = DeviceQueue(dev)
        common = {"labels": label_tensor, "normalizer": normalizer, "queue": queue, "seed": options.seed,
                  "spec": spec, "columns": columns, "rows": self.cursor.rows}
        self._serving = (_VariableServing(images=resident, offsets=offsets, **common) if is_variable
                         else _Serving(images=resident, **common))
        # Joins the order thread when the loader is closed or collected (the callback does not reference self).
        self._orders_finalizer = weakref.finalize(self, self._serving.orders.close)
        queue.synchronize()  # tables and uploads are complete before any side-stream work reads them

    # ---- construction -------------------------------------------------------------------------

    def _check_fits(self, name: str, columns: Any, image_bytes: int | None = None) -> None:
        """DeviceMemoryError unless the images (``image_bytes`` for variable-size ones), the labels and the
        batch workspace fit in the device's free memory."""
        label_bytes = columns.num_samples * 8 if self.has_labels else 0
        if image_bytes is None:
            h, w, c = columns.image_shape
            image_bytes = columns.num_samples * h * w * c
            work = workspace_bytes(self.batch_size, self.prefetch, columns.image_shape, columns.out_hw,
                                   self.spec.dtype, self.spec.random_resized_crop is not None)
        else:
            max_hw = (int(columns.heights.max()), int(columns.widths.max()))
            work = variable_workspace_bytes(self.batch_size, self.prefetch, max_hw, columns.out_hw, self.spec.dtype)
        needed = image_bytes + label_bytes + work
        free = _device.free_bytes(self.device)
        if needed > free:
            raise DeviceMemoryError(
                f"dataset {name} does not fit on {self.device}: needs {needed:,} bytes ({image_bytes:,} images + "
                f"{label_bytes:,} labels + {work:,} batch workspace) but {free:,} bytes are free",
                needed=needed, free=free,
            )

    def _upload(self, columns: ImageColumns, chunk_bytes: int, progress: bool | None):
        h, w, c = columns.image_shape
        labels = columns.labels
        resident = torch.empty((columns.num_samples, h, w, c), dtype=torch.uint8, device=self.device)
        stats: UploadStats = upload_rows(columns.images, resident, chunk_bytes=chunk_bytes, progress=progress,
                                         description=f"upload to {self.device}")
        label_tensor = None
        if labels is not None:
            label_tensor = torch.empty((columns.num_samples,), dtype=torch.int64, device=self.device)
            upload_rows(labels, label_tensor, chunk_bytes=chunk_bytes, progress=False)
        return resident, label_tensor, stats

    def _upload_variable(self, dataset: Any, columns: Any, image_bytes: int, chunk_bytes: int,
                         progress: bool | None):
        """Every row's (h, w, 3) pixels, in row order, into one flat device tensor (each row one segment of
        the chunked upload), and the labels."""
        resident = torch.empty((image_bytes,), dtype=torch.uint8, device=self.device)
        rows = list(range(columns.num_samples))
        pixels = [np.asarray(v).reshape(-1) for v in dataset.values(self.spec.image_key, rows)]
        for k, (v, h, w) in enumerate(zip(pixels, columns.heights.tolist(), columns.widths.tolist(), strict=True)):
            if v.shape[0] != h * w * 3:
                raise ImageGeometryError(f"{dataset.path}: row {k}: stored image of {v.shape[0]} bytes disagrees "
                                         f"with its height/width columns ({h}, {w})")
        stats: UploadStats = upload_rows(pixels, resident, chunk_bytes=chunk_bytes, progress=progress,
                                         description=f"upload to {self.device}")
        label_tensor = None
        if columns.labels is not None:
            label_tensor = torch.from_numpy(columns.labels[0]).to(self.device)
        return resident, label_tensor, stats

    # ---- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> _ResidentIterator:
        if self._serving is None:
            raise LoaderClosedError("this loader was closed")
        self._active.stop()  # only one pass runs at a time
        started = self.cursor.start_pass()
        if started is None:
            return iter(())  # nothing left of this epoch on this rank: the cursor moved to the next one
        self._active.iterator = _ResidentIterator(self.cursor, self._serving, *started, prefetch=self.prefetch)
        return self._active.iterator

    def close(self) -> None:
        """Stop the running pass and release the device tensors."""
        self._active.stop()
        self._serving = None
        finalizer = getattr(self, "_orders_finalizer", None)
        if finalizer is not None:
            finalizer()

    @property
    def closed(self) -> bool:
        return self._serving is None

    @property
    def resident_bytes(self) -> int:
        """Device bytes held by the dataset (images and labels)."""
        s = self._serving
        if s is None:
            return 0
        return s.images.nbytes + (0 if s.labels is None else s.labels.nbytes)
