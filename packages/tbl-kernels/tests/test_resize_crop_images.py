"""resize_crop_images: fractional windows, taps on the whole image (resize the whole image, then crop)."""

import zlib

import numpy as np
import pytest
from conftest import all_values_images

import tbl_kernels as tk
from tbl_kernels import reference as ref

MEAN3, STD3 = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DTYPES = [(None, np.uint8), ("float32", np.float32), ("float16", np.float16), ("bfloat16", np.uint16)]


def _images(rng, sizes, c):
    """Images of the given (h, w) sizes as consecutive views into one uint8 heap, as a file stores them."""
    parts = [all_values_images(rng, 1, h, w, c)[0] if h * w >= 256 else
             rng.integers(0, 256, size=(h, w, c), dtype=np.uint8) for h, w in sizes]
    heap = np.concatenate([p.reshape(-1) for p in parts])
    views, start = [], 0
    for (h, w), p in zip(sizes, parts, strict=True):
        views.append(heap[start : start + p.size].reshape(h, w, c))
        start += p.size
    return views


def _windows_inside(rng, sizes):
    """Fractional windows inside each image: tiny (upsampling) to whole (downsampling), some touching an edge."""
    rows = []
    for k, (h, w) in enumerate(sizes):
        wh, ww = rng.uniform(0.05, 1.0) * h, rng.uniform(0.05, 1.0) * w
        top, left = rng.uniform(0, h - wh), rng.uniform(0, w - ww)
        if k % 3 == 1:  # flush with the bottom-right edge (an ulp inside where float64 rounds past it)
            top, left = h - wh, w - ww
            top = np.nextafter(top, 0.0) if top + wh > h else top
            left = np.nextafter(left, 0.0) if left + ww > w else left
        rows.append((top, left, wh, ww))
    return np.array(rows, np.float64)


@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("table_dtype,out_dtype", DTYPES)
def test_matches_reference(simd, threads, c, layout, table_dtype, out_dtype):
    rng = np.random.default_rng(zlib.crc32(repr(("resize-crop", c, layout, table_dtype, threads)).encode()))
    sizes = [(int(rng.integers(1, 60)), int(rng.integers(1, 61))) for _ in range(9)]
    sizes[0], sizes[1], sizes[3] = (17, 300), (300, 17), (40, 30)  # tall, wide, and room for windows[3]
    images = _images(rng, sizes, c)
    windows = _windows_inside(rng, sizes)
    windows[2] = (0.0, 0.0, *sizes[2])  # a whole image
    windows[3] = (1.0, 2.0, sizes[3][0] - 1.0, sizes[3][1] - 2.0)  # integer
    table = None if table_dtype is None else tk.normalization_table(MEAN3[:c], STD3[:c], table_dtype)
    flip = rng.integers(0, 2, size=len(sizes)).astype(np.uint8)
    for oh, ow in [(int(rng.integers(2, 50)), int(rng.integers(2, 50))), (33, 65), (1, 1)]:
        shape = (len(sizes), c, oh, ow) if layout == "CHW" else (len(sizes), oh, ow, c)
        out, want = np.zeros(shape, out_dtype), np.zeros(shape, out_dtype)
        tk.resize_crop_images(images, windows, out, table=table, flip=flip, layout=layout)
        ref.resize_crop_images(images, windows, want, table=table, flip=flip, layout=layout)
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), (oh, ow)


def test_whole_image_window_has_the_crop_resize_weights():
    """The window (0, 0, in) is the crop-resize rule's weights bit for bit (box0 = 0 adds nothing)."""
    for n_in, n_out in [(1, 1), (7, 3), (3, 7), (255, 224), (224, 224), (1000, 9), (9, 1000)]:
        a, b = ref.resample_weights(n_in, n_out), ref.resample_weights(n_in, n_out, 0.0, float(n_in))
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


@pytest.mark.parametrize("axis", ["height", "width"])
def test_whole_image_window_equals_the_plain_resize(simd, axis):
    """With one axis kept, pass order cannot matter: the whole-image window gives crop_resize_images' bits."""
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in [(40, 30), (17, 64), (64, 17)]]
    for image in images:
        h, w = image.shape[:2]
        for n in (5, 23, 80):
            oh, ow = (n, w) if axis == "height" else (h, n)
            got, want = np.zeros((1, oh, ow, 3), np.uint8), np.ones((1, oh, ow, 3), np.uint8)
            tk.resize_crop_images([image], np.array([[0.0, 0.0, h, w]]), got, layout="HWC")
            tk.crop_resize_images([image], np.array([[0, 0, h, w]], np.int32), want, layout="HWC")
            assert np.array_equal(got, want), (h, w, oh, ow)


