"""ImageLoader over variable-size images (tbl convert --max-size): exact pixels, determinism, resume, errors.

Expectations are built from the numpy reference kernel (tbl_kernels.reference.crop_resize_images) on
boxes drawn from the sizes columns alone, and compared with np.array_equal.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import as_numpy, collect

import tbl_format
import tbl_kernels
from tbl_kernels import reference as kref
from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_loader.errors import ImageGeometryError, StateMismatchError
from tbl_loader.image.spec import ImageSpec, fit_windows, resized_center_crop_windows
from tbl_loader.stream import order

N = 45
SEED = 11
CROP = RandomResizedCrop(16, scale=(0.2, 1.0))
PER_SAMPLE = hasattr(tbl_kernels, "crop_resize_images")  # tbl-kernels 0.2; the oldest kernels the pin admits lack it
needs_per_sample = pytest.mark.skipif(not PER_SAMPLE, reason="needs tbl-kernels 0.2 (resize_crop_images)")
STORAGE = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8}


def make_images(n: int = N, seed: int = 0) -> list[np.ndarray]:
    """Smooth images (so JPEG keeps them recognisable) of sizes 12..70 on each side."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(12, 71, size=2))
        y, x = np.mgrid[0:h, 0:w]
        base = rng.integers(0, 256, size=3)
        img = (base + 3 * y[..., None] + 2 * x[..., None] + rng.integers(0, 20, (h, w, 3))) % 256
        out.append(np.ascontiguousarray(img.astype(np.uint8)))
    return out


