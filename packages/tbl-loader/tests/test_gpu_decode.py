"""ImageLoader(decode_device="cuda"): JPEG storage decoded by nvJPEG, resampled and normalized on the device.

On any machine: the device resampling (`tbl_loader.image.gpu_decode.resample_batch`) is the CPU kernels' rule bit
for bit (run by torch on the CPU here), the whole source runs with a stand-in decoder (simplejpeg at full
scale, on the CPU device) and matches the reference exactly, the refusals are named, and asking for CUDA
where there is none raises GpuDecodeUnavailableError. With CUDA and torchvision: the same with the stand-in
decoder's pixels uploaded to the GPU (exact), and nvJPEG against the CPU path within a stated tolerance.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import collect
from test_variable_loader import (
    PER_SAMPLE,
    encode_jpeg,
    expected,
    loader,
    make_images,
    simplejpeg,
    write_jpeg,
    write_raw,
)

from tbl_loader import ImageDataset, RandomResizedCrop
from tbl_loader.errors import GpuDecodeUnavailableError, StateMismatchError, UnsupportedCombinationError
from tbl_loader.image import gpu_decode

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(simplejpeg is None or not PER_SAMPLE, reason="needs simplejpeg and tbl-kernels 0.2")

HAS_CUDA = torch.cuda.is_available()
try:
    gpu_decode._torchvision()
    HAS_TORCHVISION = True
except GpuDecodeUnavailableError:
    HAS_TORCHVISION = False
needs_nvjpeg = pytest.mark.skipif(not (HAS_CUDA and HAS_TORCHVISION), reason="needs CUDA and torchvision")
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="torch sees no CUDA device")


@pytest.fixture(scope="module")
def jimages() -> list[np.ndarray]:
    return make_images(40, seed=9)


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory, jimages):
    blobs = [encode_jpeg(im) for im in jimages]
    return write_jpeg(tmp_path_factory.mktemp("gpujpg") / "jpeg", blobs, [im.shape[:2] for im in jimages], 16), blobs


class FullScaleDecoder:
    """simplejpeg at full scale (what nvJPEG does: no DCT downscaling), as (3, H, W) tensors on ``device``."""

    info = {"name": "simplejpeg-full-scale", "version": "test"}

    def __init__(self, device) -> None:
        self.device = device

    def decode(self, blobs):
        out = []
        for b in blobs:
            try:
                img = simplejpeg.decode_jpeg(b.numpy().tobytes(), "RGB", strict=True)
            except ValueError as e:
                raise RuntimeError(str(e)) from None
            out.append(torch.from_numpy(img).permute(2, 0, 1).contiguous().to(self.device))
        return out


def full_scale(blobs):
    def decode(ids, boxes, out_hw):
        return [simplejpeg.decode_jpeg(blobs[i], "RGB") for i in ids], boxes

    return decode


@pytest.fixture
def stand_in(monkeypatch):
    """decode_device="cpu" (or "cuda") served by FullScaleDecoder instead of nvJPEG."""
    monkeypatch.setattr(gpu_decode, "make_decoder", lambda device: FullScaleDecoder(device))


def _random_case(rng, n, out_hw):
    imgs, boxes = [], []
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(5, 90, size=2))
        imgs.append(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    return imgs, np.array(boxes, np.int32)


@pytest.mark.parametrize("out_hw", [(16, 16), (7, 33), (64, 48)])
def test_resample_batch_is_the_cpu_kernels_rule(out_hw):
    from tbl_loader._kernels import kernels

    rng = np.random.default_rng(out_hw[0])
    imgs, boxes = _random_case(rng, 24, out_hw)
    flip = rng.random(24) < 0.5
    chw = [torch.from_numpy(im).permute(2, 0, 1).contiguous() for im in imgs]
    want = np.empty((24, 3, *out_hw), np.uint8)
    kernels.crop_resize_images(imgs, boxes, want, None, flip.view(np.uint8), "CHW")
    got = gpu_decode.resample_batch(chw, boxes, out_hw, flip=flip)
    assert np.array_equal(got.numpy(), want)
    # the evaluation transform: fractional windows of the whole image, horizontal pass first
    hw = np.array([im.shape[:2] for im in imgs], np.float64)
    windows = np.concatenate([boxes[:, :2] + rng.random((24, 2)) * 0.5, boxes[:, 2:] * 0.9 + 0.05], axis=1)
    windows[:, 2:] = np.minimum(windows[:, 2:], hw - windows[:, :2])
    want = np.empty((24, 3, *out_hw), np.uint8)
    kernels.resize_crop_images(imgs, windows, want, None, None, "CHW")
    assert np.array_equal(gpu_decode.resample_batch(chw, windows, out_hw, windows=True).numpy(), want)


@pytest.mark.parametrize(("dtype", "layout", "hflip"), [("float32", "CHW", 0.5), ("uint8", "HWC", 0.0),
                                                        ("bfloat16", "CHW", 1.0), ("float16", "HWC", 0.5)])
def test_device_decode_path_is_exact_on_the_same_pixels(jpeg, jimages, stand_in, dtype, layout, hflip):
    path, blobs = jpeg
    with loader(path, 8, backend="torch", device="cpu", decode_device="cpu", hflip=hflip, dtype=dtype,
                layout=layout) as ld:
        ld.set_epoch(3)
        got, labels, ids = collect(ld)
    want = expected(jimages, ids, epoch=3, hflip=hflip, dtype=dtype, layout=layout, decode=full_scale(blobs))
    assert np.array_equal(got, want)
    assert np.array_equal(labels, ids * 7)


def test_device_decode_evaluation_transform_is_exact(jpeg, jimages, stand_in):
    path, blobs = jpeg
    with loader(path, 9, backend="torch", device="cpu", decode_device="cpu", random_resized_crop=None,
                center_crop=10, resize=12, shuffle=False, hflip=0.5) as ld:
        got, _, ids = collect(ld)
    want = expected(jimages, ids, epoch=0, crop=None, resize=12, center=(10, 10), hflip=0.5,
                    decode=full_scale(blobs))
    assert np.array_equal(got, want)


def test_device_decode_stream_and_fingerprint(jpeg, stand_in):
    path, _ = jpeg
    kw = dict(backend="torch", device="cpu", decode_device="cpu", hflip=0.5)
    runs = []
    for batch, prefetch in [(7, 0), (32, 3)]:
        with loader(path, batch, prefetch=prefetch, **kw) as ld:
            runs.append(collect(ld))
    for field in range(3):
        assert np.array_equal(runs[0][field], runs[1][field])
    with loader(path, 8, **kw) as first:
        head = collect(first, limit=2)
        state = first.state_dict()
    with loader(path, 5, **kw) as resumed:
        resumed.load_state_dict(state)
        tail = collect(resumed)
    for field in range(3):
        assert np.array_equal(np.concatenate([head[field], tail[field]]), runs[0][field])
    with loader(path, 8, backend="torch", hflip=0.5) as cpu, pytest.raises(StateMismatchError):
        cpu.load_state_dict(state)  # another decoder, other pixels: refused


def test_device_decode_names_a_bad_row(tmp_path, jimages, stand_in):
    from tbl_loader.errors import JpegDecodeError

    blobs = [encode_jpeg(im) for im in jimages[:6]]
    blobs[4] = blobs[4][: len(blobs[4]) // 2]
    path = write_jpeg(tmp_path / "bad.tbl", blobs, [im.shape[:2] for im in jimages[:6]])
    with loader(path, 6, shuffle=False, backend="torch", device="cpu", decode_device="cpu") as ld, \
            pytest.raises(JpegDecodeError, match="row 4"):
        collect(ld)


def test_device_decode_refusals_are_named(jpeg, jimages, tmp_path, dataset_path, stand_in):
    path, _ = jpeg
    kw = dict(device="cpu", decode_device="cpu")
    with pytest.raises(ValueError, match="JPEG storage"):
        loader(write_raw(tmp_path / "raw", jimages[:5]), 4, backend="torch", **kw)
    with pytest.raises(ValueError, match="JPEG storage"):
        loader(dataset_path, 4, backend="torch", random_resized_crop=None, **kw)
    with pytest.raises(ValueError, match="nvJPEG's own"):
        loader(path, 4, backend="torch", jpeg_dct="fast", **kw)
    with pytest.raises(ValueError, match="backend"):
        loader(path, 4, backend="numpy", decode_device="cpu")
    with pytest.raises(ValueError, match="device='cpu' as well"):
        loader(path, 4, backend="torch", decode_device="cpu")
    with pytest.raises(UnsupportedCombinationError, match="several crop views"):
        loader(path, 4, backend="torch", random_resized_crop=[RandomResizedCrop(8), RandomResizedCrop(4)], **kw)
    with loader(path, 4, backend="torch", **kw) as ld, pytest.raises(UnsupportedCombinationError,
                                                                      match="decode_device"):
        ImageDataset.from_loader(ld)  # its workers would decode on the CPU: other pixels than the loader's


def test_decode_device_must_be_cuda(jpeg):
    with pytest.raises((ValueError, GpuDecodeUnavailableError), match="CUDA device|decode_device"):
        loader(jpeg[0], 4, backend="torch", device="cpu", decode_device="cpu")


@pytest.mark.skipif(HAS_CUDA, reason="checks the error raised without CUDA")
def test_cuda_decode_without_cuda_is_a_named_error(jpeg):
    with pytest.raises(GpuDecodeUnavailableError, match="torch sees none"):
        loader(jpeg[0], 4, backend="torch", device="cuda", decode_device="cuda")


def test_missing_torchvision_is_a_named_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torchvision", None)
    with pytest.raises(GpuDecodeUnavailableError, match=r"tbl-loader\[gpu\]"):
        gpu_decode._torchvision()


@needs_cuda
def test_device_resampling_is_exact_on_cuda(jpeg, jimages, stand_in):
    """The stand-in decoder's pixels uploaded to the GPU: the device arithmetic is the CPU kernels', bit for bit."""
    path, blobs = jpeg
    with loader(path, 8, backend="torch", device="cuda", decode_device="cuda", hflip=0.5, dtype="bfloat16") as ld:
        ld.set_epoch(1)
        first = next(iter(ld))
        assert first.images.device.type == "cuda" and first.labels.device.type == "cuda"
        ld.set_epoch(1)
        got, _, ids = collect(ld)
    assert np.array_equal(got, expected(jimages, ids, epoch=1, hflip=0.5, dtype="bfloat16", decode=full_scale(blobs)))


@needs_nvjpeg
@pytest.mark.parametrize("crop", [RandomResizedCrop(16, scale=(0.2, 1.0)), None])
def test_nvjpeg_against_the_cpu_decode(jpeg, crop):
    """nvJPEG's pixels against libjpeg-turbo's (simplejpeg), same boxes and flips, uint8 output.

    Tolerance: the decoders differ in IDCT and chroma upsampling, and the CPU path decodes at a reduced DCT
    scale where the box allows; the mean absolute difference stays below 3 levels of 255."""
    path, _ = jpeg
    kw = dict(hflip=0.5, dtype="uint8", backend="torch", shuffle=False)
    if crop is None:
        kw.update(random_resized_crop=None, center_crop=10, resize=12)
    with loader(path, 8, **kw) as cpu:
        want, wl, wi = collect(cpu)
    with loader(path, 8, device="cuda", decode_device="cuda", **kw) as gpu:
        got, gl, gi = collect(gpu)
    assert np.array_equal(wl, gl) and np.array_equal(wi, gi)
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert diff.mean() < 3.0, (diff.mean(), diff.max())


@needs_nvjpeg
def test_nvjpeg_batches_read_on_another_stream(jpeg):
    path, _ = jpeg
    kw = dict(hflip=0.5, backend="torch", device="cuda", decode_device="cuda", dtype="float32")
    with loader(path, 8, prefetch=0, **kw) as ld:
        want = [b.images.double().sum().item() for b in ld]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side), loader(path, 8, prefetch=4, **kw) as ld:
        got = [b.images.double().sum() for b in ld]
        got = [g.item() for g in got]
    assert got == want


def test_device_decode_batches_carry_their_crop_boxes_and_flips(jpeg, stand_in):
    from tbl_loader.stream import order

    path, _ = jpeg
    heights = np.array([im.shape[0] for im in make_images(40, seed=9)])
    widths = np.array([im.shape[1] for im in make_images(40, seed=9)])
    with loader(path, 8, backend="torch", device="cpu", decode_device="cpu", hflip=0.5) as ld:
        ld.set_epoch(2)
        for batch in ld:
            ids = batch.indices.numpy()
            crop = ld.spec.random_resized_crop
            drawn = order.random_resized_crop_boxes(ld.seed, 2, ids, heights[ids], widths[ids], crop.scale,
                                                    crop.ratio)
            assert np.array_equal(batch.crop_boxes.numpy(), drawn.astype(np.float64))  # full-scale decode
            assert np.array_equal(batch.flips.numpy(), order.flip_draws(ld.seed, 2, ids, 0.5))


def test_device_decode_boxes_follow_the_crop(tmp_path, jpeg, stand_in):
    import tbl_format

    _, blobs = jpeg
    images = make_images(40, seed=9)
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "boxes": tbl_format.Leaf("var_array", dtype="float32", ndim=2)})
    boxes = [np.array([[1, 2, im.shape[1] - 1, im.shape[0] - 2]] * (i % 3), np.float32).reshape(-1, 4)
             for i, im in enumerate(images)]
    with tbl_format.Writer(tmp_path / "boxes", schema) as w:
        for blob, im, b in zip(blobs, images, boxes, strict=True):
            w.write({"image": blob, "height": im.shape[0], "width": im.shape[1], "boxes": b})
    with loader(tmp_path / "boxes", 8, backend="torch", device="cpu", decode_device="cpu", hflip=0.5,
                fields=("boxes",), geometry={"boxes": "xyxy"}) as ld:
        out_hw = ld.spec.random_resized_crop.output_size
        for batch in ld:
            crop, flips = batch.crop_boxes.numpy(), batch.flips.numpy()
            for k, row in enumerate(batch.indices.tolist()):
                (top, left, h, w), (oh, ow) = crop[k].tolist(), out_hw  # the documented rule, in Python floats
                want = []
                for x1, y1, x2, y2 in boxes[row].tolist():
                    xs = [min(max(((x - left) * ow) / w, 0.0), float(ow)) for x in (x1, x2)]
                    ys = [min(max(((y - top) * oh) / h, 0.0), float(oh)) for y in (y1, y2)]
                    xs = [ow - xs[1], ow - xs[0]] if flips[k] else xs
                    want.append([xs[0], ys[0], xs[1], ys[1]])
                assert np.array_equal(batch.fields["boxes"][k].numpy(), np.array(want, np.float32).reshape(-1, 4))
