"""ImageLoader: batches of normalized (optionally flipped / cropped) images straight from a mapped dataset.

Serves datasets written by ``tbl convert`` (leaves ``"image"``: uint8 ``(H, W, C)``
and ``"label"``: int64 scalar) and TurboLoader v2 RAW_U8 files, through
``tbl_format.open``. Each batch is one fused kernel call that reads the mapped
image column directly (gather, flip, crop-resize, normalization table, layout)
into a preallocated ring buffer, plus one row-gather call for the labels.
Datasets without a label leaf yield ``labels=None``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from . import order
from ._kernels import kernels
from .order import BatchPlan
from .output import OUTPUT_DTYPES, HostArray, OutputSpec, allocate_host
from .state import dataset_fingerprint
from .stream import BatchStream

__all__ = [
    "Batch",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ImageLoader",
    "RandomResizedCrop",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYOUTS = ("CHW", "HWC")


class Batch(NamedTuple):
    """One batch: images ``(B, C, H, W)`` or ``(B, H, W, C)``, labels ``(B,)`` int64 or None, and the
    dataset row of every sample (``indices``, int64 on the host)."""

    images: Any
    labels: Any
    indices: Any


def size_pair(name: str, size: Any) -> tuple[int, int]:
    """``size`` (an int or an (height, width) pair) as a validated ``(height, width)``; ``name`` names it in errors."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        pair = (int(size), int(size))
    else:
        try:
            pair = tuple(int(v) for v in size)
        except TypeError:
            raise ValueError(f"{name} must be an int or a (height, width) pair, got {size!r}") from None
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"{name} must be a positive int or (height, width) pair, got {size!r}")
    return pair


