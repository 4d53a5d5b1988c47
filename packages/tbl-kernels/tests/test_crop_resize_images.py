"""crop_resize_images: one image of its own size per output sample (heap-stored variable-size images)."""

import zlib

import numpy as np
import pytest
from conftest import all_values_images

import tbl_kernels as tk
from tbl_kernels import reference as ref

MEAN3, STD3 = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
DTYPES = [(None, np.uint8), ("float32", np.float32), ("float16", np.float16), ("bfloat16", np.uint16)]


def _heap_images(rng, sizes, c):
    """Images of the given (h, w) sizes as consecutive views into one uint8 heap, as a file stores them."""
    parts = [all_values_images(rng, 1, h, w, c)[0] if h * w >= 256 else
             rng.integers(0, 256, size=(h, w, c), dtype=np.uint8) for h, w in sizes]
    heap = np.concatenate([p.reshape(-1) for p in parts])
    views, start = [], 0
    for (h, w), p in zip(sizes, parts, strict=True):
        views.append(heap[start : start + p.size].reshape(h, w, c))
        start += p.size
    return views


def _boxes_inside(rng, sizes):
    rows = []
    for h, w in sizes:
        bh, bw = int(rng.integers(1, h + 1)), int(rng.integers(1, w + 1))
        rows.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    return np.array(rows, np.int32)


@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("table_dtype,out_dtype", DTYPES)
def test_matches_reference(simd, threads, c, layout, table_dtype, out_dtype):
    rng = np.random.default_rng(zlib.crc32(repr((c, layout, table_dtype, threads)).encode()))
    sizes = [(int(rng.integers(1, 60)), int(rng.integers(1, 61))) for _ in range(9)]
    sizes[0], sizes[1] = (17, 300), (300, 17)  # tall and wide
    images = _heap_images(rng, sizes, c)
    boxes = _boxes_inside(rng, sizes)
    boxes[2] = (0, 0, *sizes[2])  # a whole image
    table = None if table_dtype is None else tk.normalization_table(MEAN3[:c], STD3[:c], table_dtype)
    flip = rng.integers(0, 2, size=len(sizes)).astype(np.uint8)
    for oh, ow in [(int(rng.integers(2, 50)), int(rng.integers(2, 50))), (33, 65)]:
        shape = (len(sizes), c, oh, ow) if layout == "CHW" else (len(sizes), oh, ow, c)
        out, want = np.zeros(shape, out_dtype), np.zeros(shape, out_dtype)
        tk.crop_resize_images(images, boxes, out, table=table, flip=flip, layout=layout)
        ref.crop_resize_images(images, boxes, want, table=table, flip=flip, layout=layout)
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), (oh, ow)


@pytest.mark.parametrize("table_dtype,out_dtype", DTYPES)
def test_equal_sizes_give_gather_crop_resize_bits(table_dtype, out_dtype):
    rng = np.random.default_rng(5)
    images = rng.integers(0, 256, size=(7, 48, 40, 3), dtype=np.uint8)
    idx = rng.integers(0, 7, size=12).astype(np.int64)
    boxes = _boxes_inside(rng, [(48, 40)] * 12)
    table = None if table_dtype is None else tk.normalization_table(MEAN3, STD3, table_dtype)
    flip = rng.integers(0, 2, size=12).astype(np.uint8)
    a, b = np.zeros((12, 3, 32, 32), out_dtype), np.ones((12, 3, 32, 32), out_dtype)
    tk.gather_crop_resize([images], idx, boxes, a, table=table, flip=flip)
    tk.crop_resize_images([images[i] for i in idx], boxes, b, table=table, flip=flip)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_identity_box_reads_in_place_and_copies():
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in [(30, 30), (50, 24), (24, 24)]]
    boxes = np.array([[1, 3, 24, 24], [10, 0, 24, 24], [0, 0, 24, 24]], np.int32)
    out = np.zeros((3, 24, 24, 3), np.uint8)
    tk.crop_resize_images(images, boxes, out)
    for b, (top, left, h, w) in enumerate(boxes):
        assert np.array_equal(out[b], images[b][top : top + h, left : left + w])


def test_empty_batch():
    out = np.zeros((0, 3, 8, 8), np.float32)
    tk.crop_resize_images([], np.zeros((0, 4), np.int32), out, table=tk.normalization_table(MEAN3, STD3))


def _args(rng=None):
    rng = rng or np.random.default_rng(0)
    images = [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in [(10, 20), (30, 12)]]
    return images, np.array([[0, 0, 10, 20], [0, 0, 30, 12]], np.int32), np.full((2, 3, 8, 8), 7, np.uint8)


@pytest.mark.parametrize(
    "mutate,error,match",
    [
        (lambda i, b, o: b.__setitem__((1, 0), 1), IndexError, r"boxes\[1\].*not inside the 30x12"),
        (lambda i, b, o: b.__setitem__((0, 2), 0), ValueError, r"boxes\[0\].*empty"),
        (lambda i, b, o: i.__setitem__(1, i[1][..., :1].copy()), ValueError, r"images\[1\].*channel"),
        (lambda i, b, o: i.__setitem__(0, i[0].astype(np.int16)), TypeError, r"images\[0\] has dtype int16"),
        (lambda i, b, o: i.__setitem__(0, i[0][:, ::2]), ValueError, r"images\[0\] must be C-contiguous"),
        (lambda i, b, o: i.__setitem__(0, i[0][0]), ValueError, r"images\[0\] has shape"),
        (lambda i, b, o: i.pop(), ValueError, r"len\(images\)"),
    ],
)
def test_bad_arguments_raise_named_errors_and_write_nothing(mutate, error, match):
    images, boxes, out = _args()
    mutate(images, boxes, out)
    with pytest.raises(error, match=match):
        tk.crop_resize_images(images, boxes, out)
    assert (out == 7).all()


def test_out_overlapping_an_image_is_refused():
    heap = np.zeros(4 * 3 * 8 * 8 + 20 * 20 * 3, np.uint8)
    out = heap[: 4 * 3 * 8 * 8].reshape(4, 3, 8, 8)
    images = [heap[100 : 100 + 10 * 10 * 3].reshape(10, 10, 3)] * 4
    with pytest.raises(ValueError, match=r"out overlaps images\[0\]"):
        tk.crop_resize_images(images, np.array([[0, 0, 10, 10]] * 4, np.int32), out)


def test_images_must_be_a_list():
    images, boxes, out = _args()
    with pytest.raises(TypeError, match="images must be a list"):
        tk.crop_resize_images(np.stack([images[0], images[0]]), boxes, out)
