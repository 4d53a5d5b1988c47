"""Serving images of variable size (``tbl convert --max-size``): one crop-resize kernel call per batch.

A dataset written with ``--max-size`` has an ``image`` leaf of variable size
(raw pixels, ``var_array``, or JPEG bytes, ``encoded_image``) and int64
``height`` / ``width`` columns. Per batch, on the producer thread:

1. Boxes from the sizes columns only (no pixel touched):
   ``RandomResizedCrop`` boxes drawn on each sample's own size
   (`tbl_loader.stream.order.random_resized_crop_boxes`, a pure function of
   ``(seed, epoch, sample_id)`` and that size), or a plain centred box; for the
   evaluation transform (``resize`` + ``center_crop``), the fractional windows
   of torchvision's geometry (`tbl_loader.image.spec.resized_center_crop_windows`).
   Flips from `tbl_loader.stream.order.flip_draws`, as for fixed-size images.
2. Sources: raw rows are zero-copy views of the mapped heap (their shapes are
   checked against the sizes columns). JPEG rows, with kernels that decode
   (tbl-kernels 0.3), go to the kernel call of step 3 as they are stored:
   ``decode_crop_resize_jpegs`` / ``decode_resize_crop_jpegs`` decode only what
   each box needs, at its DCT scale, inside the batch pass. With older kernels
   they are decoded whole by ``num_threads`` threads (the producer thread and a
   pool) sharing one counter (`tbl_loader.host.shared_loop`), with the GIL
   released, at the DCT scale the box allows, and the boxes are mapped onto the
   decoded images (`tbl_loader.image.jpeg`, which says how the two relate).
3. One kernel call: crop, resize, flip, normalize and lay out every sample, GIL
   released, parallel over the batch. Boxes go to ``crop_resize_images``
   (crop, then resize the box: torchvision's RandomResizedCrop); windows go to
   ``resize_crop_images`` (resize the whole image, then crop: torchvision's
   ``Resize`` + ``CenterCrop``, computed for the crop only).

Every step is a function of the sample and the stream position only, so the
stream does not depend on batch size, prefetch depth or thread count.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._kernels import jpeg_decode_kernels, kernels, per_sample_kernels
from ..errors import ImageGeometryError, JpegDecodeError
from ..host.batch import Batch, host_indices
from ..host.output import HostArray, OutputSpec, allocate_host
from ..host.shared_loop import shared_loop
from ..host.stats import StageStats
from ..source.fetcher import shards_in_read_order
from ..stream import order
from ..stream.keys import sample_keys
from ..stream.order import BatchPlan
from .fields import FieldReader
from .geometry import served_geometry
from .jpeg import (
    check_dct,
    check_jpeg_header,
    dct_scale,
    decode_jpeg,
    decoder_info,
    scale_boxes,
    serving_decoder_info,
)
from .spec import VARIABLE_IMAGE_KINDS, ImageSpec, fit_windows, resized_center_crop_windows, view_seed

__all__ = ["VariableColumns", "VariableImageSource", "bind_variable", "is_variable", "sample_boxes", "stream_settings"]

SIZE_KEYS = ("height", "width")


def is_variable(dataset: Any, image_key: str) -> bool:
    """True when ``dataset``'s ``image_key`` leaf holds images of variable size (raw or JPEG)."""
    leaf = dataset.schema.leaves.get(image_key)
    return leaf is not None and leaf.kind in VARIABLE_IMAGE_KINDS


@dataclass(frozen=True)
class VariableColumns:
    """A variable-size image dataset as a loader serves it: storage, per-row sizes, labels, output size."""

    store: str  # "raw" or "jpeg"
    heights: np.ndarray  # int64 (N,)
    widths: np.ndarray  # int64 (N,)
    labels: list[np.ndarray] | None
    channels: int
    out_hw: tuple[int, int]

    @property
    def num_samples(self) -> int:
        return int(self.heights.shape[0])

    @property
    def label_field(self) -> bool:
        """Always False: the label of a variable-size dataset is an int64 scalar or absent (bind_variable checks)."""
        return False

    def out_shape(self, layout: str) -> tuple[int, int, int]:
        return (self.channels, *self.out_hw) if layout == "CHW" else (*self.out_hw, self.channels)