@dataclass(frozen=True)
class RandomResizedCrop:
    """torchvision-style random-resized-crop: output ``size`` (int or (h, w)), area ``scale``, aspect ``ratio``."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)

    @property
    def output_size(self) -> tuple[int, int]:
        return size_pair("RandomResizedCrop.size", self.size)

    def describe(self) -> dict[str, Any]:
        return {"size": list(self.output_size), "scale": [float(v) for v in self.scale],
                "ratio": [float(v) for v in self.ratio]}


def _label_rows(seg: np.ndarray) -> np.ndarray:
    """An int64 label column as the ``(rows, 8)`` uint8 row source the row-gather kernel reads."""
    return seg.view(np.uint8).reshape(seg.shape[0], seg.dtype.itemsize)


class _ImageSource:
    """Fills ring slots for one ImageLoader. Holds the mapped columns, never the loader."""

    def __init__(self, images, labels, *, seed, hflip, crop, center_box, out_shape, dtype, layout, table):
        self.images = images
        self.labels = labels
        self.seed = seed
        self.hflip = hflip
        self.crop = crop  # RandomResizedCrop or None
        self.center_box = center_box  # int32 (4,) or None
        self.out_shape = out_shape
        self.dtype = dtype
        self.layout = layout
        self.table = table
        self.height, self.width = images[0].shape[1:3]
        self.num_samples = sum(s.shape[0] for s in images)
        self._center_boxes: np.ndarray | None = None
        self._flips: tuple[int, np.ndarray] | None = None  # (epoch, flip of every sample id)

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
        if self.labels is not None:
            buffers["labels"] = allocate_host((capacity,), "int64", output, as_rows=True)
        if self.center_box is not None and (self._center_boxes is None or len(self._center_boxes) < capacity):
            self._center_boxes = np.ascontiguousarray(np.broadcast_to(self.center_box, (capacity, 4)))
        return buffers

    def fill(self, buffers: dict[str, np.ndarray], plan: BatchPlan) -> None:
        ids = plan.sample_ids
        n = ids.shape[0]
        out = buffers["images"][:n]
        flip = self._flip_mask(plan.epoch, ids)
        if self.crop is not None:
            boxes = order.random_resized_crop_boxes(
                self.seed, plan.epoch, ids, self.height, self.width, self.crop.scale, self.crop.ratio
            )
            kernels.gather_crop_resize(self.images, ids, boxes, out, self.table, flip, self.layout)
        elif self.center_box is not None:
            kernels.gather_crop_resize(self.images, ids, self._center_boxes[:n], out, self.table, flip, self.layout)
        elif self.table is None:
            kernels.gather_u8(self.images, ids, out, flip, self.layout)
        else:
            kernels.gather_normalize(self.images, ids, out, self.table, flip, self.layout)
        if self.labels is not None:
            kernels.gather_rows(self.labels, ids, buffers["labels"][:n])


def image_columns(dataset: Any, image_key: str = "image", label_key: str = "label") -> tuple[list[np.ndarray], list[np.ndarray] | None]:
    """The validated image column segments (uint8 ``(rows, H, W, C)``, all alike, C-contiguous) and the
    label segments (int64 ``(rows,)``) or None when the dataset has no ``label_key`` leaf.

    Shared by every image loader (this package's and tbl-resident's), so they accept the same datasets."""
    paths = list(getattr(dataset, "leaf_paths", []))
    if image_key not in paths:
        raise ValueError(f"dataset has no {image_key!r} leaf (leaves: {paths})")
    images = [s for s in dataset.segments(image_key) if s.shape[0] > 0]
    if not images:
        raise ValueError("dataset has no samples")
    first = images[0]
    for k, seg in enumerate(images):
        if not isinstance(seg, np.ndarray) or seg.dtype != np.uint8 or seg.ndim != 4:
            raise ValueError(
                f"leaf {image_key!r} segment {k} must be a uint8 (rows, H, W, C) array, got "
                f"{getattr(seg, 'dtype', type(seg).__name__)} {getattr(seg, 'shape', '')}"
            )
        if seg.shape[1:] != first.shape[1:]:
            raise ValueError(f"leaf {image_key!r} segment {k} has images {seg.shape[1:]}, segment 0 {first.shape[1:]}")
        if not seg.flags.c_contiguous:
            raise ValueError(f"leaf {image_key!r} segment {k} is not C-contiguous")
    if first.shape[3] not in (1, 3):
        raise ValueError(f"images must have 1 or 3 channels, got {first.shape[3]}")
    if label_key not in paths:
        return images, None
    raw = [s for s in dataset.segments(label_key) if s.shape[0] > 0]
    if [s.shape[0] for s in raw] != [s.shape[0] for s in images]:
        raise ValueError(f"leaf {label_key!r} rows per shard differ from {image_key!r}")
    labels = []
    for k, seg in enumerate(raw):
        if not isinstance(seg, np.ndarray) or seg.dtype != np.int64 or seg.ndim != 1 or not seg.flags.c_contiguous:
            raise ValueError(
                f"leaf {label_key!r} segment {k} must be a contiguous int64 (rows,) array, got "
                f"{getattr(seg, 'dtype', type(seg).__name__)} {getattr(seg, 'shape', '')}"
            )
        labels.append(seg)
    return images, labels


def output_geometry(height: int, width: int, random_resized_crop: RandomResizedCrop | None,
                    center_crop: int | tuple[int, int] | None) -> tuple[tuple[int, int], np.ndarray | None]:
    """The served ``(height, width)`` and the fixed center-crop box (or None) for stored ``height x width``
    images; a random-resized-crop's scale and ratio are validated here, before any batch is made."""
    if random_resized_crop is not None:
        order.random_resized_crop_boxes(0, 0, np.zeros(1, np.int64), height, width,
                                        random_resized_crop.scale, random_resized_crop.ratio)
        return random_resized_crop.output_size, None
    if center_crop is not None:
        out_hw = size_pair("center_crop", center_crop)
        return out_hw, order.center_crop_box(height, width, *out_hw)
    return (height, width), None


def image_stream_settings(hflip: float, random_resized_crop: RandomResizedCrop | None,
                          center_crop: tuple[int, int] | None, image_key: str, label_key: str) -> dict[str, Any]:
    """The image-specific settings that change the sample stream, as fingerprinted by ``state_dict()``.

    Every image loader fingerprints exactly these, so their state dicts are interchangeable on one dataset.
    """
    crop = None
    if random_resized_crop is not None:
        crop = {"random_resized": random_resized_crop.describe()}
    elif center_crop is not None:
        crop = {"center": list(center_crop)}
    return {"hflip": hflip, "crop": crop, "image_key": image_key, "label_key": label_key}