def test_whole_image_window_is_horizontal_then_vertical():
    """Both axes resized: the crop-resize weights, applied horizontally first (independent matrix form)."""
    rng = np.random.default_rng(4)
    image = rng.integers(0, 256, size=(37, 53, 3), dtype=np.uint8)
    mh, mv = ref.resample_matrix(53, 24).astype(np.float64), ref.resample_matrix(37, 61).astype(np.float64)
    rnd = lambda acc: np.clip((acc.astype(np.int64) + (1 << 13)) >> 14, 0, 255)  # noqa: E731
    hpass = rnd(np.einsum("px,yxc->ypc", mh, image.astype(np.float64)))
    want = rnd(np.einsum("oy,ypc->opc", mv, hpass.astype(np.float64))).astype(np.uint8)
    got = np.zeros((1, 61, 24, 3), np.uint8)
    tk.resize_crop_images([image], np.array([[0.0, 0.0, 37.0, 53.0]]), got, layout="HWC")
    assert np.array_equal(got[0], want)


@pytest.mark.parametrize(("h", "w", "rh", "rw", "top", "left", "ch", "cw"), [
    (30, 20, 60, 40, 14, 8, 32, 24),  # upsampling by 2
    (64, 48, 32, 24, 8, 4, 16, 16),  # downsampling by 2
    (64, 48, 32, 24, 0, 0, 32, 24),  # the whole resized image
])
def test_window_is_resize_then_crop(simd, threads, h, w, rh, rw, top, left, ch, cw):
    """Exact scale factors (all float64 values exact): the window's output is the whole-image resize, cropped,
    including the taps that read outside the window."""
    rng = np.random.default_rng(h * w)
    image = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
    full = np.zeros((1, rh, rw, 3), np.uint8)
    tk.resize_crop_images([image], np.array([[0.0, 0.0, h, w]]), full, layout="HWC")
    window = np.array([[top * h / rh, left * w / rw, ch * h / rh, cw * w / rw]])
    got = np.zeros((1, ch, cw, 3), np.uint8)
    tk.resize_crop_images([image], window, got, layout="HWC")
    assert np.array_equal(got[0], full[0, top : top + ch, left : left + cw])


def test_within_one_level_of_pillow():
    """The documented rule: Pillow's resize + crop and this kernel differ by at most 1 (14- vs 22-bit coefficients)."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(6)
    for h, w, rh, rw, c in [(170, 256, 256, 385, 224), (90, 120, 64, 85, 50), (256, 200, 327, 256, 224)]:
        y, x = np.mgrid[0:h, 0:w]
        image = ((rng.integers(0, 256, (h, w, 3)) * 0.3 + 2 * y[..., None] + 3 * x[..., None]) % 256).astype(np.uint8)
        pil = np.asarray(Image.fromarray(image).resize((rw, rh), Image.BILINEAR))
        top, left = round((rh - c) / 2), round((rw - c) / 2)
        got = np.zeros((1, c, c, 3), np.uint8)
        tk.resize_crop_images([image], np.array([[top * h / rh, left * w / rw, c * h / rh, c * w / rw]]), got,
                              layout="HWC")
        diff = np.abs(got[0].astype(np.int64) - pil[top : top + c, left : left + c])
        assert diff.max() <= 1, (h, w)


def test_repeated_and_near_windows_match_the_reference(simd, threads):
    """The kernels keep each thread's window weights keyed on the exact float64 window: repeats of one window
    (the evaluation transform gives every image of a size the same one), windows that differ only in start or
    only in size, across calls and past the cache's eviction, all equal the reference."""
    rng = np.random.default_rng(7)
    sizes = [(30, 40)] * 6 + [(40, 30)] * 6
    images = _images(rng, sizes, 3)
    base = np.array([3.25, 1.5, 20.0, 26.0])
    windows = np.array([base, base, base + [1.5, 0, 0, 0], base + [0, 0, 2.0, 0], base + [0, 0.75, 0, 0],
                        base + [0, 0, 0, 1.25]] * 2, np.float64)
    windows[1, 0] = np.nextafter(windows[1, 0], 0.0)  # one ulp from windows[0]
    for _ in range(2):  # the second call reads every window from the cache
        out, want = np.zeros((12, 3, 21, 19), np.uint8), np.zeros((12, 3, 21, 19), np.uint8)
        tk.resize_crop_images(images, windows, out, layout="CHW")
        ref.resize_crop_images(images, windows, want, layout="CHW")
        assert np.array_equal(out, want)
    # Enough distinct windows (two axes each, 160 outputs per axis) to empty each thread's 8 MiB cache several
    # times; every 97th sample and the last ones are checked against the reference.
    n = 12_000
    small = _images(rng, [(8, 9)], 3) * n
    many = np.stack([rng.uniform(0, 1, n), rng.uniform(0, 1, n), rng.uniform(6, 7, n), rng.uniform(7, 8, n)], 1)
    out = np.zeros((n, 3, 160, 160), np.uint8)
    tk.resize_crop_images(small, many, out, layout="CHW")
    check = [*range(0, n, 97), *range(n - 5, n)]
    want = np.zeros((len(check), 3, 160, 160), np.uint8)
    ref.resize_crop_images([small[i] for i in check], many[check], want, layout="CHW")
    assert np.array_equal(out[check], want)