def write_raw(path: Path, images: list[np.ndarray], *, shard_rows: int | None = None, lie_at: int | None = None) -> Path:
    schema = tbl_format.Schema({"image": tbl_format.Leaf("var_array", dtype="uint8", ndim=3),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int")})
    with tbl_format.Writer(path, schema, shard_rows=shard_rows) as w:
        for i, img in enumerate(images):
            h = img.shape[0] + (1 if i == lie_at else 0)
            w.write({"image": img, "height": h, "width": img.shape[1], "label": i * 7})
    return path


@pytest.fixture(scope="module")
def var_images() -> list[np.ndarray]:
    return make_images()


@pytest.fixture(scope="module")
def raw_path(tmp_path_factory, var_images) -> Path:
    if not PER_SAMPLE:
        pytest.skip(f"tbl-kernels {tbl_kernels.__version__} has no crop_resize_images (0.2 has)")
    return write_raw(tmp_path_factory.mktemp("var") / "raw", var_images, shard_rows=20)


def expected(images, ids, *, epoch, hflip=0.0, dtype="float32", layout="CHW", crop=CROP, resize=None, center=None,
             decode=None):
    """The reference batch for ``ids``: boxes from the sizes only, reference crop-resize (or, for the evaluation
    transform, windows and the reference resize-crop), flip, table."""
    ids = np.asarray(ids, np.int64)
    hs = np.array([images[i].shape[0] for i in ids], np.int64)
    ws = np.array([images[i].shape[1] for i in ids], np.int64)
    if crop is not None:
        oh, ow = crop.output_size
        boxes = order.random_resized_crop_boxes(SEED, epoch, ids, hs, ws, crop.scale, crop.ratio)
    else:
        oh, ow = center
        boxes = resized_center_crop_windows(hs, ws, resize, oh, ow)
    sources = [images[i] for i in ids]
    if decode is not None:
        sources, boxes = decode(ids, boxes, (oh, ow))
    flip = order.flip_draws(SEED, epoch, ids, hflip).astype(np.uint8) if hflip else None
    table = None if dtype == "uint8" else kref.normalization_table((0.5, 0.4, 0.3), (0.2, 0.25, 0.3), dtype)
    shape = (len(ids), 3, oh, ow) if layout == "CHW" else (len(ids), oh, ow, 3)
    out = np.empty(shape, STORAGE[dtype])
    (kref.crop_resize_images if crop is not None else kref.resize_crop_images)(sources, boxes, out, table, flip, layout)
    return out


def loader(path, batch_size=8, **kw):
    opts = {"seed": SEED, "backend": "numpy", "random_resized_crop": CROP, "mean": (0.5, 0.4, 0.3),
            "std": (0.2, 0.25, 0.3), **kw}
    return ImageLoader(path, batch_size, **opts)


@pytest.mark.parametrize(("dtype", "layout", "hflip"), [("float32", "CHW", 0.5), ("uint8", "HWC", 0.0),
                                                        ("bfloat16", "CHW", 1.0), ("float16", "HWC", 0.5)])
def test_random_resized_crop_is_exact(raw_path, var_images, dtype, layout, hflip):
    with loader(raw_path, 8, hflip=hflip, dtype=dtype, layout=layout) as ld:
        ld.set_epoch(3)
        got, labels, ids = collect(ld)
    assert sorted(ids.tolist()) == list(range(N))
    assert np.array_equal(got, expected(var_images, ids, epoch=3, hflip=hflip, dtype=dtype, layout=layout))
    assert np.array_equal(labels, ids * 7)
    assert ld.image_shape is None


def test_evaluation_transform_is_exact(raw_path, var_images):
    with loader(raw_path, 10, random_resized_crop=None, center_crop=10, resize=12, shuffle=False) as ld:
        got, _, ids = collect(ld)
    assert np.array_equal(ids, np.arange(N))
    assert np.array_equal(got, expected(var_images, ids, epoch=0, crop=None, resize=12, center=(10, 10)))


@pytest.mark.parametrize(("dtype", "layout", "hflip"), [("uint8", "HWC", 0.0), ("bfloat16", "CHW", 0.5)])
def test_evaluation_transform_every_output(raw_path, var_images, dtype, layout, hflip):
    with loader(raw_path, 7, random_resized_crop=None, center_crop=(10, 8), resize=11, shuffle=False, dtype=dtype,
                layout=layout, hflip=hflip) as ld:
        got, _, ids = collect(ld)
    want = expected(var_images, ids, epoch=0, crop=None, resize=11, center=(10, 8), dtype=dtype, layout=layout,
                    hflip=hflip)
    assert np.array_equal(got, want)


def test_evaluation_transform_is_resize_then_crop(raw_path, var_images):
    """The loader's output is the reference resize of the whole image to torchvision's size, then the centre crop."""
    with loader(raw_path, 10, random_resized_crop=None, center_crop=10, resize=12, shuffle=False,
                dtype="uint8", layout="HWC") as ld:
        got, _, ids = collect(ld)
    differing = 0
    for k, i in enumerate(ids):
        h, w = var_images[i].shape[:2]
        short, long = min(h, w), max(h, w)
        nh, nw = (int(12 * long / short), 12) if w <= h else (12, int(12 * long / short))
        full = kref.resize_crop_u8(var_images[i], (0.0, 0.0, h, w), nh, nw)
        top, left = int(round((nh - 10) / 2.0)), int(round((nw - 10) / 2.0))
        diff = np.abs(got[k].astype(np.int64) - full[top : top + 10, left : left + 10])
        assert diff.max() <= 1  # the window's float64 centres may differ from the whole image's in the last bit
        differing += int(diff.any())
    assert differing <= 1


def test_resized_center_crop_windows_rule():
    # 100x150 -> shorter side 50: 50x75, crop 40x40 at (5, round(17.5) = 18); windows in source pixels
    assert resized_center_crop_windows([100], [150], 50, 40, 40).tolist() == [[10.0, 36.0, 80.0, 80.0]]
    # 33x40 -> 20x24 (int(20 * 40 / 33) = 24), crop 7x20 at (round(6.5) = 6, 2)
    want = [[6 * 33 / 20, 2 * 40 / 24, 7 * 33 / 20, 20 * 40 / 24]]
    assert resized_center_crop_windows([33], [40], 20, 7, 20).tolist() == want
    # a window never ends past its side in float64, whatever the rounding
    rng = np.random.default_rng(0)
    hs, ws = rng.integers(1, 3000, 20000), rng.integers(1, 3000, 20000)
    win = resized_center_crop_windows(hs, ws, 256, 224, 200)
    assert (win[:, 0] >= 0).all() and (win[:, 0] + win[:, 2] <= hs).all()
    assert (win[:, 1] >= 0).all() and (win[:, 1] + win[:, 3] <= ws).all()


def test_fit_windows_keeps_windows_inside_after_scaling():
    """A whole-side window scaled onto a DCT-decoded image may round past the edge: it is brought back inside."""
    over = np.nextafter(50.0, 51.0)
    fitted = fit_windows(np.array([[0.0, 3.0, over, 40.0], [10.0, 0.0, 40.0, over]]), np.array([[50, 50], [50, 50]]))
    assert fitted.tolist() == [[0.0, 3.0, 50.0, 40.0], [10.0, 0.0, 40.0, 50.0]]
    size = np.nextafter(40.0, 41.0)
    assert 10.0 + size > 50.0  # start + size one ulp past the side
    fitted = fit_windows(np.array([[10.0, 0.0, size, 1.0]]), np.array([[50, 50]]))
    assert fitted[0, 0] + fitted[0, 2] <= 50.0 and 10.0 - 1e-12 < fitted[0, 0] < 10.0 and fitted[0, 2] == size


def _saved_by_previous_rule(monkeypatch, path, **kw):
    """A state saved under the previous evaluation rule: stream settings without ``eval_rule``."""
    current = ImageSpec.stream_settings

    def previous(self):
        settings = current(self)
        settings.pop("eval_rule", None)
        return settings

    with monkeypatch.context() as m:
        m.setattr(ImageSpec, "stream_settings", previous)
        with loader(path, 8, **kw) as ld:
            next(iter(ld))
            return ld.state_dict()


@needs_per_sample
@pytest.mark.parametrize("storage", ["variable", "fixed"])
def test_evaluation_rule_is_in_the_fingerprint_and_random_crop_states_still_resume(raw_path, dataset_path,
                                                                                    monkeypatch, storage):
    """A state saved by the previous rule (settings without the evaluation rule) no longer resumes the
    evaluation transform, on either storage, and still resumes random-crop streams, whose settings did not change."""
    path = raw_path if storage == "variable" else dataset_path
    evaluation = {"random_resized_crop": None, "center_crop": 6, "resize": 7}
    old = _saved_by_previous_rule(monkeypatch, path, **evaluation)
    with loader(path, 8, **evaluation) as ld, pytest.raises(StateMismatchError, match="eval_rule"):
        ld.load_state_dict(old)
    old = _saved_by_previous_rule(monkeypatch, path, hflip=0.5)
    with loader(path, 8, hflip=0.5) as ld:
        ld.load_state_dict(old)
        assert ld.state_dict() == old


def test_resize_goes_with_center_crop():
    with pytest.raises(ValueError, match="resize goes with center_crop"):
        ImageSpec(resize=10)


@needs_per_sample
def test_fixed_size_dataset_takes_the_evaluation_transform_too(dataset_path):
    with ImageLoader(dataset_path, 16, backend="numpy", center_crop=6, resize=7, shuffle=False,
                     dtype="uint8") as ld:
        got, _, ids = collect(ld)
        ds = tbl_format.open(dataset_path)
        stored = np.concatenate([np.asarray(s) for s in ds.segments("image")])
        ds.close()
    h, w = stored.shape[1:3]
    windows = np.repeat(resized_center_crop_windows([h], [w], 7, 6, 6), len(ids), axis=0)
    want = np.empty((len(ids), 3, 6, 6), np.uint8)
    kref.resize_crop_images([stored[i] for i in ids], windows, want, None, None, "CHW")
    assert np.array_equal(got, want)


@needs_per_sample
@pytest.mark.parametrize("dtype", ["float32", "uint8"])
@pytest.mark.parametrize("hflip", [0.0, 0.5])
def test_evaluation_transform_is_the_same_on_fixed_and_variable_storage(tmp_path, dtype, hflip):
    """The same 256x256 pixels stored once in a fixed-size column and once as variable-size raw rows:
    ``resize=224, center_crop=192`` gives identical outputs (one rule, torchvision's geometry)."""
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (12, 256, 256, 3), dtype=np.uint8)
    fixed = tbl_format.write(({"image": im, "label": np.int64(i)} for i, im in enumerate(images)),
                             tmp_path / "fixed", shard_rows=5)
    variable = write_raw(tmp_path / "variable", list(images), shard_rows=5)
    kw = dict(batch_size=5, shuffle=True, seed=2, backend="numpy", hflip=hflip, dtype=dtype, resize=224,
              center_crop=192)
    with ImageLoader(fixed, **kw) as a, ImageLoader(variable, **kw) as b:
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(np.asarray(x.indices), np.asarray(y.indices))
            assert np.array_equal(np.asarray(x.images), np.asarray(y.images))


def test_same_stream_every_way(raw_path, tmp_path, var_images):
    """prefetch on/off, 1 and 2 threads, batch 7 and 64, 1 shard or 3: the same samples, bit for bit."""
    single = write_raw(tmp_path / "single.tbl", var_images)
    runs = []
    for path, batch, prefetch, threads in [(raw_path, 7, 0, 1), (raw_path, 64, 2, 2), (single, 7, 3, 2),
                                           (single, 64, 0, 1)]:
        with loader(path, batch, hflip=0.5, prefetch=prefetch, num_threads=threads) as ld:
            ld.set_epoch(1)
            runs.append(collect(ld))
    for other in runs[1:]:
        for field in range(3):
            assert np.array_equal(runs[0][field], other[field])


def test_evaluation_stream_is_the_same_every_way(raw_path, tmp_path, var_images):
    """The evaluation transform: prefetch on/off, 1 and 2 threads, batch 7 and 64, resumed and straight."""
    single = write_raw(tmp_path / "single.tbl", var_images)
    ev = {"random_resized_crop": None, "center_crop": (10, 9), "resize": 13, "hflip": 0.5}
    runs = []
    for path, batch, prefetch, threads in [(raw_path, 7, 0, 1), (raw_path, 64, 2, 2), (single, 7, 3, 2),
                                           (single, 64, 0, 1)]:
        with loader(path, batch, prefetch=prefetch, num_threads=threads, **ev) as ld:
            ld.set_epoch(1)
            runs.append(collect(ld))
    first = loader(raw_path, 7, **ev)
    first.set_epoch(1)
    head = collect(first, limit=2)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    with loader(raw_path, 64, prefetch=0, **ev) as resumed:
        resumed.load_state_dict(state)
        tail = collect(resumed)
    runs.append(tuple(np.concatenate([a, b]) for a, b in zip(head, tail, strict=True)))
    for other in runs[1:]:
        for field in range(3):
            assert np.array_equal(runs[0][field], other[field])


@pytest.mark.parametrize("k", [1, 3])
def test_resume_yields_the_rest(raw_path, k):
    with loader(raw_path, 8, hflip=0.5) as ld:
        ld.set_epoch(2)
        straight = collect(ld)
    first = loader(raw_path, 8, hflip=0.5)
    first.set_epoch(2)
    head = collect(first, limit=k)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    resumed = loader(raw_path, 5, hflip=0.5, prefetch=0)
    resumed.load_state_dict(state)
    tail = collect(resumed)
    resumed.close()
    for field in range(3):
        assert np.array_equal(np.concatenate([head[field], tail[field]]), straight[field])


@pytest.mark.skipif(not PER_SAMPLE, reason="needs tbl-kernels 0.2 (crop_resize_images)")
def test_height_width_disagreeing_with_pixels_is_a_named_error(tmp_path, var_images):
    path = write_raw(tmp_path / "lie.tbl", var_images[:5], lie_at=3)
    with loader(path, 5, shuffle=False) as ld, pytest.raises(ImageGeometryError, match="row 3"):
        collect(ld)


def test_variable_images_need_a_fixed_output_size(raw_path):
    with pytest.raises(ValueError, match="random_resized_crop or center_crop"):
        loader(raw_path, random_resized_crop=None)
    with pytest.raises(ValueError, match="does not fit row"):
        loader(raw_path, random_resized_crop=None, center_crop=40)


def test_kernels_without_crop_resize_images_name_the_pip_command(tmp_path, var_images, monkeypatch):
    import tbl_loader._kernels as k
    from tbl_loader.errors import KernelsFeatureError

    path = write_raw(tmp_path / "v.tbl", var_images[:4])
    if PER_SAMPLE:  # on the oldest kernels the pin admits this is the real thing, not a stand-in

        class Old:
            __version__ = "0.1.0"

        monkeypatch.setattr(k, "kernels", Old())
    with pytest.raises(KernelsFeatureError, match="pip install"):
        loader(path)
    # The evaluation transform takes the same per-sample call on fixed-size storage too.
    fixed = tbl_format.write(({"image": np.full((9, 9, 3), i, np.uint8), "label": np.int64(i)} for i in range(4)),
                             tmp_path / "f.tbl")
    with pytest.raises(KernelsFeatureError, match="pip install"):
        ImageLoader(fixed, 2, backend="numpy", center_crop=6, resize=7)


def test_binding_fixed_size_columns_refuses_variable_images_by_name(tmp_path, var_images):
    """ImageSpec.bind (the fixed-size column binding tbl-resident uploads from) names the refused combination."""
    from tbl_loader.errors import UnsupportedCombinationError
    from tbl_loader.image import ImageSpec

    path = write_raw(tmp_path / "v.tbl", var_images[:4])
    with tbl_format.open(path) as ds, pytest.raises(UnsupportedCombinationError, match="variable size"):
        ImageSpec().bind(ds)


# ---------------------------------------------------------------------------------------------- JPEG storage

try:
    import simplejpeg  # the jpeg extra: pip install "tbl-loader[jpeg]"
except ImportError:
    simplejpeg = None
needs_decoder = pytest.mark.skipif(simplejpeg is None, reason='needs the jpeg extra: pip install "tbl-loader[jpeg]"')


def encode_jpeg(img: np.ndarray) -> bytes:
    return simplejpeg.encode_jpeg(img, quality=92, colorspace="RGB")


def write_jpeg(path: Path, blobs: list[bytes], sizes: list[tuple[int, int]], shard_rows=None) -> Path:
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int")})
    with tbl_format.Writer(path, schema, shard_rows=shard_rows) as w:
        for i, (b, (h, wd)) in enumerate(zip(blobs, sizes, strict=True)):
            w.write({"image": b, "height": h, "width": wd, "label": i * 7})
    return path


@pytest.fixture(scope="module")
def jpeg_data(tmp_path_factory, var_images):
    if simplejpeg is None or not PER_SAMPLE:
        pytest.skip("needs simplejpeg and tbl-kernels 0.2")
    blobs = [encode_jpeg(im) for im in var_images]
    path = write_jpeg(tmp_path_factory.mktemp("jpg") / "jpeg", blobs, [im.shape[:2] for im in var_images], 20)
    return path, blobs


def decoder(blobs):
    """The documented serve-time decode: DCT scale from the box, boxes mapped onto the decoded image."""
    from tbl_loader.image.jpeg import dct_scale, scale_boxes

    def decode(ids, boxes, out_hw):
        scales = dct_scale(boxes[:, 2], boxes[:, 3], *out_hw)
        full, decoded, sources = [], [], []
        for i, k in zip(ids, scales, strict=True):
            h, w, _, _ = simplejpeg.decode_jpeg_header(blobs[i])
            img = simplejpeg.decode_jpeg(blobs[i], "RGB", min_height=-(-h // k), min_width=-(-w // k))
            full.append((h, w))
            decoded.append(img.shape[:2])
            sources.append(img)
        if boxes.dtype == np.float64:  # evaluation windows scale with the image, kept inside it
            full_hw, dec_hw = np.array(full, np.float64), np.array(decoded)
            windows = boxes * np.concatenate([dec_hw / full_hw] * 2, axis=1)
            return sources, fit_windows(windows, dec_hw)
        return sources, scale_boxes(boxes, np.array(full), np.array(decoded))

    return decode


def test_jpeg_storage_is_exact(jpeg_data, var_images):
    path, blobs = jpeg_data
    with loader(path, 8, hflip=0.5, num_threads=2) as ld:
        ld.set_epoch(4)
        got, labels, ids = collect(ld)
    assert np.array_equal(got, expected(var_images, ids, epoch=4, hflip=0.5, decode=decoder(blobs)))
    assert np.array_equal(labels, ids * 7)


def test_jpeg_evaluation_transform_is_exact(jpeg_data, var_images):
    """The evaluation windows on JPEG storage, DCT downscaling included, as the reference computes them."""
    from tbl_loader.image.jpeg import dct_scale

    path, blobs = jpeg_data
    with loader(path, 9, random_resized_crop=None, center_crop=10, resize=12, shuffle=False, hflip=0.5) as ld:
        got, _, ids = collect(ld)
    windows = resized_center_crop_windows([im.shape[0] for im in var_images], [im.shape[1] for im in var_images],
                                          12, 10, 10)
    assert set(dct_scale(windows[:, 2], windows[:, 3], 10, 10).tolist()) >= {1, 2}  # both paths are exercised
    want = expected(var_images, ids, epoch=0, crop=None, resize=12, center=(10, 10), hflip=0.5, decode=decoder(blobs))
    assert np.array_equal(got, want)


def test_dct_downscaling_is_used_when_the_box_allows(jpeg_data, var_images):
    from tbl_loader.image.jpeg import dct_scale, scale_boxes

    small = RandomResizedCrop(4, scale=(0.5, 1.0))
    path, blobs = jpeg_data
    with loader(path, 16, random_resized_crop=small, dtype="uint8") as ld:
        got, _, ids = collect(ld)
    assert np.array_equal(got, expected(var_images, ids, epoch=0, dtype="uint8", crop=small, decode=decoder(blobs)))
    hs = np.array([var_images[i].shape[0] for i in ids])
    ws = np.array([var_images[i].shape[1] for i in ids])
    boxes = order.random_resized_crop_boxes(SEED, 0, ids, hs, ws, small.scale, small.ratio)
    scales = dct_scale(boxes[:, 2], boxes[:, 3], 4, 4)
    assert set(scales.tolist()) >= {2, 4, 8}  # the 1/2, 1/4 and 1/8 decodes all happen here
    assert dct_scale(np.array([7, 8, 16, 32, 31]), np.array([100] * 5), 4, 4).tolist() == [1, 2, 4, 8, 4]
    # a box maps onto the decoded image covering the same part of the picture
    assert scale_boxes(np.array([[3, 5, 10, 9]]), np.array([[41, 30]]), np.array([[21, 15]])).tolist() == [
        [1, 2, 6, 5]]


def test_jpeg_stream_is_the_same_every_way(jpeg_data):
    path, _ = jpeg_data
    runs = []
    for batch, prefetch, threads in [(7, 0, 1), (64, 2, 2)]:
        with loader(path, batch, hflip=0.5, prefetch=prefetch, num_threads=threads) as ld:
            runs.append(collect(ld))
    for field in range(3):
        assert np.array_equal(runs[0][field], runs[1][field])
    first = loader(path, 8, hflip=0.5)
    head = collect(first, limit=2)
    state = first.state_dict()
    first.close()
    resumed = loader(path, 3, hflip=0.5)
    resumed.load_state_dict(state)
    tail = collect(resumed)
    resumed.close()
    for field in range(3):
        assert np.array_equal(np.concatenate([head[field], tail[field]]), runs[0][field])


def thread_pool_decode(monkeypatch):
    """Serve JPEG storage as on kernels without the JPEG decode (tbl-kernels 0.2): simplejpeg in a thread pool."""
    from tbl_loader import _kernels
    from tbl_loader.image import variable_source

    monkeypatch.setattr(_kernels, "jpeg_decode_kernels", lambda module=None: None)
    monkeypatch.setattr(variable_source, "jpeg_decode_kernels", lambda module=None: None)


FUSED = hasattr(tbl_kernels, "decode_crop_resize_jpegs")
needs_fused = pytest.mark.skipif(not FUSED, reason="needs tbl-kernels 0.3 (JPEG decode in the kernel pass)")


def test_decoder_version_is_part_of_the_stream_fingerprint(jpeg_data, monkeypatch):
    path, _ = jpeg_data
    ld = loader(path)
    state = ld.state_dict()
    ld.close()
    if FUSED:  # the kernels' libjpeg-turbo serves
        monkeypatch.setattr(tbl_kernels, "jpeg_decoder", lambda: {"name": "libjpeg-turbo", "version": "0.0.1-other"})
    else:
        monkeypatch.setattr(simplejpeg, "__version__", "0.0.1-other")
    other = loader(path)
    with pytest.raises(StateMismatchError):
        other.load_state_dict(state)
    other.close()


@needs_fused
@pytest.mark.parametrize("evaluation", [False, True])
def test_fused_and_thread_pool_decodes_give_the_same_batches(jpeg_data, monkeypatch, evaluation):
    """Where the kernels decode (0.3) and where simplejpeg does in a thread pool (0.2): the same pixels, boxes
    and geometry, every DCT scale; each decoder names itself in the stream fingerprint, so a state saved under
    one is refused by the other."""
    path, _ = jpeg_data
    small = RandomResizedCrop(4, scale=(0.05, 1.0))
    options = (dict(random_resized_crop=None, center_crop=10, resize=12, shuffle=False) if evaluation
               else dict(random_resized_crop=small))
    runs, states = [], []
    for pool in (False, True):
        if pool:
            thread_pool_decode(monkeypatch)
        with loader(path, 16, hflip=0.5, num_threads=2, **options) as ld:
            ld.set_epoch(3)
            batches = [tuple(as_numpy(v).copy() for v in (b.images, b.indices, b.crop_boxes, b.flips)) for b in ld]
            states.append(ld.state_dict())
        runs.append(batches)
    assert states[0] != states[1]
    for fused, pooled in zip(*runs, strict=True):
        for a, b in zip(fused, pooled, strict=True):
            assert np.array_equal(a, b)
    with loader(path, 16, **options) as ld, pytest.raises(StateMismatchError):
        ld.load_state_dict(states[0])  # the thread-pool decoder is patched in: the fused state is refused


@needs_decoder
def test_a_jpeg_that_does_not_decode_names_its_row(tmp_path, var_images):
    if not PER_SAMPLE:
        pytest.skip("needs tbl-kernels 0.2")
    from tbl_loader.errors import JpegDecodeError

    blobs = [encode_jpeg(im) for im in var_images[:6]]
    blobs[4] = blobs[4][: len(blobs[4]) // 2]  # truncated: never served as a grey or black image
    path = write_jpeg(tmp_path / "bad.tbl", blobs, [im.shape[:2] for im in var_images[:6]])
    with loader(path, 6, shuffle=False) as ld, pytest.raises(JpegDecodeError, match="row 4") as info:
        collect(ld)
    assert info.value.row == 4 and "bad.tbl" in str(info.value)


def test_missing_decoder_names_the_pip_command(jpeg_data, monkeypatch):
    """Without the kernels' JPEG decode (tbl-kernels 0.2), serving JPEG storage needs simplejpeg."""
    import sys

    from tbl_loader.errors import JpegDecoderUnavailableError

    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    thread_pool_decode(monkeypatch)
    with pytest.raises(JpegDecoderUnavailableError, match=r"tbl-loader\[jpeg\]"):
        loader(jpeg_data[0])


@needs_fused
def test_kernels_that_decode_need_no_simplejpeg(jpeg_data, var_images, monkeypatch):
    import sys

    path, blobs = jpeg_data
    expected_images = None
    with loader(path, 8, hflip=0.5) as ld:
        expected_images = collect(ld)
    monkeypatch.setitem(sys.modules, "simplejpeg", None)
    with loader(path, 8, hflip=0.5) as ld:
        got = collect(ld)
    for a, b in zip(got, expected_images, strict=True):
        assert np.array_equal(a, b)


@needs_decoder
def test_converted_jpeg_dataset_serves(tmp_path):
    pytest.importorskip("skimage")
    if not PER_SAMPLE:
        pytest.skip("needs tbl-kernels 0.2")
    from convert_images import jpeg_set, write_tree

    from tbl_loader import convert

    src = write_tree(tmp_path / "src", {f"c{i % 2}/{i}.jpg": d for i, d in enumerate(jpeg_set(12, lo=30, hi=90))})
    convert(src, tmp_path / "j.tbl", max_size=48, store="jpeg", workers=1, progress=False)
    convert(src, tmp_path / "r.tbl", max_size=48, store="raw", workers=1, progress=False)
    with loader(tmp_path / "j.tbl", 4) as a, loader(tmp_path / "r.tbl", 4) as b:
        ja, ra = collect(a), collect(b)
    assert ja[0].shape == ra[0].shape == (12, 3, 16, 16)
    assert np.array_equal(ja[2], ra[2]) and np.array_equal(ja[1], ra[1])
    assert as_numpy(ja[0]).dtype == np.float32


def test_a_variable_dataset_at_a_url_equals_local(raw_path, tmp_path):
    """A URL (here a file:// store) of variable-size images is cached whole, then served as the local copy."""
    pytest.importorskip("obstore", reason="the remote extra (tbl-loader[remote]) is not installed")
    from tbl_loader import upload_dataset

    url = (tmp_path / "store").resolve().as_uri() + "/raw/"
    upload_dataset(raw_path, url, storage_options={"mkdir": True})
    with loader(raw_path, 8, hflip=0.5) as ld:
        ld.set_epoch(1)
        want = collect(ld)
    with loader(url, 8, hflip=0.5, cache_dir=tmp_path / "cache") as ld:
        ld.set_epoch(1)
        got = collect(ld)
        assert ld.dataset.fingerprint == tbl_format.open(raw_path).fingerprint
    for field in range(3):
        assert np.array_equal(got[field], want[field])


def test_subset_transform_and_keys_on_variable_images(raw_path, var_images):
    """rows= and transform= work on variable-size images: the subset's rows only, keys per sample, resume exact."""
    seen_keys = []

    def transform(batch):
        seen_keys.append(batch.keys.copy())
        return batch._replace(images=batch.images * 2)

    subset = range(5, 30)
    with loader(raw_path, 8, hflip=0.5, rows=subset, transform=transform) as ld:
        ld.set_epoch(1)
        got = collect(ld)
    assert sorted(got[2].tolist()) == list(subset)
    want = expected(var_images, got[2], epoch=1, hflip=0.5)
    assert np.array_equal(got[0], want * 2)
    keys = np.concatenate(seen_keys)
    assert np.array_equal(keys, order_keys(got[2], epoch=1))
    with loader(raw_path, 8, hflip=0.5, rows=subset) as first:
        first.set_epoch(1)
        head = collect(first, limit=1)
        state = first.state_dict()
    with loader(raw_path, 5, hflip=0.5, rows=subset) as resumed:
        resumed.load_state_dict(state)
        tail = collect(resumed)
    assert np.array_equal(np.concatenate([head[2], tail[2]]), got[2])
    assert np.array_equal(np.concatenate([head[0], tail[0]]) * 2, got[0])


def order_keys(ids, epoch):
    from tbl_loader.stream import sample_keys

    return sample_keys(SEED, epoch, np.asarray(ids, np.int64))


def test_the_image_and_label_leaves_are_not_fields(raw_path):
    with pytest.raises(ValueError, match="'label' is served as the batch's labels"):
        loader(raw_path, 8, fields=("label",))


FIELDS = ("caption", "score", "points", "meta", "tags", "height")


def write_raw_with_fields(path: Path, images: list[np.ndarray]) -> Path:
    """Variable-size raw images plus leaves of every kind the field rules batch: str, float, a
    variable-shape array, a fixed-shape array, an optional list, and the height column itself."""
    schema = tbl_format.Schema({"image": tbl_format.Leaf("var_array", dtype="uint8", ndim=3),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int"), "caption": tbl_format.Leaf("str"),
                                "score": tbl_format.Leaf("float"),
                                "points": tbl_format.Leaf("var_array", dtype="int32", ndim=1),
                                "meta": tbl_format.Leaf("array", dtype="float32", shape=(4,)),
                                "tags": tbl_format.Leaf("var_list", item="int", optional=True)})
    with tbl_format.Writer(path, schema, shard_rows=20) as w:
        for i, img in enumerate(images):
            w.write({"image": img, "height": img.shape[0], "width": img.shape[1], "label": i * 7,
                     "caption": f"photo {i} " + "x" * (i % 5), "score": i / 7,
                     "points": np.arange(i % 6, dtype=np.int32) * i,
                     "meta": np.array([i, i / 2, -i, 1.5], np.float32),
                     "tags": None if i % 4 == 0 else list(range(i % 3))})
    return path


def collect_fields(ld, limit=None):
    """(images, labels, indices) as collect gives them, plus every batch's fields as exact tree forms."""
    from conftest import tree_form

    imgs, labs, idx, fields = [], [], [], []
    it = iter(ld)
    while limit is None or len(imgs) < limit:
        try:
            b = next(it)
        except StopIteration:
            break
        imgs.append(as_numpy(b.images).copy())
        labs.append(as_numpy(b.labels).copy())
        idx.append(as_numpy(b.indices).copy())
        for k in range(len(b.indices)):  # per sample, so that batch size does not matter
            fields.append(tuple(tree_form(_row(b.fields[p], k)) for p in FIELDS))
    del it
    return np.concatenate(imgs), np.concatenate(labs), np.concatenate(idx), fields


def _row(value, k):
    """Sample k of a batched field value (an array's row, a list's item, a Padded's trimmed row)."""
    from tbl_loader import Masked, Padded

    if isinstance(value, Padded):
        lengths = np.asarray(value.lengths[k]).reshape(-1)  # one length per padded axis
        return value.data[k][tuple(slice(0, int(n)) for n in lengths)]
    if isinstance(value, Masked):
        return (bool(value.present[k]), _row(value.data, k) if bool(value.present[k]) else None)
    if isinstance(value, list):
        return value[k]
    return np.asarray(value)[k]


@pytest.mark.parametrize("var", ["list", "pad"])
def test_fields_on_variable_images_are_the_pytree_batch_every_way(tmp_path, var_images, var):
    """fields= on variable-size images: the pytree batch of those rows, and the same stream with prefetch
    on/off, 1 and 2 threads, batch 7 and 64, resumed and straight (np.array_equal on every element)."""
    from tbl_loader import PyTreeDataset

    if not PER_SAMPLE:
        pytest.skip("needs tbl-kernels 0.2")
    path = write_raw_with_fields(tmp_path / "fields", var_images)
    runs = []
    for batch, prefetch, threads in [(7, 0, 1), (64, 2, 2), (7, 3, 2)]:
        with loader(path, batch, hflip=0.5, prefetch=prefetch, num_threads=threads, fields=FIELDS, var=var) as ld:
            ld.set_epoch(1)
            runs.append(collect_fields(ld))
    first = loader(path, 7, hflip=0.5, fields=FIELDS, var=var)
    first.set_epoch(1)
    head = collect_fields(first, limit=3)
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    with loader(path, 64, hflip=0.5, prefetch=0, fields=FIELDS, var=var) as resumed:
        resumed.load_state_dict(state)
        tail = collect_fields(resumed)
    runs.append((*(np.concatenate([a, b]) for a, b in zip(head[:3], tail[:3], strict=True)), head[3] + tail[3]))
    for other in runs[1:]:
        for field in range(3):
            assert np.array_equal(runs[0][field], other[field])
        assert other[3] == runs[0][3]
    images, labels, ids, fields = runs[0]
    assert np.array_equal(images, expected(var_images, ids, epoch=1, hflip=0.5))
    assert np.array_equal(labels, ids * 7)
    # each sample's fields are its own row's values, as the pytree loader batches them
    with PyTreeDataset(path, var=var) as ref:
        want = ref.get_batch(ids)
    from conftest import tree_form

    for k in range(len(ids)):
        assert fields[k] == tuple(tree_form(_row(_leaf(want, p), k)) for p in FIELDS)


def _leaf(tree, path):
    for part in path.split("/"):
        tree = tree[part]
    return tree


def test_block_shuffle_serves_variable_jpeg_datasets(jpeg_data, var_images):
    """shuffle="block" on JPEG storage of variable size: the block order, each sample's exact pixels, and two
    ranks that split it."""
    path, blobs = jpeg_data
    rows = tbl_format.open(path).segment_rows
    assert len(rows) > 1  # several shards, so the blocks are real
    with loader(path, 8, hflip=0.5, shuffle="block", block_window=2) as ld:
        ld.set_epoch(2)
        got, labels, ids = collect(ld)
    assert np.array_equal(ids, order.block_permutation(rows, SEED, 2, 2))
    assert np.array_equal(got, expected(var_images, ids, epoch=2, hflip=0.5, decode=decoder(blobs)))
    assert np.array_equal(labels, ids * 7)
    split = []
    for rank in range(2):
        with loader(path, 8, hflip=0.5, shuffle="block", block_window=2, rank=rank, world_size=2,
                    padding="drop") as ld:
            ld.set_epoch(2)
            split.append(collect(ld)[2])
    assert np.array_equal(np.sort(np.concatenate(split)), np.sort(ids[: 2 * (N // 2)]))


def test_a_shard_is_opened_once_however_many_shards_a_batch_touches(tmp_path, var_images, monkeypatch):
    """More shards than tbl_format's default bound on open shards, read in the global order: each shard is
    opened (its header parsed) once, not again batch after batch; the stream is the exact one."""
    if not PER_SAMPLE:
        pytest.skip(f"tbl-kernels {tbl_kernels.__version__} has no crop_resize_images (0.2 has)")
    images = (var_images * 4)[: tbl_format.DEFAULT_MAX_OPEN + 6]
    path = write_raw(tmp_path / "many", images, shard_rows=1)
    opened = []
    real = tbl_format.dataset.Dataset._open_shard
    monkeypatch.setattr(tbl_format.dataset.Dataset, "_open_shard", lambda self, k: (opened.append(k), real(self, k))[1])
    with loader(path, batch_size=16, shuffle=True, dtype="uint8", layout="HWC") as ld:
        for epoch in range(2):
            ld.set_epoch(epoch)
            for b in ld:
                ids = np.asarray(b.indices)
                assert np.array_equal(b.images, expected(images, ids, epoch=epoch, dtype="uint8", layout="HWC"))
    assert sorted(opened) == list(range(len(images)))
