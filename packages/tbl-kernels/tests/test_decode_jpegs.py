"""decode_crop_resize_jpegs / decode_resize_crop_jpegs: JPEG decode of the region a box needs, at its DCT scale,
inside the batch pass; exact against decoding the whole image with the same library at the same scale, then
the numpy reference. Hostile bytes come back as JpegError naming the buffer, never as a crash."""

import functools
import io
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tbl_kernels as tk
from tbl_kernels import reference as ref

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

MEAN3, STD3 = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DTYPES = [(None, np.uint8), ("float32", np.float32), ("float16", np.float16), ("bfloat16", np.uint16)]

# Every kind of JPEG the decode must serve: chroma subsampling 4:2:0 / 4:2:2 / 4:4:4, greyscale, progressive
# (which cannot skip: every scan is read before the first row), restart markers (every MCU, every row).
KINDS = {
    "420": dict(quality=90),
    "422": dict(quality=90, subsampling=1),
    "444": dict(quality=95, subsampling=0),
    "grey": dict(quality=90, mode="L"),
    "progressive": dict(quality=90, progressive=True),
    "progressive_grey": dict(quality=85, progressive=True, mode="L"),
    "restart_blocks": dict(quality=90, restart_marker_blocks=1),
    "restart_rows": dict(quality=90, restart_marker_rows=1, subsampling=0),
}
SIZES = [(37, 53), (256, 211), (120, 200), (17, 9), (1, 1), (8, 8), (64, 1)]


def photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A smooth image with noise: gradients (so chroma upsampling matters) plus texture."""
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), ((x + 2 * y) * 5) % 256], -1)
    return (img + rng.integers(-40, 41, img.shape)).clip(0, 255).astype(np.uint8)


def encode(img: np.ndarray, kind: str) -> bytes:
    options = dict(KINDS[kind])
    mode = options.pop("mode", "RGB")
    buf = io.BytesIO()
    Image.fromarray(img).convert(mode).save(buf, "JPEG", **options)
    return buf.getvalue()


@functools.cache
def all_jpegs():
    """{kind: [(bytes, (H, W)), ...]} over SIZES."""
    rng = np.random.default_rng(38)
    return {kind: [(encode(photo(rng, h, w), kind), (h, w)) for h, w in SIZES] for kind in KINDS}


@pytest.fixture
def jpegs():
    return all_jpegs()


def boxes_for(rng, sizes):
    """Boxes inside each size: random ones, the whole image, 1-pixel boxes and boxes on each edge."""
    rows = []
    for b, (h, w) in enumerate(sizes):
        pick = b % 5
        if pick == 0:
            bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
            rows.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
        elif pick == 1:
            rows.append((0, 0, h, w))
        elif pick == 2:
            rows.append((int(rng.integers(0, h)), int(rng.integers(0, w)), 1, 1))
        elif pick == 3:  # bottom-right corner
            bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
            rows.append((h - bh, w - bw, bh, bw))
        else:  # left edge, from the top
            rows.append((0, 0, int(rng.integers(1, h + 1)), max(1, w // 3)))
    return np.array(rows, np.int32)


def batch_of(jpegs, kinds, rng, n):
    items = [jpegs[k][int(rng.integers(0, len(SIZES)))] for k in (kinds[i % len(kinds)] for i in range(n))]
    buffers = [data for data, _ in items]
    sizes = np.array([size for _, size in items], np.int64).reshape(-1, 2)
    return buffers, sizes


def make_out(b, oh, ow, layout, dtype):
    return np.zeros((b, 3, oh, ow) if layout == "CHW" else (b, oh, ow, 3), dtype)


# ---------------------------------------------------------------- the decoded region


@pytest.mark.parametrize("kind", list(KINDS))
def test_region_equals_whole_decode(jpegs, kind):
    """Cropping columns (jpeg_crop_scanline) and skipping rows (jpeg_skip_scanlines) changes no pixel: any region
    equals the same region of the whole image decoded at the same scale, at every scale."""
    rng = np.random.default_rng(zlib.crc32(kind.encode()))
    for data, (h, w) in jpegs[kind]:
        for k in (1, 2, 4, 8):
            whole = tk.decode_jpeg_region(data, (h, w), k)
            assert whole.shape == (-(-h // k), -(-w // k), 3)
            hd, wd = whole.shape[:2]
            for _ in range(12):
                top, left = int(rng.integers(0, hd)), int(rng.integers(0, wd))
                rh, rw = int(rng.integers(1, hd - top + 1)), int(rng.integers(1, wd - left + 1))
                region = tk.decode_jpeg_region(data, (h, w), k, (top, left, rh, rw))
                assert np.array_equal(region, whole[top : top + rh, left : left + rw]), (h, w, k, (top, left, rh, rw))


def test_grey_is_expanded_to_rgb(jpegs):
    data, (h, w) = jpegs["grey"][1]
    image = tk.decode_jpeg_region(data, (h, w))
    assert np.array_equal(image[..., 0], image[..., 1]) and np.array_equal(image[..., 0], image[..., 2])
    assert np.array_equal(image[..., 0], np.asarray(Image.open(io.BytesIO(data))))


@pytest.mark.parametrize("kind", ["420", "444", "grey", "progressive", "restart_blocks"])
def test_whole_decode_equals_simplejpeg(jpegs, kind):
    """The thread-pool path decodes with simplejpeg (its own libjpeg-turbo): at every DCT scale the pixels are
    the ones the kernels' libjpeg-turbo gives, so both serving paths give the same batches.

    Except on images a few pixels wide or high: simplejpeg is asked for at least ``ceil(H / k) x ceil(W / k)``
    and takes the smallest libjpeg-turbo scale that reaches it, which there may be smaller than 1/k (a 1 x 1
    image is 1 x 1 at every scale), and another scale's IDCT gives other pixels."""
    sj = pytest.importorskip("simplejpeg")
    for data, (h, w) in jpegs[kind]:
        if min(h, w) < 16:
            continue
        for k in (1, 2, 4, 8):
            kw = {} if k == 1 else dict(min_height=-(-h // k), min_width=-(-w // k))
            for fast in (False, True):
                expected = sj.decode_jpeg(data, "RGB", fastdct=fast, strict=True, **kw)
                got = tk.decode_jpeg_region(data, (h, w), k, dct="fast" if fast else "accurate")
                assert np.array_equal(got, expected), (kind, h, w, k, fast)


def test_header():
    img = photo(np.random.default_rng(1), 40, 30)
    assert tk.jpeg_header(encode(img, "420")) == (40, 30, 3, 8, False)
    assert tk.jpeg_header(encode(img, "progressive_grey")) == (40, 30, 1, 8, True)
    assert tk.jpeg_decoder()["name"] == "libjpeg-turbo"


# ---------------------------------------------------------------- the batch call against the reference


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("table_dtype,out_dtype", DTYPES)
def test_matches_reference(jpegs, simd, threads, layout, table_dtype, out_dtype):
    rng = np.random.default_rng(zlib.crc32(repr((layout, table_dtype, threads, simd)).encode()))
    table = tk.normalization_table(MEAN3, STD3, table_dtype) if table_dtype else None
    for oh, ow in [(7, 5), (16, 16), (3, 2)]:  # small outputs: every DCT scale is reached
        buffers, sizes = batch_of(jpegs, list(KINDS), rng, 24)
        boxes = boxes_for(rng, sizes.tolist())
        flip = rng.integers(0, 2, len(buffers)).astype(np.uint8)
        out = make_out(len(buffers), oh, ow, layout, out_dtype)
        tk.decode_crop_resize_jpegs(buffers, sizes, boxes, out, table, flip, layout)
        expected = ref.decode_crop_resize_jpegs(buffers, sizes, boxes, make_out(len(buffers), oh, ow, layout, out_dtype),
                                                table, flip, layout, decode=tk.decode_jpeg_region)
        assert np.array_equal(out, expected), (oh, ow)


def test_scales_reached(jpegs):
    """The boxes of test_matches_reference reach every DCT scale (and the rule is the reference's)."""
    rng = np.random.default_rng(5)
    seen = set()
    for oh, ow in [(7, 5), (16, 16), (3, 2)]:
        buffers, sizes = batch_of(jpegs, list(KINDS), rng, 24)
        for bh, bw in boxes_for(rng, sizes.tolist())[:, 2:].tolist():
            seen.add(ref.jpeg_dct_scale(bh, bw, oh, ow))
    assert seen == {1, 2, 4, 8}


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("table_dtype,out_dtype", DTYPES)
def test_windows_match_reference(jpegs, simd, threads, layout, table_dtype, out_dtype):
    rng = np.random.default_rng(zlib.crc32(repr(("w", layout, table_dtype, threads, simd)).encode()))
    table = tk.normalization_table(MEAN3, STD3, table_dtype) if table_dtype else None
    for oh, ow in [(7, 5), (16, 16)]:
        buffers, sizes = batch_of(jpegs, list(KINDS), rng, 20)
        windows = []
        for h, w in sizes.tolist():  # fractional windows inside the image, some at the edges
            wh, ww = rng.uniform(0.5, h), rng.uniform(0.5, w)
            top = rng.choice([0.0, h - wh, rng.uniform(0, h - wh)])
            left = rng.choice([0.0, w - ww, rng.uniform(0, w - ww)])
            windows.append((top, left, wh, ww))
        windows = np.array(windows, np.float64)
        flip = rng.integers(0, 2, len(buffers)).astype(bool)
        out = make_out(len(buffers), oh, ow, layout, out_dtype)
        tk.decode_resize_crop_jpegs(buffers, sizes, windows, out, table, flip, layout)
        expected = ref.decode_resize_crop_jpegs(buffers, sizes, windows,
                                                make_out(len(buffers), oh, ow, layout, out_dtype), table, flip, layout,
                                                decode=tk.decode_jpeg_region)
        assert np.array_equal(out, expected), (oh, ow)


def test_fast_idct_matches_reference(jpegs):
    rng = np.random.default_rng(9)
    buffers, sizes = batch_of(jpegs, ["420", "444", "progressive"], rng, 18)
    boxes = boxes_for(rng, sizes.tolist())
    out = make_out(len(buffers), 6, 6, "HWC", np.uint8)
    tk.decode_crop_resize_jpegs(buffers, sizes, boxes, out, dct="fast")

    def fast(data, size, k):
        return tk.decode_jpeg_region(data, size, k, dct="fast")

    expected = ref.decode_crop_resize_jpegs(buffers, sizes, boxes, make_out(len(buffers), 6, 6, "HWC", np.uint8),
                                            decode=fast)
    assert np.array_equal(out, expected)
    accurate = make_out(len(buffers), 6, 6, "HWC", np.uint8)
    tk.decode_crop_resize_jpegs(buffers, sizes, boxes, accurate)
    assert not np.array_equal(out, accurate)  # the fast IDCT is other pixels


def test_equals_crop_resize_of_whole_decode(jpegs):
    """At scale 1 (boxes smaller than twice the output) the call is crop_resize_images on the decoded image."""
    rng = np.random.default_rng(3)
    buffers, sizes = batch_of(jpegs, ["420", "restart_rows"], rng, 10)
    boxes = boxes_for(rng, sizes.tolist())
    oh = ow = 2 * 256  # no box is twice this: scale 1
    out = make_out(len(buffers), oh, ow, "HWC", np.uint8)
    tk.decode_crop_resize_jpegs(buffers, sizes, boxes, out)
    images = [tk.decode_jpeg_region(d, tuple(s)) for d, s in zip(buffers, sizes.tolist(), strict=True)]
    expected = make_out(len(buffers), oh, ow, "HWC", np.uint8)
    tk.crop_resize_images(images, boxes, expected)
    assert np.array_equal(out, expected)


def test_buffers_of_any_bytes_type(jpegs):
    data, (h, w) = jpegs["420"][1]
    outs = []
    for buf in (data, memoryview(data), bytearray(data), np.frombuffer(data, np.uint8)):
        out = make_out(1, 8, 8, "HWC", np.uint8)
        tk.decode_crop_resize_jpegs([buf], np.array([[h, w]], np.int64), np.array([[0, 0, h, w]], np.int32), out)
        outs.append(out)
    assert all(np.array_equal(o, outs[0]) for o in outs)


def test_empty_batch():
    out = make_out(0, 4, 4, "CHW", np.float32)
    tk.decode_crop_resize_jpegs([], np.zeros((0, 2), np.int64), np.zeros((0, 4), np.int32), out,
                                tk.normalization_table(MEAN3, STD3))


# ---------------------------------------------------------------- refusals


def one(data, size, box=None, out=None):
    h, w = size
    box = np.array([box or (0, 0, h, w)], np.int32)
    out = make_out(1, 8, 8, "HWC", np.uint8) if out is None else out
    tk.decode_crop_resize_jpegs([data], np.array([size], np.int64), box, out, layout="HWC")
    return out


def sof(data: bytes) -> int:
    for marker in (b"\xff\xc0", b"\xff\xc2"):
        k = data.find(marker)
        if k >= 0:
            return k + 2
    raise AssertionError("no SOF")


def with_size(data: bytes, h: int, w: int) -> bytes:
    k = sof(data)
    b = bytearray(data)
    b[k + 3 : k + 7] = bytes([h >> 8, h & 255, w >> 8, w & 255])
    return bytes(b)


def test_size_lie_is_refused_by_name(jpegs):
    data, (h, w) = jpegs["420"][1]
    with pytest.raises(tk.JpegError, match=rf"buffers\[0\]: the JPEG header says {h} x {w}, the declared size is "
                                           rf"{h} x {w + 1}") as e:
        one(data, (h, w + 1), (0, 0, h, w))
    assert (e.value.index, e.value.kind) == (0, "size")
    assert isinstance(e.value, ValueError)


def test_bomb_declared_small_is_refused_before_allocation(jpegs):
    """A header claiming 65000 x 65000 over a row declared 256 x 211 is refused from its header."""
    data, (h, w) = jpegs["420"][1]
    with pytest.raises(tk.JpegError, match="header says 65000 x 65000") as e:
        one(with_size(data, 65000, 65000), (h, w))
    assert e.value.kind == "size"


def test_lowest_failing_buffer_is_named(jpegs, threads):
    good, (h, w) = jpegs["420"][1]
    bad = good[: len(good) // 2]
    buffers = [good, good, bad, good, b"not a jpeg", good]
    sizes = np.array([(h, w)] * 6, np.int64)
    boxes = np.array([(0, 0, h, w)] * 6, np.int32)
    out = make_out(6, 8, 8, "CHW", np.uint8)
    with pytest.raises(tk.JpegError, match=r"^buffers\[2\]: ") as e:
        tk.decode_crop_resize_jpegs(buffers, sizes, boxes, out)
    assert (e.value.index, e.value.kind) == (2, "corrupt")
    expected = ref.decode_crop_resize_jpegs([good], sizes[:1], boxes[:1], make_out(1, 8, 8, "CHW", np.uint8),
                                            decode=tk.decode_jpeg_region)
    assert np.array_equal(out[0], expected[0]) and np.array_equal(out[5], expected[0])  # the others are written


def test_cmyk_is_refused_by_name():
    img = photo(np.random.default_rng(2), 32, 32)
    buf = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(buf, "JPEG")
    with pytest.raises(tk.JpegError, match=r"4 colour components \((CMYK|YCCK)\)") as e:
        one(buf.getvalue(), (32, 32))
    assert e.value.kind == "unsupported"


def test_twelve_bit_is_refused_by_name(jpegs):
    data, (h, w) = jpegs["420"][1]
    k = sof(data)
    b = bytearray(data)
    b[k + 2] = 12
    with pytest.raises(tk.JpegError, match="precision 12") as e:
        one(bytes(b), (h, w))
    assert e.value.kind == "unsupported"


@pytest.mark.parametrize("cut", [0, 1, 2, 10, 100, 400, -2])
def test_truncated_is_refused(jpegs, cut):
    data, (h, w) = jpegs["progressive"][1]
    with pytest.raises(tk.JpegError) as e:
        one(data[:cut], (h, w))
    assert e.value.kind == "corrupt"


def test_damage_below_the_box_is_not_read(jpegs):
    """Rows below the box are never decoded: bytes damaged there do not stop the box from being served (a
    whole-image decode refuses the JPEG). A JPEG cut short is still refused, from its missing end marker."""
    data, (h, w) = jpegs["restart_rows"][1]
    damaged = bytearray(data)
    for k in range(len(data) - 40, len(data) - 20):  # scan data of the last MCU rows (no 0xFF written)
        damaged[k] = 0x55
    out = one(bytes(damaged), (h, w), (0, 0, 16, 16))
    assert np.array_equal(out, one(data, (h, w), (0, 0, 16, 16)))
    cut = data[: int(len(data) * 0.8)]
    with pytest.raises(tk.JpegError, match="no end-of-image marker after the scan data: the JPEG is truncated"):
        one(cut, (h, w), (0, 0, 16, 16))


def test_argument_errors(jpegs):
    data, (h, w) = jpegs["420"][1]
    sizes = np.array([(h, w)], np.int64)
    out = make_out(1, 8, 8, "HWC", np.uint8)
    with pytest.raises(IndexError, match="not inside"):
        tk.decode_crop_resize_jpegs([data], sizes, np.array([(0, 0, h + 1, w)], np.int32), out)
    with pytest.raises(ValueError, match="empty"):
        tk.decode_crop_resize_jpegs([data], sizes, np.array([(0, 0, 0, w)], np.int32), out)
    with pytest.raises(TypeError, match="sizes"):
        tk.decode_crop_resize_jpegs([data], sizes.astype(np.int32), np.array([(0, 0, h, w)], np.int32), out)
    with pytest.raises(ValueError, match="not a JPEG image size"):
        tk.decode_crop_resize_jpegs([data], np.array([(0, w)], np.int64), np.array([(0, 0, 1, 1)], np.int32), out)
    with pytest.raises(ValueError, match="dct must be"):
        tk.decode_crop_resize_jpegs([data], sizes, np.array([(0, 0, h, w)], np.int32), out, dct="slow")
    with pytest.raises(IndexError, match="not inside"):
        tk.decode_jpeg_region(data, (h, w), 2, (0, 0, -(-h // 2) + 1, 1))
    with pytest.raises(ValueError, match="scale must be"):
        tk.decode_jpeg_region(data, (h, w), 3)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 12), kind=st.sampled_from(sorted(KINDS)),
       scale_out=st.sampled_from([(8, 8), (3, 3), (64, 64)]))
def test_bit_flips_never_crash(seed, flips, kind, scale_out):
    """Random bytes of a JPEG changed: served or refused with JpegError (or a size refusal), never a crash."""
    rng = np.random.default_rng(seed)
    data, (h, w) = all_jpegs()[kind][int(rng.integers(0, len(SIZES)))]
    b = bytearray(data)
    for _ in range(flips):
        b[int(rng.integers(0, len(b)))] = int(rng.integers(0, 256))
    bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
    box = (int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw)
    out = make_out(1, *scale_out, "HWC", np.uint8)
    try:
        one(bytes(b), (h, w), box, out)
    except tk.JpegError as e:
        assert e.index == 0 and e.kind in ("size", "unsupported", "corrupt")


def test_libjpeg_simd_changes_no_pixel(jpegs, tmp_path):
    """libjpeg-turbo's own SIMD (IDCT, upsampling, colour conversion) against its C code (JSIMD_FORCENONE=1,
    read when the library starts): the same batch, in a process of its own."""
    import os
    import subprocess
    import sys

    rng = np.random.default_rng(21)
    buffers, sizes = batch_of(jpegs, list(KINDS), rng, 32)
    boxes = boxes_for(rng, sizes.tolist())
    np.save(tmp_path / "sizes.npy", sizes)
    np.save(tmp_path / "boxes.npy", boxes)
    for k, data in enumerate(buffers):
        (tmp_path / f"{k}.jpg").write_bytes(data)
    script = f"""
import numpy as np, tbl_kernels as tk
from pathlib import Path
d = Path({str(tmp_path)!r})
sizes, boxes = np.load(d / "sizes.npy"), np.load(d / "boxes.npy")
buffers = [(d / f"{{k}}.jpg").read_bytes() for k in range(len(sizes))]
out = np.zeros((len(sizes), 9, 7, 3), np.uint8)
tk.decode_crop_resize_jpegs(buffers, sizes, boxes, out, layout="HWC")
np.save(d / "out.npy", out)
"""
    run = subprocess.run([sys.executable, "-c", script], env={**os.environ, "JSIMD_FORCENONE": "1"},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = make_out(len(buffers), 9, 7, "HWC", np.uint8)
    tk.decode_crop_resize_jpegs(buffers, sizes, boxes, out, layout="HWC")
    assert np.array_equal(np.load(tmp_path / "out.npy"), out)