def test_empty_batch():
    out = np.zeros((0, 3, 8, 8), np.float32)
    tk.resize_crop_images([], np.zeros((0, 4)), out, table=tk.normalization_table(MEAN3, STD3))


def _args():
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in [(10, 20), (30, 12)]]
    return images, np.array([[0.0, 0.0, 10.0, 20.0], [0.5, 0.25, 29.5, 11.75]]), np.full((2, 3, 8, 8), 7, np.uint8)


def _set(row, col, value):
    return lambda i, wd, o: wd.__setitem__((row, col), value)


@pytest.mark.parametrize(
    "mutate,error,match",
    [
        (_set(1, 0, 0.75), IndexError, r"windows\[1\] = \(0.75, 0.25, 29.5, 11.75\).*not inside the 30x12"),
        (_set(1, 2, np.nextafter(29.5, 30.0)), IndexError, r"windows\[1\].*not inside"),
        (_set(0, 1, -1e-9), IndexError, r"windows\[0\].*not inside the 10x20"),
        (_set(0, 2, 0.0), ValueError, r"windows\[0\].*empty"),
        (_set(0, 3, -2.0), ValueError, r"windows\[0\].*empty"),
        (_set(1, 1, np.nan), ValueError, r"windows\[1\].*not finite"),
        (_set(1, 3, np.inf), ValueError, r"windows\[1\].*not finite"),
        (lambda i, wd, o: i.__setitem__(1, i[1][..., :1].copy()), ValueError, r"images\[1\].*channel"),
        (lambda i, wd, o: i.__setitem__(0, i[0].astype(np.int16)), TypeError, r"images\[0\] has dtype int16"),
        (lambda i, wd, o: i.pop(), ValueError, r"len\(images\)"),
    ],
)
def test_bad_arguments_raise_named_errors_and_write_nothing(mutate, error, match):
    images, windows, out = _args()
    mutate(images, windows, out)
    with pytest.raises(error, match=match):
        tk.resize_crop_images(images, windows, out)
    assert (out == 7).all()


@pytest.mark.parametrize(
    "windows,error,match",
    [
        (np.zeros((2, 4), np.float32), TypeError, r"windows must be a 2-D float64 array"),
        (np.zeros((2, 4), np.int32), TypeError, r"windows must be a 2-D float64 array"),
        (np.zeros((2, 3)), ValueError, r"windows has shape \(2, 3\)"),
        (np.zeros((3, 4)), ValueError, r"windows has shape \(3, 4\)"),
        (np.zeros((2, 8))[:, ::2], ValueError, r"windows must be C-contiguous"),
    ],
)
def test_bad_windows_array_is_refused(windows, error, match):
    images, _, out = _args()
    with pytest.raises(error, match=match):
        tk.resize_crop_images(images, windows, out)
    assert (out == 7).all()


def test_out_overlapping_an_image_is_refused():
    heap = np.zeros(4 * 3 * 8 * 8 + 20 * 20 * 3, np.uint8)
    out = heap[: 4 * 3 * 8 * 8].reshape(4, 3, 8, 8)
    images = [heap[100 : 100 + 10 * 10 * 3].reshape(10, 10, 3)] * 4
    with pytest.raises(ValueError, match=r"out overlaps images\[0\]"):
        tk.resize_crop_images(images, np.array([[0.0, 0.0, 10.0, 10.0]] * 4), out)


def test_reference_refuses_a_window_outside_the_axis():
    with pytest.raises(ValueError, match="not a non-empty part"):
        ref.resample_weights(10, 4, 2.0, 8.5)
