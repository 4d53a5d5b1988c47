"""ResidentImageLoader: the whole uint8 dataset on the device, every batch produced there.

At construction the image column (and the labels) are uploaded once into device
tensors (see :mod:`tbl_resident.upload`), after a check that they fit; the map
is then closed if the loader opened it. From there on the CPU never touches a
pixel: per pass it computes the rank's sample ids and flip draws with
:mod:`tbl_loader.order` (a few bytes per sample) and uploads them; per batch the
device gathers the images (``index_select``), mirrors the flipped ones, crops
and resizes (exact fixed-point rule, :mod:`tbl_resident.resample`) and looks
the bytes up in the normalization table (:mod:`tbl_resident.normalize`).

Order, sharding, resume and epochs are :class:`tbl_loader.BatchStream`'s, and
the stream settings are the ones :class:`tbl_loader.ImageLoader` fingerprints,
so a ``state_dict`` saved by one loader resumes the other on the same dataset.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from typing import Any

import numpy as np
import torch

from tbl_loader import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Batch,
    BatchStream,
    RandomResizedCrop,
    image_columns,
    image_stream_settings,
    order,
    output_geometry,
)
from tbl_loader.order import BatchPlan, EpochOrder
from tbl_loader.output import OutputSpec
from tbl_loader.state import dataset_fingerprint

from . import device as _device
from .device import DeviceMemoryError, DeviceQueue, resolve_device
from .normalize import OUTPUT_DTYPES, Normalizer
from .order_ahead import OrderAhead
from .resample import AxisTable, crop_resize_u8, crop_taps
from .upload import DEFAULT_CHUNK_BYTES, UploadStats, upload_rows

__all__ = ["LAYOUTS", "ResidentImageLoader", "workspace_bytes"]

LAYOUTS = ("CHW", "HWC")


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
                 queue: DeviceQueue, seed: int, hflip: float, crop: RandomResizedCrop | None,
                 center_box: np.ndarray | None, out_hw: tuple[int, int]) -> None:
        self.images = images
        self.labels = labels
        self.normalizer = normalizer
        self.queue = queue
        self.seed = seed
        self.hflip = hflip
        self.crop = crop
        self.center_box = center_box
        self.out_hw = out_hw
        self.orders = OrderAhead(seed, hflip)
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


class _ResidentIterator:
    """One pass over the rest of an epoch. Produces up to ``prefetch`` batches ahead of the one handed out.

    A pass ends at the epoch's last batch, or early (StopIteration) once the
    loader moved elsewhere (new ``iter``, ``set_epoch`` to another epoch,
    ``load_state_dict``, ``close``). Batches produced ahead but never handed out
    are dropped and do not count as consumed.
    """

    def __init__(self, loader: ResidentImageLoader, serving: _Serving, plan_order: EpochOrder) -> None:
        self._loader = loader
        self._generation = loader._generation
        self._serving = serving
        self._batch_size = loader.batch_size
        self._plans = plan_order.batches(loader.batch_size, loader.drop_last)
        self._depth = loader.prefetch + 1
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
        loader = self._loader
        if loader is None or loader.closed or loader._generation != self._generation:
            self._finish()
            raise StopIteration
        self._fill()
        if not self._pending:
            self._finish()
            raise StopIteration
        plan, images, labels, event = self._pending.popleft()
        self._serving.queue.hand_over(event, [images, labels])
        loader._advance(plan)
        if plan.last:
            self._finish()
        return Batch(images, labels, torch.from_numpy(plan.sample_ids.copy()))

    def _finish(self) -> None:
        # Drop every device reference now: a finished or abandoned pass must not keep the
        # resident dataset alive after the loader was closed.
        self._loader = None
        self._serving = None
        self._ids = self._flips = self._flip_dev = None
        self._pending.clear()
        self._plans = iter(())


class ResidentImageLoader(BatchStream):
    """Batches ``Batch(images, labels, indices)`` produced on ``device`` from a dataset kept there.

    Arguments as :class:`tbl_loader.ImageLoader` (``path``, ``batch_size``,
    ``shuffle``, ``seed``, ``drop_last``, ``mean``, ``std``, ``hflip``,
    ``random_resized_crop``, ``center_crop``, ``dtype``, ``layout``, ``prefetch``,
    ``rank``, ``world_size``, ``padding``, ``image_key``, ``label_key``) with the
    same outputs, determinism, resume and sharding, plus:

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
    ) -> None:
        if dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(OUTPUT_DTYPES)}, got {dtype!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if channels_last and layout != "CHW":
            raise ValueError('channels_last=True applies to layout="CHW" (HWC batches are channels-last already)')
        hflip = float(hflip)
        if not 0.0 <= hflip <= 1.0:
            raise ValueError(f"hflip is a probability in [0, 1], got {hflip}")
        if random_resized_crop is not None and center_crop is not None:
            raise ValueError("random_resized_crop and center_crop are exclusive: pass one of them")
        if random_resized_crop is not None and not isinstance(random_resized_crop, RandomResizedCrop):
            raise TypeError(f"random_resized_crop must be a RandomResizedCrop, got {type(random_resized_crop).__name__}")
        dev = resolve_device(device)

        if isinstance(path, (str, os.PathLike)):
            import tbl_format

            dataset, opened = tbl_format.open(path), True
        else:
            dataset, opened = path, False
        self._generation = 0
        self._serving: _Serving | None = None
        try:
            images, labels = image_columns(dataset, image_key, label_key)
            _, height, width, channels = images[0].shape
            out_hw, center_box = output_geometry(height, width, random_resized_crop, center_crop)
            normalizer = Normalizer(mean, std, dtype, layout, bool(channels_last), channels, dev)
            num_samples = sum(s.shape[0] for s in images)
            super().__init__(
                num_samples=num_samples,
                batch_size=batch_size,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop_last,
                prefetch=prefetch,
                rank=rank,
                world_size=world_size,
                padding=padding,
                # Batches never pass through the host ring; the spec only satisfies the base class.
                output=OutputSpec.create("torch", None, False),
                dataset_fingerprint=dataset_fingerprint(dataset),
            )
            self.device = dev
            self.dtype = dtype
            self.layout = layout
            self.channels_last = bool(channels_last)
            self.hflip = hflip
            self.random_resized_crop = random_resized_crop
            self.center_crop = None if center_crop is None else out_hw
            self.image_shape = (height, width, channels)
            self.has_labels = labels is not None
            self.image_key, self.label_key = image_key, label_key
            self._check_fits(str(path) if opened else type(dataset).__name__, num_samples, out_hw)
            resident, label_tensor, self.upload_stats = self._upload(images, labels, chunk_bytes, progress)
        finally:
            if opened:
                dataset.close()  # everything the loader needs is on the device now (or it failed)
        queue = DeviceQueue(dev)
        self._serving = _Serving(images=resident, labels=label_tensor, normalizer=normalizer, queue=queue,
                                 seed=self.seed, hflip=hflip, crop=random_resized_crop, center_box=center_box,
                                 out_hw=out_hw)
        # Joins the order thread when the loader is closed or collected (the callback does not reference self).
        self._orders_finalizer = weakref.finalize(self, self._serving.orders.close)
        queue.synchronize()  # tables and uploads are complete before any side-stream work reads them

    # ---- construction -------------------------------------------------------------------------

    def _check_fits(self, name: str, num_samples: int, out_hw: tuple[int, int]) -> None:
        h, w, c = self.image_shape
        image_bytes = num_samples * h * w * c
        label_bytes = num_samples * 8 if self.has_labels else 0
        work = workspace_bytes(self.batch_size, self.prefetch, self.image_shape, out_hw, self.dtype,
                               self.random_resized_crop is not None)
        needed = image_bytes + label_bytes + work
        free = _device.free_bytes(self.device)
        if needed > free:
            raise DeviceMemoryError(
                f"dataset {name} does not fit on {self.device}: needs {needed:,} bytes ({image_bytes:,} images + "
                f"{label_bytes:,} labels + {work:,} batch workspace) but {free:,} bytes are free",
                needed=needed, free=free,
            )

    def _upload(self, images, labels, chunk_bytes, progress):
        h, w, c = self.image_shape
        resident = torch.empty((self.num_samples, h, w, c), dtype=torch.uint8, device=self.device)
        stats: UploadStats = upload_rows(images, resident, chunk_bytes=chunk_bytes, progress=progress,
                                         description=f"upload to {self.device}")
        label_tensor = None
        if labels is not None:
            label_tensor = torch.empty((self.num_samples,), dtype=torch.int64, device=self.device)
            upload_rows(labels, label_tensor, chunk_bytes=chunk_bytes, progress=False)
        return resident, label_tensor, stats

    # ---- stream hooks ---------------------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        # ImageLoader's own stream settings, so the two loaders' state dicts are interchangeable.
        return {**super()._settings(), **image_stream_settings(
            self.hflip, self.random_resized_crop, self.center_crop, self.image_key, self.label_key)}

    def set_epoch(self, epoch: int) -> None:
        before = (self.epoch, self.consumed)
        super().set_epoch(epoch)
        if (self.epoch, self.consumed) != before:
            self._generation += 1  # the running pass belongs to another position

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self._generation += 1

    def __iter__(self) -> _ResidentIterator:
        if self.closed or self._serving is None:
            from tbl_loader import LoaderClosedError

            raise LoaderClosedError("this loader was closed")
        self._generation += 1  # only one pass runs at a time
        plan_order = self.epoch_order()
        if plan_order.num_batches(self.batch_size, self.drop_last) == 0:
            # Nothing left of this epoch on this rank: move to the next one, as ImageLoader does.
            self._advance(BatchPlan(self.epoch, 0, np.empty(0, np.int64), 0, True))
            return iter(())
        return _ResidentIterator(self, self._serving, plan_order)

    def close(self) -> None:
        """Stop the running pass and release the device tensors."""
        self._generation += 1
        self._serving = None
        finalizer = getattr(self, "_orders_finalizer", None)
        if finalizer is not None:
            finalizer()
        super().close()

    @property
    def resident_bytes(self) -> int:
        """Device bytes held by the dataset (images and labels)."""
        s = self._serving
        if s is None:
            return 0
        return s.images.nbytes + (0 if s.labels is None else s.labels.nbytes)