def _concat(dataset: Any, key: str) -> np.ndarray:
    """Column ``key`` of every shard as one int64 array, copied shard by shard: no shard's map is held after
    its rows are copied (a dataset streamed from a URL keeps only what its cache holds mapped)."""
    parts = [np.array(dataset.shard(k).column(key), dtype=np.int64) for k in range(len(dataset.segment_rows))]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def bind_variable(spec: ImageSpec, dataset: Any) -> VariableColumns:
    """``dataset``'s variable-size image leaf, sizes and labels checked against ``spec`` (ValueError naming the rule)."""
    leaves = dataset.schema.leaves
    leaf = leaves[spec.image_key]
    if leaf.kind == "var_array":
        if leaf.dtype != "uint8" or leaf.ndim != 3:
            raise ValueError(f"leaf {spec.image_key!r} must hold uint8 (H, W, C) images, got {leaf}")
        store = "raw"
    elif leaf.format == "jpeg":
        store = "jpeg"
    else:
        raise ValueError(f"leaf {spec.image_key!r} holds {leaf.format!r} images; JPEG is the encoded format served")
    for key in SIZE_KEYS:
        if key not in leaves or leaves[key].kind != "int" or leaves[key].optional:
            raise ValueError(f"a variable-size image dataset needs an int {key!r} leaf per row (tbl convert --max-size)")
    if spec.random_resized_crop is not None:
        out_hw = spec.random_resized_crop.output_size
    elif spec.center_crop is not None:
        out_hw = spec.center_crop
    else:
        raise ValueError("images of variable size need random_resized_crop or center_crop (with resize) "
                         "to give every sample of a batch the same size")
    heights, widths = _concat(dataset, "height"), _concat(dataset, "width")
    if heights.size == 0:
        raise ValueError("dataset has no samples")
    if heights.min() < 1 or widths.min() < 1:
        k = int(np.argmax((heights < 1) | (widths < 1)))
        raise ImageGeometryError(f"row {k}: height {int(heights[k])} x width {int(widths[k])} is not an image size")
    channels = 3
    if spec.normalized and (len(spec.mean) != channels or len(spec.std) != channels):
        raise ValueError(f"mean and std need one value per channel ({channels}), got {len(spec.mean)} and "
                         f"{len(spec.std)}")
    if spec.center_crop is not None and spec.resize is None:
        small = (heights < out_hw[0]) | (widths < out_hw[1])
        if small.any():
            k = int(np.argmax(small))
            raise ValueError(f"center_crop {out_hw} does not fit row {k} ({int(heights[k])}x{int(widths[k])}); "
                             "pass resize= to scale the shorter side first")
    labels = None
    if spec.label_key in leaves:
        label_leaf = leaves[spec.label_key]
        if label_leaf.kind != "int" or label_leaf.optional:
            raise ValueError(f"leaf {spec.label_key!r} must be an int64 scalar per row, got {label_leaf}")
        labels = [_concat(dataset, spec.label_key)]  # 8 bytes a row, copied: no map held for the labels
    return VariableColumns(store, heights, widths, labels, channels, out_hw)


def check_jpeg_dct(jpeg_dct: Any, columns: VariableColumns | None) -> str:
    """``jpeg_dct`` checked (`tbl_loader.image.jpeg.check_dct`); ``"fast"`` only where JPEG rows are
    decoded at serve time (``columns``: None for a fixed-size dataset), never silently ignored."""
    check_dct(jpeg_dct)
    if jpeg_dct != "accurate" and (columns is None or columns.store != "jpeg"):
        raise ValueError(f"jpeg_dct={jpeg_dct!r} applies to JPEG storage (tbl convert --store jpeg); "
                         "this dataset stores decoded pixels")
    return jpeg_dct


def jpeg_dct_settings(jpeg_dct: str) -> dict[str, Any]:
    """The stream setting of the serve-time IDCT (`check_jpeg_dct` first): ``{"jpeg_dct": "fast"}``, as it
    changes pixels; nothing for the accurate default, so states saved before the choice existed resume."""
    return {} if jpeg_dct == "accurate" else {"jpeg_dct": jpeg_dct}


