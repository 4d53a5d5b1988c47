"""GPU decode of JPEG storage: nvJPEG through torchvision, then crop, resize, flip and normalize on the device.

``ImageLoader(path, batch_size, device="cuda", decode_device="cuda")`` over a
dataset written with ``tbl convert --max-size N --store jpeg`` serves every
batch without decoding a pixel on the CPU. Per batch, on the producer thread:

1. The same plan as the CPU path (`tbl_loader.image.variable_source`): crop boxes
   (or the evaluation transform's windows) from the height / width columns,
   flips from `tbl_loader.stream.order.flip_draws`; nothing else is drawn.
2. The batch's JPEG rows go to ``torchvision.io.decode_jpeg(list, device=...)``
   in one call (nvJPEG: the hardware decoder where the GPU has one, for
   baseline JPEGs; its CUDA decoder otherwise), giving ``(3, H, W)`` uint8
   images on the device at full scale (no DCT-domain downscaling).
3. The images are padded into one ``(B, 3, Hmax, Wmax)`` float64 tensor and
   resampled with the CPU kernel's fixed-point rule (``tbl_kernels.reference``:
   14-bit integer coefficients, a uint8 rounding after each pass, the vertical
   pass first for crops, the horizontal pass first for the evaluation
   transform) as two batched matrix products whose matrices hold those integer
   coefficients. Every product and partial sum is an integer far below 2**53,
   so float64 sums them exactly in any order: on the same pixels the result is
   the CPU kernel's, bit for bit. Flips reverse the horizontal matrix's rows.
4. The bytes are looked up in the normalization table of
   ``tbl_kernels.normalization_table`` (the CPU kernels' table), so the values
   are those of the CPU normalize of the same pixels.

The work is queued on a side stream of the producer thread; the consumer's
stream waits on an event recorded after it, and the images are recorded as
used on that stream, so batches may be read on any stream.

Decoded pixels differ from the CPU path's: nvJPEG's IDCT and chroma upsampling
are not libjpeg-turbo's, and the CPU path may decode at a reduced DCT scale
(boxes at least twice the output size) where nvJPEG decodes at full scale. The
decoder's identity (``"nvjpeg"``, torchvision's and CUDA's versions) is
therefore a stream setting: a state saved under one decoder is refused under
another (`tbl_loader.errors.StateMismatchError`). ``jpeg_dct="fast"`` does not apply.

Needs torch with CUDA and torchvision (``pip install "tbl-loader[gpu]"``);
:class:`GpuDecodeUnavailableError` names what is missing. Importing this
module needs neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import GpuDecodeUnavailableError, ImageGeometryError, JpegDecodeError
from ..host.batch import Batch, host_indices
from ..host.output import HostArray, OutputSpec, allocate_host
from ..stream.keys import sample_keys
from .geometry import ServedGeometry, served_geometry
from .spec import fit_windows
from .variable_source import VariableColumns, VariableImageSource

__all__ = ["DECODER_NAME", "GpuDecode", "GpuDecodeUnavailableError", "GpuJpegSource", "make_decoder", "resolve",
           "resample_batch"]

DECODER_NAME = "nvjpeg"
INSTALL = 'pip install "tbl-loader[gpu]"'
PRECISION_BITS = 14  # tbl_kernels.reference.PRECISION_BITS: fixed-point bits of the resampling coefficients
_HALF = float(1 << (PRECISION_BITS - 1))
_ONE = float(1 << PRECISION_BITS)


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise GpuDecodeUnavailableError(f"decode_device needs torch with CUDA and torchvision ({e}); {INSTALL}") from e
    return torch


def _torchvision() -> Any:
    try:
        import torchvision
        from torchvision.io import decode_jpeg  # noqa: F401  (checks the image extension too)
    except Exception as e:  # ImportError, or a torchvision built for another torch (its ops fail to register)
        raise GpuDecodeUnavailableError(
            f"decode_device='cuda' decodes with nvJPEG through torchvision, which does not import here "
            f"({type(e).__name__}: {e}); {INSTALL} (torchvision matching the installed torch)") from e
    return torchvision


class NvJpegDecoder:
    """``decode(blobs)``: RGB ``(3, H, W)`` uint8 device tensors of a batch of JPEGs, through torchvision's nvJPEG."""

    def __init__(self, device: Any) -> None:
        torch, tv = _torch(), _torchvision()
        self.device = device
        self._decode = tv.io.decode_jpeg
        self._rgb = tv.io.ImageReadMode.RGB
        self.info = {"name": DECODER_NAME, "torchvision": str(tv.__version__), "cuda": str(torch.version.cuda)}

    def decode(self, blobs: list[Any]) -> list[Any]:
        return list(self._decode(blobs, mode=self._rgb, device=self.device))


