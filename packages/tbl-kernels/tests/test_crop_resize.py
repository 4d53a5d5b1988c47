import zlib

import numpy as np
import pytest
from conftest import all_values_images, split_sources

import tbl_kernels as tk
from tbl_kernels import reference as ref

MEAN3, STD3 = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _random_boxes(rng, b, h, w):
    hh = rng.integers(1, h + 1, size=b)
    ww = rng.integers(1, w + 1, size=b)
    top = rng.integers(0, h - hh + 1)
    left = rng.integers(0, w - ww + 1)
    return np.stack([top, left, hh, ww], axis=1).astype(np.int32)


@pytest.mark.parametrize("c", [1, 3])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize(
    "table_dtype,out_dtype",
    [(None, np.uint8), ("float32", np.float32), ("float16", np.float16), ("bfloat16", np.uint16)],
)
def test_crop_resize_matches_reference(simd, threads, c, layout, table_dtype, out_dtype):
    rng = np.random.default_rng(zlib.crc32(repr((c, layout, table_dtype, threads)).encode()))
    h, w = int(rng.integers(16, 40)), int(rng.integers(16, 41)) | 1
    images = all_values_images(rng, 6, h, w, c)
    sources = split_sources(images, rng)
    b = 8
    idx = rng.integers(0, len(images), size=b).astype(np.int64)
    boxes = _random_boxes(rng, b, h, w)
    boxes[0] = (0, 0, h, w)  # whole image
    boxes[1, 2:] = 1  # single pixel
    table = None if table_dtype is None else tk.normalization_table(MEAN3[:c], STD3[:c], table_dtype)
    flip = rng.integers(0, 2, size=b).astype(np.uint8)
    for oh, ow in [(int(rng.integers(1, 50)), int(rng.integers(1, 50))), (h // 3 + 1, w * 2 + 1)]:
        shape = (b, c, oh, ow) if layout == "CHW" else (b, oh, ow, c)
        if layout is not None and oh == c and ow == c:
            continue
        out, want = np.zeros(shape, out_dtype), np.zeros(shape, out_dtype)
        tk.gather_crop_resize(sources, idx, boxes, out, table=table, flip=flip, layout=layout)
        ref.gather_crop_resize(sources, idx, boxes, want, table=table, flip=flip, layout=layout)
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8)), (oh, ow)


def test_crop_resize_large_downscale_and_upscale():
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, size=(2, 256, 256, 3), dtype=np.uint8)
    boxes = np.array([[0, 0, 256, 256], [100, 17, 30, 200]], np.int32)
    for oh, ow in [(7, 9), (224, 224), (300, 31)]:
        out, want = np.zeros((2, oh, ow, 3), np.uint8), np.zeros((2, oh, ow, 3), np.uint8)
        tk.gather_crop_resize([images], np.array([0, 1]), boxes, out, layout="HWC")
        ref.gather_crop_resize([images], np.array([0, 1]), boxes, want, layout="HWC")
        assert np.array_equal(out, want)


@pytest.mark.parametrize("c", [1, 3])
def test_crop_resize_row_lengths_around_vector_blocks(simd, c):
    # The avx2 resampler handles 32 bytes per step and pairs of taps, then a scalar
    # tail: sweep row lengths across block edges, and tap counts odd and even.
    rng = np.random.default_rng(c)
    images = rng.integers(0, 256, size=(3, 70, 70, c), dtype=np.uint8)
    for oh, ow in [(31, 32), (32, 33), (11, 64), (65, 10), (5, 3), (70, 17)]:
        for box in [(0, 0, 70, 70), (3, 5, 33, 64), (10, 1, 16, 31), (0, 0, 69, 3)]:
            boxes = np.array([box, box], np.int32)
            out, want = np.zeros((2, oh, ow, c), np.uint8), np.zeros((2, oh, ow, c), np.uint8)
            tk.gather_crop_resize([images], np.array([2, 0]), boxes, out, layout="HWC")
            ref.gather_crop_resize([images], np.array([2, 0]), boxes, want, layout="HWC")
            assert np.array_equal(out, want), (oh, ow, box)


def test_identity_box_is_a_copy():
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, size=(3, 19, 23, 3), dtype=np.uint8)
    out = np.zeros((3, 19, 23, 3), np.uint8)
    tk.gather_crop_resize(
        [images], np.array([2, 0, 1]), np.array([[0, 0, 19, 23]] * 3, np.int32), out, layout="HWC"
    )
    assert np.array_equal(out, images[[2, 0, 1]])


def test_close_to_pillow_bilinear():
    # Same filter family as Pillow's antialiased BILINEAR; the fixed-point precision
    # and the pass order differ, so values may differ by a rounding step.
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(5)
    img = rng.integers(0, 256, size=(64, 80, 3), dtype=np.uint8)
    for oh, ow in [(32, 40), (100, 120), (23, 77)]:
        pil = np.asarray(Image.fromarray(img).resize((ow, oh), Image.BILINEAR))
        ours = ref.crop_resize_u8(img, (0, 0, 64, 80), oh, ow)
        assert np.abs(pil.astype(int) - ours).max() <= 2


def test_weights_sum_to_one_and_stay_inside():
    for n_in, n_out in [(1, 1), (1, 5), (5, 1), (256, 224), (224, 256), (1000, 3), (7, 1000)]:
        m = ref.resample_matrix(n_in, n_out)
        assert m.shape == (n_out, n_in) and (m >= 0).all()
        assert np.abs(m.sum(axis=1) - (1 << ref.PRECISION_BITS)).max() <= m.shape[1]