def stream_settings(columns: VariableColumns) -> dict[str, Any]:
    """What besides the ImageSpec changes this stream: the serve-time decoder (its version changes pixels).
    (The evaluation transform's rule is in ``ImageSpec.stream_settings``, the same for every storage.)"""
    settings: dict[str, Any] = {"variable": columns.store}
    if columns.store == "jpeg":
        settings["decoder"] = serving_decoder_info()
    return settings


def _evaluation(spec: ImageSpec) -> bool:
    """True for the evaluation transform (shorter side to ``resize``, then ``center_crop``)."""
    return spec.random_resized_crop is None and spec.resize is not None


def sample_boxes(spec: ImageSpec, seed: int, columns: VariableColumns, epoch: int, ids: np.ndarray) -> np.ndarray:
    """Samples ``ids``' boxes on their own sizes (from the columns alone): int32 (n, 4) for
    ``crop_resize_images``, or float64 (n, 4) windows for ``resize_crop_images`` (evaluation transform).

    Args:
        spec: the image contract (its random_resized_crop, or center_crop with or without resize).
        seed: the stream seed the crop boxes are drawn with.
        columns: the dataset's sizes (`bind_variable`).
        epoch: the epoch of the draws.
        ids: dataset rows, int64.
    """
    h, w = columns.heights[ids], columns.widths[ids]
    crop = spec.random_resized_crop
    if crop is not None:
        return order.random_resized_crop_boxes(seed, epoch, ids, h, w, crop.scale, crop.ratio)
    ch, cw = columns.out_hw
    if spec.resize is not None:
        return resized_center_crop_windows(h, w, spec.resize, ch, cw)
    # order.center_crop_box's rule (torchvision's CenterCrop), per sample
    top, left = np.rint((h - ch) / 2.0).astype(np.int64), np.rint((w - cw) / 2.0).astype(np.int64)
    return np.stack([top, left, np.full_like(h, ch), np.full_like(w, cw)], axis=1).astype(np.int32)