def make_decoder(device: Any) -> NvJpegDecoder:
    """The batch decoder for ``device`` (a torch.device): nvJPEG on CUDA; GpuDecodeUnavailableError or
    ValueError naming the rule otherwise."""
    torch = _torch()
    if device.type != "cuda":
        raise ValueError(f"decode_device must be a CUDA device ('cuda' or 'cuda:N'), got {str(device)!r}")
    if not torch.cuda.is_available():
        raise GpuDecodeUnavailableError(f"decode_device={str(device)!r} needs a CUDA device, and torch sees none")
    return NvJpegDecoder(device)


@dataclass(frozen=True)
class GpuDecode:
    """A checked ``decode_device``: where batches are decoded, and the decoder."""

    device: Any  # torch.device, with its index
    decoder: Any  # .decode(blobs) -> list of (3, H, W) uint8 tensors on ``device``; .info: dict

    @property
    def info(self) -> dict[str, str]:
        return dict(self.decoder.info)

    def check_store(self, columns: VariableColumns | None, jpeg_dct: str) -> None:
        """ValueError unless the dataset stores JPEG rows (``columns``: None for fixed-size images)."""
        if columns is None or columns.store != "jpeg":
            raise ValueError("decode_device applies to JPEG storage (tbl convert --max-size N --store jpeg); "
                             "this dataset stores decoded pixels")
        if jpeg_dct != "accurate":
            raise ValueError(f"jpeg_dct={jpeg_dct!r} chooses the CPU decoder's IDCT; decode_device decodes with "
                             "nvJPEG's own")

    def stream_settings(self, columns: VariableColumns) -> dict[str, Any]:
        """`tbl_loader.image.variable_source.stream_settings` with this decoder in place of the CPU one."""
        return {"variable": columns.store, "decoder": self.info}

    def source(self, *args: Any, **kwargs: Any) -> GpuJpegSource:
        """A :class:`GpuJpegSource` (VariableImageSource's arguments) decoding here."""
        return GpuJpegSource(*args, gpu=self, **kwargs)


def _same_device(torch: Any, a: Any, b: Any) -> bool:
    def norm(d: Any) -> Any:
        d = torch.device(d)
        return torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d

    return norm(a) == norm(b)


def resolve(decode_device: Any, device: Any, backend: str | None) -> GpuDecode | None:
    """``decode_device`` checked against the loader's ``device`` and ``backend``: None when not asked for.

    Raises GpuDecodeUnavailableError (no torch, CUDA or torchvision) before any other check, and
    ValueError when batches would not be torch tensors on that device."""
    if decode_device is None:
        return None
    torch = _torch()
    dev = torch.device(decode_device)
    decoder = make_decoder(dev)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if backend == "numpy":
        raise ValueError('decode_device needs backend="torch": the images are decoded into device tensors')
    if device is None or not _same_device(torch, device, dev):
        raise ValueError(f"decode_device={str(decode_device)!r} serves batches on that device: pass "
                         f"device={str(decode_device)!r} as well (got device={device!r})")
    return GpuDecode(dev, decoder)


# ---- resampling on the device ------------------------------------------------------------------------------