class ImageLoader(BatchStream):
    """Batches ``Batch(images, labels, indices)`` from a converted image dataset.

    ``path``: a ``.tbl`` file, a dataset directory or a TurboLoader v2 file (opened
    with ``tbl_format.open`` and closed with the loader), or an already open
    dataset (left open). Augmentation draws come from :mod:`tbl_loader.order`:
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
    evens out the ranks' shards. See :class:`tbl_loader.stream.BatchStream` for
    epochs, resume and lifetime, and :mod:`tbl_loader.ring` for buffer lifetime:
    a batch's memory is reused only after every view of it has been dropped.
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
    ) -> None:
        if dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be one of {OUTPUT_DTYPES}, got {dtype!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        hflip = float(hflip)
        if not 0.0 <= hflip <= 1.0:
            raise ValueError(f"hflip is a probability in [0, 1], got {hflip}")
        if random_resized_crop is not None and center_crop is not None:
            raise ValueError("random_resized_crop and center_crop are exclusive: pass one of them")
        if random_resized_crop is not None and not isinstance(random_resized_crop, RandomResizedCrop):
            raise TypeError(f"random_resized_crop must be a RandomResizedCrop, got {type(random_resized_crop).__name__}")
        if num_threads is not None:
            if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
                raise ValueError(f"num_threads must be an int >= 1 or None, got {num_threads!r}")
        output = OutputSpec.create(backend, device, pin_memory)

        if isinstance(path, (str, os.PathLike)):
            import tbl_format

            dataset = tbl_format.open(path)
            closers = [dataset.close]
        else:
            dataset, closers = path, []
        try:
            images, label_segments = image_columns(dataset, image_key, label_key)
            labels = None if label_segments is None else [_label_rows(seg) for seg in label_segments]
            _, height, width, channels = images[0].shape
            out_hw, center_box = output_geometry(height, width, random_resized_crop, center_crop)
            table = None
            if dtype != "uint8":
                if len(mean) != channels or len(std) != channels:
                    raise ValueError(
                        f"mean and std need one value per channel ({channels}), got {len(mean)} and {len(std)}"
                    )
                table = kernels.normalization_table(mean, std, dtype)
            out_shape = (channels, *out_hw) if layout == "CHW" else (*out_hw, channels)
            super().__init__(
                num_samples=sum(s.shape[0] for s in images),
                batch_size=batch_size,
                shuffle=shuffle,
                seed=seed,
                drop_last=drop_last,
                prefetch=prefetch,
                rank=rank,
                world_size=world_size,
                padding=padding,
                output=output,
                dataset_fingerprint=dataset_fingerprint(dataset),
                closers=closers,
            )
        except BaseException:
            for close in closers:
                close()
            raise
        if num_threads is not None:
            kernels.set_num_threads(num_threads)
        self.dataset = dataset
        self.dtype = dtype
        self.layout = layout
        self.hflip = hflip
        self.random_resized_crop = random_resized_crop
        self.center_crop = None if center_crop is None else out_hw
        self.image_shape = (height, width, channels)
        self.has_labels = labels is not None
        self.image_key, self.label_key = image_key, label_key
        self._source_args = dict(
            images=images, labels=labels, seed=self.seed, hflip=hflip, crop=random_resized_crop,
            center_box=center_box, out_shape=out_shape, dtype=dtype, layout=layout, table=table,
        )

    def _batch_source(self) -> _ImageSource:
        if self._source_args is None:
            raise RuntimeError("the loader's columns were released by close()")
        return _ImageSource(**self._source_args)

    def _release_sources(self) -> None:
        super()._release_sources()
        self._source_args = None

    def _settings(self) -> dict[str, Any]:
        return {**super()._settings(), **image_stream_settings(
            self.hflip, self.random_resized_crop, self.center_crop, self.image_key, self.label_key)}

    def _make_batch(self, outputs: dict[str, Any], plan: BatchPlan) -> Batch:
        indices = plan.sample_ids.copy()
        if self.output.backend == "torch":
            import torch

            indices = torch.from_numpy(indices)
        return Batch(outputs["images"], outputs.get("labels"), indices)