class VariableImageSource:
    """Fills ring slots for an ImageLoader over variable-size images. Holds the dataset, never the loader."""

    def __init__(self, dataset: Any, columns: VariableColumns, spec: ImageSpec, seed: int,
                 verify_rows: Any = None, num_threads: int | None = None, fields: FieldReader | None = None,
                 jpeg_dct: str = "accurate", stats: StageStats | None = None) -> None:
        self.stats = stats if stats is not None else StageStats()  # read and decode time, decoded rows
        self.kernels = per_sample_kernels()  # raises, naming the pip command, with kernels lacking the per-sample calls
        # JPEG rows decoded inside the kernel pass where the kernels can (tbl-kernels 0.3), else in a thread pool
        self.fused = jpeg_decode_kernels(self.kernels) if columns.store == "jpeg" else None
        if columns.store == "jpeg":
            self._check_decoder()  # JpegDecoderUnavailableError now, not at the first batch
        self.dataset = dataset
        self.path = str(dataset.path)
        self.columns = columns
        self.image_key = spec.image_key
        self.verify_rows = verify_rows
        self.verified_leaves = [spec.image_key, *SIZE_KEYS] + ([] if columns.labels is None else [spec.label_key])
        self.fields = fields  # extra leaves served in batch.fields (tbl_loader.image.fields), or None
        if fields is not None:
            self.verified_leaves += [p for p in fields.paths if p not in self.verified_leaves]
        self.labels = None if columns.labels is None else [
            seg.view(np.uint8).reshape(seg.shape[0], 8) for seg in columns.labels]
        self.seed = seed
        self.spec = spec
        self.windows = _evaluation(spec)  # boxes() gives float64 windows for resize_crop_images
        self.out_hw = columns.out_hw
        self.out_shape = columns.out_shape(spec.layout)
        self.table = kernels.normalization_table(spec.mean, spec.std, spec.dtype) if spec.normalized else None
        self.num_threads = num_threads
        self.jpeg_dct = check_jpeg_dct(jpeg_dct, columns)  # the IDCT of the serve-time decode (jpeg_decode)
        self._pool: ThreadPoolExecutor | None = None
        # Multi-crop: views 1.. as (buffer name, crop, view seed, served shape); view 0 is "images". Each view
        # is exactly the single view a loader of seed view_seed(seed, v) serves (fixed-size images' rule).
        self.extra_views = [
            (f"images_{v}", crop, view_seed(seed, v),
             (columns.channels, *crop.output_size) if spec.layout == "CHW" else (*crop.output_size, columns.channels))
            for v, crop in enumerate(spec.extra_crops, start=1)
        ]

    def begin_pass(self, epoch_order: Any) -> None:
        """A dataset at a URL downloads the pass's shards ahead of its batches (a no-op for local data)."""
        self.dataset.read_ahead(shards_in_read_order(self.dataset.segment_rows, epoch_order.dataset_rows))

    def _check_decoder(self) -> None:
        if self.fused is None:
            decoder_info()  # the thread-pool decoder (tbl_loader.gpu_decode's source decodes elsewhere)

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]:
        buffers = {"images": allocate_host((capacity, *self.out_shape), self.spec.dtype, output)}
        for name, _, _, shape in self.extra_views:
            buffers[name] = allocate_host((capacity, *shape), self.spec.dtype, output)
        if self.labels is not None:
            buffers["labels"] = allocate_host((capacity,), "int64", output, as_rows=True)
        if self.fields is not None:
            buffers.update(self.fields.allocate(capacity, output))
        return buffers

    def boxes(self, epoch: int, ids: np.ndarray) -> np.ndarray:
        """Samples ``ids``' boxes (`sample_boxes`)."""
        return sample_boxes(self.spec, self.seed, self.columns, epoch, ids)

    def batch(self, outputs: dict[str, Any], payload: Any, plan: BatchPlan, backend: str,
              torch_device: Any = False) -> Batch:
        """The Batch of one plan: images, labels, dataset rows, per-sample keys and the extra fields
        (``payload``: their variable-size columns, from fill)."""
        served, columns = payload
        fields = {}
        if self.fields is not None:
            fields = self.fields.values(outputs, columns, torch_device if backend == "torch" else False)
        fields, crop_boxes, flips = served.finish(fields, self.spec.geometry_fields, backend)
        views = (outputs["images"], *(outputs[name] for name, _, _, _ in self.extra_views))
        return Batch(views[0], outputs.get("labels"), host_indices(plan.sample_ids, backend),
                     keys=sample_keys(self.seed, plan.epoch, plan.sample_ids), views=views, fields=fields,
                     crop_boxes=crop_boxes, flips=flips)

    def _read_rows(self, plan: BatchPlan) -> tuple[np.ndarray, Any, list[Any]]:
        """A batch's boxes, flips (or None) and stored image values, its rows checked first under verify="lazy"."""
        ids = plan.sample_ids
        rows = ids.tolist()
        if self.verify_rows is not None:
            self.verify_rows(rows, self.verified_leaves)  # before any byte of these rows is read
        boxes = self.boxes(plan.epoch, ids)
        flip = order.flip_draws(self.seed, plan.epoch, ids, self.spec.hflip) if self.spec.hflip else None
        t0 = self.stats.clock()
        values = self.dataset.values(self.image_key, rows)  # a URL's shards are fetched here
        self.stats.read_s += self.stats.clock() - t0
        return boxes, flip, values

    def fill(self, buffers: dict[str, np.ndarray], plan: BatchPlan) -> Any:
        """Fills the slot; the payload: (the batch's ServedGeometry, the fields' variable-size columns)."""
        ids = plan.sample_ids
        n = ids.shape[0]
        boxes, flip, values = self._read_rows(plan)
        # JPEG rows decoded at one DCT scale are decoded once for every view that asks for that scale
        decoded: dict[tuple[int, int], np.ndarray] = {}
        kernel = self.kernels.resize_crop_images if self.windows else self.kernels.crop_resize_images
        # Geometry fields follow the first view (its crop box and flip travel with the batch).
        served = self._crop_view(kernel, values, ids, boxes, flip, self.out_hw, buffers["images"][:n], decoded)
        for name, crop, seed, _ in self.extra_views:
            h, w = self.columns.heights[ids], self.columns.widths[ids]
            view_boxes = order.random_resized_crop_boxes(seed, plan.epoch, ids, h, w, crop.scale, crop.ratio)
            view_flip = order.flip_draws(seed, plan.epoch, ids, self.spec.hflip) if self.spec.hflip else None
            self._crop_view(self.kernels.crop_resize_images, values, ids, view_boxes, view_flip, crop.output_size,
                            buffers[name][:n], decoded)
        if self.labels is not None:
            kernels.gather_rows(self.labels, ids, buffers["labels"][:n])
        return served, None if self.fields is None else self.fields.fill(buffers, ids)

    def _crop_view(self, kernel: Any, values: list[Any], ids: np.ndarray, boxes: np.ndarray, flip: Any,
                   out_hw: tuple[int, int], out: np.ndarray, decoded: dict[tuple[int, int], np.ndarray]) -> Any:
        """One view of the batch: its boxes on the stored (raw) or decoded (JPEG) images, into ``out``; returns
        the view's ServedGeometry (the region of stored pixels each sample came from, and its flip)."""
        if self.columns.store == "raw":
            images = self._raw_views(values, ids)
            region = boxes
        elif self.fused is not None:
            t0 = self.stats.clock()
            self._decode_in_kernel(values, ids, boxes, flip, out_hw, out)
            self.stats.decode_s += self.stats.clock() - t0
            self.stats.decoded_rows += ids.shape[0]
            return served_geometry(self._decoded_region(ids, boxes, out_hw), flip, ids.shape[0], out_hw)
        else:
            t0 = self.stats.clock()
            images, boxes = self._decode(values, ids, boxes, out_hw, decoded)
            self.stats.decode_s += self.stats.clock() - t0
            self.stats.decoded_rows += ids.shape[0]
            # The region the decoded pixels came from, in stored pixels (a DCT-scaled decode rounds a box outward
            # to whole decoded pixels).
            decoded_hw = np.array([im.shape[:2] for im in images], dtype=np.float64).reshape(-1, 2)
            full = np.stack([self.columns.heights[ids], self.columns.widths[ids]], axis=1).astype(np.float64)
            region = boxes * np.tile(full / decoded_hw, (1, 2))
        kernel(images, boxes, out, self.table, None if flip is None else flip.view(np.uint8), self.spec.layout)
        return served_geometry(region, flip, ids.shape[0], out_hw)

    def _decode_in_kernel(self, blobs: list[Any], ids: np.ndarray, boxes: np.ndarray, flip: Any,
                          out_hw: tuple[int, int], out: np.ndarray) -> None:
        """One kernel call decodes, crops, resizes, flips and normalizes the rows ``blobs`` into ``out``; a row that
        cannot be served raises what the thread-pool decode raises for it (ImageGeometryError or
        JpegDecodeError, with the same message where its header is at fault)."""
        fused = self.fused
        windows = boxes.dtype == np.float64  # the evaluation transform's windows, else int32 crop boxes
        kernel = fused.decode_resize_crop_jpegs if windows else fused.decode_crop_resize_jpegs
        sizes = np.stack([self.columns.heights[ids], self.columns.widths[ids]], axis=1)
        try:
            kernel(blobs, sizes, boxes, out, self.table, None if flip is None else flip.view(np.uint8),
                   self.spec.layout, dct=self.jpeg_dct)
        except fused.JpegError as e:
            k = e.index
            self._check_headers([blobs[k]], ids[k : k + 1])  # today's message, where the header is at fault
            message = str(e).split(": ", 1)[-1]
            if e.kind == "size":
                raise ImageGeometryError(f"{self.path}: row {int(ids[k])}: {message}") from None
            raise JpegDecodeError(self.path, int(ids[k]), message) from None

    def _decoded_region(self, ids: np.ndarray, boxes: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
        """The region of stored pixels each sample of a fused decode came from: the box (or window) mapped onto
        the image decoded at its DCT scale and back (the kernel's rule, `tbl_loader.image.jpeg`)."""
        h, w = self.columns.heights[ids], self.columns.widths[ids]
        scales = dct_scale(boxes[:, 2], boxes[:, 3], *out_hw)
        decoded = np.stack([-(-h // scales), -(-w // scales)], axis=1)
        full = np.stack([h, w], axis=1)
        if boxes.dtype == np.float64:  # windows (evaluation transform)
            mapped = fit_windows(boxes * np.tile(decoded / full, (1, 2)), decoded)
        else:
            mapped = scale_boxes(boxes, full, decoded)
        return mapped * np.tile(full / decoded, (1, 2))

    def _check_headers(self, blobs: list[Any], ids: np.ndarray) -> None:
        """Each JPEG row's frame header against its height/width columns, before a decoder allocates
        (the CPU decode checks its own in `decode_jpeg`)."""
        h, w = self.columns.heights[ids].tolist(), self.columns.widths[ids].tolist()
        for k, blob in enumerate(blobs):
            try:
                check_jpeg_header(blob, h[k], w[k])
            except ImageGeometryError as e:
                raise ImageGeometryError(f"{self.path}: row {int(ids[k])}: {e}") from None
            except ValueError as e:
                raise JpegDecodeError(self.path, int(ids[k]), str(e)) from None

    def _raw_views(self, views: list[Any], ids: np.ndarray) -> list[np.ndarray]:
        h, w = self.columns.heights[ids], self.columns.widths[ids]
        for k, view in enumerate(views):
            if view.shape != (h[k], w[k], 3) or not view.flags.c_contiguous:
                raise ImageGeometryError(
                    f"{self.path}: row {int(ids[k])}: stored image {view.shape} disagrees with its height/width "
                    f"columns ({int(h[k])}, {int(w[k])})")
        return views

    def _decode(self, blobs: list[Any], ids: np.ndarray, boxes: np.ndarray, out_hw: tuple[int, int],
                decoded: dict[tuple[int, int], np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
        """Rows ``blobs`` decoded at the DCT scale each box allows for ``out_hw``, and the boxes mapped onto
        the decoded images; ``decoded`` ((batch position, scale): image) holds the decodes of earlier views."""
        h, w = self.columns.heights[ids], self.columns.widths[ids]
        scales = dct_scale(boxes[:, 2], boxes[:, 3], *out_hw)
        # Python ints, read once: the per-image step below is the only Python that runs per JPEG
        scale_list, h_list, w_list, rows = scales.tolist(), h.tolist(), w.tolist(), ids.tolist()
        dct = self.jpeg_dct

        def one(k: int) -> np.ndarray:
            done = decoded.get((k, scale_list[k]))
            if done is not None:
                return done
            try:  # the header is checked against the columns first, at every scale (tbl_loader.image.jpeg)
                image = decode_jpeg(blobs[k], scale_list[k], height=h_list[k], width=w_list[k], dct=dct)
            except ImageGeometryError as e:
                raise ImageGeometryError(f"{self.path}: row {rows[k]}: {e}") from None
            except ValueError as e:
                raise JpegDecodeError(self.path, rows[k], str(e)) from None
            decoded[(k, scale_list[k])] = image  # one thread per k: no two threads write one key
            return image

        threads = max(1, self.num_threads or kernels.get_num_threads())
        if self._pool is None and threads > 1:
            self._pool = ThreadPoolExecutor(threads - 1, thread_name_prefix="tbl-jpeg")
        images = shared_loop(self._pool, threads, len(blobs), one)
        decoded = np.array([im.shape[:2] for im in images], dtype=np.int64).reshape(-1, 2)
        if self.windows:  # a window scales with the image: the same part of the photo, in decoded pixels
            ratio = np.tile(decoded / np.stack([h, w], axis=1), (1, 2))  # (rows, cols, rows, cols)
            return images, fit_windows(boxes * ratio, decoded)
        return images, scale_boxes(boxes, np.stack([h, w], axis=1), decoded)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