def _axis_weights(torch: Any, in_size: Any, box0: Any, box_size: Any, out: int, window: int) -> tuple[Any, Any]:
    """``tbl_kernels.reference.resample_weights`` for a batch of axes: ``in_size``, ``box0``, ``box_size``
    float64 tensors ``(B,)``; returns ``xmin`` int64 ``(B, out)`` and the coefficients float64
    ``(B, out, window)``; ``window`` (from the host: no device sync) is at least every sample's
    ``2 * ceil(support) + 1``, taps past a sample's own add 0. The float64 operations are the reference's, one per kernel (no contraction),
    summed over taps in the same order, so the coefficients are the reference's exactly."""
    scale = box_size / float(out)
    filterscale = torch.clamp(scale, min=1.0)
    support = filterscale * 1.0
    ss = 1.0 / filterscale
    o = torch.arange(out, dtype=torch.float64, device=scale.device)
    center = box0[:, None] + (o + 0.5)[None, :] * scale[:, None]
    xmin = torch.clamp(torch.floor(center - support[:, None] + 0.5), min=0.0)
    xmax = torch.minimum(torch.floor(center + support[:, None] + 0.5), in_size[:, None])
    count = xmax - xmin
    weights = []
    total = torch.zeros_like(center)
    for x in range(window):  # sequential sum over taps, as in the reference and the kernel
        t = torch.abs(((xmin + float(x)) - center + 0.5) * ss[:, None])
        w = torch.where((count > float(x)) & (t < 1.0), 1.0 - t, 0.0)
        weights.append(w)
        total = total + w
    nonzero = total != 0.0
    denom = torch.where(nonzero, total, 1.0)
    coef = torch.stack([torch.where(nonzero, w / denom, w) for w in weights], dim=2)
    coef = torch.floor(coef * _ONE + 0.5)
    return xmin.to(torch.int64), coef


def _matrix(torch: Any, xmin: Any, coef: Any, base: Any, length: int) -> Any:
    """Dense float64 ``(B, out, length)`` resampling matrices: row ``o`` of sample ``b`` holds ``coef[b, o]`` from
    column ``base[b] + xmin[b, o]`` on (taps past a box's support have coefficient 0)."""
    b, out, window = coef.shape
    cols = base[:, None, None] + xmin[:, :, None] + torch.arange(window, device=coef.device)
    m = torch.zeros((b, out, length + window), dtype=torch.float64, device=coef.device)
    m.scatter_(2, cols, coef)
    return m[:, :, :length]


def _round(acc: Any) -> Any:
    """``clamp((acc + 2**13) >> 14, 0, 255)`` of exact integer float64 sums, in place."""
    return acc.add_(_HALF).div_(_ONE).floor_().clamp_(0.0, 255.0)


def resample_batch(images: list[Any], boxes: np.ndarray, out_hw: tuple[int, int], *, windows: bool = False,
                   flip: np.ndarray | None = None) -> Any:
    """Resized uint8 pixels ``(B, 3, out_h, out_w)`` of ``(3, H, W)`` uint8 ``images`` (one device), by the
    CPU kernels' rule: ``boxes`` int ``(B, 4)`` (top, left, height, width) are cropped, then resized
    (``crop_resize_images``); with ``windows=True`` float64 windows of the whole image are resized
    onto the output (``resize_crop_images``). ``flip`` (bool ``(B,)``) mirrors the result."""
    import torch

    dev = images[0].device
    n = len(images)
    hw = torch.tensor([im.shape[1:] for im in images], dtype=torch.float64)
    hmax, wmax = (int(v) for v in hw.max(dim=0).values)
    padded = torch.zeros((n, 3, hmax, wmax), dtype=torch.float64, device=dev)
    for k, im in enumerate(images):
        padded[k, :, : im.shape[1], : im.shape[2]].copy_(im)
    # Small pageable uploads, non-blocking: a blocking one would wait for the work queued before it.
    bx = torch.from_numpy(np.asarray(boxes, dtype=np.float64)).to(dev, non_blocking=True)
    hw = hw.to(dev, non_blocking=True)
    out_h, out_w = out_hw
    zero = torch.zeros(n, dtype=torch.int64, device=dev)
    sizes = np.asarray(boxes, dtype=np.float64)[:, 2:]
    wv, wh = (int(math.ceil(max(float(sizes[:, a].max()) / o, 1.0))) * 2 + 1 for a, o in ((0, out_h), (1, out_w)))
    if windows:  # taps over the whole image, from the window's fractional start
        vx, vc = _axis_weights(torch, hw[:, 0], bx[:, 0], bx[:, 2], out_h, wv)
        hx, hc = _axis_weights(torch, hw[:, 1], bx[:, 1], bx[:, 3], out_w, wh)
        mv, mh = _matrix(torch, vx, vc, zero, hmax), _matrix(torch, hx, hc, zero, wmax)
    else:  # taps within the box, placed at its offset
        z = torch.zeros(n, dtype=torch.float64, device=dev)
        vx, vc = _axis_weights(torch, bx[:, 2], z, bx[:, 2], out_h, wv)
        hx, hc = _axis_weights(torch, bx[:, 3], z, bx[:, 3], out_w, wh)
        mv = _matrix(torch, vx, vc, bx[:, 0].to(torch.int64), hmax)
        mh = _matrix(torch, hx, hc, bx[:, 1].to(torch.int64), wmax)
    if flip is not None and bool(np.any(flip)):
        mirror = torch.from_numpy(np.asarray(flip, dtype=bool)).to(dev, non_blocking=True)
        mh = torch.where(mirror[:, None, None], mh.flip(1), mh)
    mh_t = mh.transpose(1, 2)[:, None]  # (B, 1, W, out_w)
    if windows:  # horizontal pass first (Pillow's order), then vertical
        rows = _round(torch.matmul(padded, mh_t))  # (B, 3, H, out_w)
        pixels = _round(torch.matmul(mv[:, None], rows))
    else:  # vertical pass first, then horizontal
        cols = _round(torch.matmul(mv[:, None], padded))  # (B, 3, out_h, W)
        pixels = _round(torch.matmul(cols, mh_t))
    return pixels.to(torch.uint8)


class _Lookup:
    """uint8 ``(B, C, H, W)`` to the output dtype and layout through the CPU kernels' normalization table."""

    def __init__(self, table: np.ndarray | None, dtype: str, layout: str, device: Any) -> None:
        import torch

        self.layout = layout
        self.table = None
        if table is not None:
            flat = np.ascontiguousarray(table).reshape(-1)
            t = torch.from_numpy(flat.view(np.int16) if dtype == "bfloat16" else flat)
            self.table = (t.view(torch.bfloat16) if dtype == "bfloat16" else t).to(device)
            self.offsets = (torch.arange(table.shape[0], dtype=torch.int32) * 256).view(1, -1, 1, 1).to(device)

    def __call__(self, pixels: Any) -> Any:
        if self.table is not None:
            index = pixels.to(self.offsets.dtype) + self.offsets  # flat table indices c * 256 + v
            pixels = self.table.index_select(0, index.view(-1)).view(index.shape)
        return pixels.permute(0, 2, 3, 1).contiguous() if self.layout == "HWC" else pixels


@dataclass
class _DeviceImages:
    """A fill's payload: the batch's images on the device, the event after them, the fields' payload, and how
    the images were made from the stored ones (decoded at full scale: the drawn boxes, in stored pixels)."""

    images: Any
    event: Any
    fields: Any
    served: ServedGeometry


class GpuJpegSource(VariableImageSource):
    """A VariableImageSource over JPEG rows that decodes and resamples each batch on ``gpu.device``.

    Only labels and extra fields go through the host ring; the images are made on the device."""

    def __init__(self, *args: Any, gpu: GpuDecode, **kwargs: Any) -> None:
        self.gpu = gpu
        super().__init__(*args, **kwargs)
        self._lookup = _Lookup(self.table, self.spec.dtype, self.spec.layout, gpu.device)
        self._stream: Any = None

    def _check_decoder(self) -> None:  # the CPU decoder is neither used nor needed
        pass

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]:
        buffers = {}
        if self.labels is not None:
            buffers["labels"] = allocate_host((capacity,), "int64", output, as_rows=True)
        if self.fields is not None:
            buffers.update(self.fields.allocate(capacity, output))
        return buffers

    def fill(self, buffers: dict[str, np.ndarray], plan: Any) -> _DeviceImages:
        import torch

        ids = plan.sample_ids
        n = ids.shape[0]
        boxes, flip, values = self._read_rows(plan)
        self._check_headers(values, ids)  # sizes as the columns say, before the device allocates
        joined = bytearray().join(values)  # one writable host copy of the batch's JPEG bytes, sliced per row
        ends = np.cumsum([len(v) for v in values]).tolist()
        whole = torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
        blobs = [whole[lo:hi] for lo, hi in zip([0, *ends[:-1]], ends, strict=True)]
        if self.gpu.device.type == "cuda":
            if self._stream is None:
                self._stream = torch.cuda.Stream(self.gpu.device)
            with torch.cuda.stream(self._stream):
                images = self._images(blobs, ids, boxes, flip)
                event = torch.cuda.Event()
                event.record(self._stream)
        else:
            images, event = self._images(blobs, ids, boxes, flip), None
        self.stats.decoded_rows += n  # its time is the GPU's, queued here: not counted as decode seconds
        if self.labels is not None:
            from .._kernels import kernels

            kernels.gather_rows(self.labels, ids, buffers["labels"][:n])
        fields = None if self.fields is None else self.fields.fill(buffers, ids)
        return _DeviceImages(images, event, fields, served_geometry(boxes, flip, n, self.out_hw))

    def _decode(self, blobs: list[Any], ids: np.ndarray) -> list[Any]:
        try:
            images = self.gpu.decoder.decode(blobs)
        except RuntimeError as e:  # name the row: decode them one by one
            for k, blob in enumerate(blobs):
                try:
                    self.gpu.decoder.decode([blob])
                except RuntimeError as one:
                    raise JpegDecodeError(self.path, int(ids[k]), str(one).splitlines()[0]) from None
            raise JpegDecodeError(self.path, int(ids[0]), f"the batch from this row on: {e}") from None
        h, w = self.columns.heights[ids], self.columns.widths[ids]
        for k, im in enumerate(images):
            if tuple(im.shape) != (3, int(h[k]), int(w[k])):
                raise ImageGeometryError(
                    f"{self.path}: row {int(ids[k])}: the JPEG decodes to {tuple(im.shape[1:])}, its height/width "
                    f"columns say ({int(h[k])}, {int(w[k])})")
        return images

    def _images(self, blobs: list[Any], ids: np.ndarray, boxes: np.ndarray, flip: np.ndarray | None) -> Any:
        images = self._decode(blobs, ids)
        if self.windows:  # as the CPU path fits them onto the decoded images (full scale here)
            hw = np.stack([self.columns.heights[ids], self.columns.widths[ids]], axis=1)
            boxes = fit_windows(boxes, hw)
        pixels = resample_batch(images, boxes, self.out_hw, windows=self.windows, flip=flip)
        return self._lookup(pixels)

    def batch(self, outputs: dict[str, Any], payload: _DeviceImages, plan: Any, backend: str,
              torch_device: Any = False) -> Any:
        """The Batch of one plan: the payload's device images (the current stream waits for them), labels,
        dataset rows, per-sample keys and the extra fields."""
        images = payload.images
        if payload.event is not None:
            import torch

            stream = torch.cuda.current_stream(self.gpu.device)
            stream.wait_event(payload.event)
            images.record_stream(stream)  # made on the side stream, read on this one
        fields = {}
        if self.fields is not None:
            fields = self.fields.values(outputs, payload.fields, torch_device if backend == "torch" else False)
        fields, crop_boxes, flips = payload.served.finish(fields, self.spec.geometry_fields, backend)
        return Batch(images, outputs.get("labels"), host_indices(plan.sample_ids, backend),
                     keys=sample_keys(self.seed, plan.epoch, plan.sample_ids), fields=fields,
                     crop_boxes=crop_boxes, flips=flips)
