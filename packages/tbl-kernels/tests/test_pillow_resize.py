"""pillow_resize: Pillow's own resize, bit for bit, written as RGB into the caller's array."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tbl_kernels as tk

Image = pytest.importorskip("PIL.Image")
if not hasattr(Image.Image, "__arrow_c_array__"):
    pytest.skip("pillow_resize reads images through Arrow export (Pillow 11.2+)", allow_module_level=True)


def _pillow(img, size, resample, box):
    return np.asarray(img.resize(size, Image.Resampling(tk.PILLOW_FILTERS[resample]), box=box, reducing_gap=None))


def _ours(img, size, resample, box):
    out = np.full((size[1], size[0], 3), 7, np.uint8)  # every byte must be written
    tk.pillow_resize(img, out, resample, box)
    return out


@st.composite
def resize_cases(draw):
    w, h = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    ow, oh = draw(st.integers(1, 70)), draw(st.integers(1, 70))
    kind = draw(st.sampled_from(["whole", "fractional", "integral crop"]))
    if kind == "whole":
        box = None
    elif kind == "fractional":  # quarters are exact in float32, as Pillow takes the box
        x0, y0 = draw(st.integers(0, 4 * w - 1)) / 4, draw(st.integers(0, 4 * h - 1)) / 4
        x1, y1 = draw(st.integers(int(4 * x0) + 1, 4 * w)) / 4, draw(st.integers(int(4 * y0) + 1, 4 * h)) / 4
        box = (x0, y0, x1, y1)
    else:  # Pillow's crop shortcut: an integral box of the output's size
        x0, y0 = draw(st.integers(0, w - 1)), draw(st.integers(0, h - 1))
        ow, oh = draw(st.integers(1, w - x0)), draw(st.integers(1, h - y0))
        box = (x0, y0, x0 + ow, y0 + oh)
    return (w, h), (ow, oh), box, draw(st.sampled_from(sorted(tk.PILLOW_FILTERS))), draw(st.integers(0, 2**32 - 1))


@settings(max_examples=300, deadline=None)
@given(resize_cases())
def test_every_byte_is_pillows(case):
    (w, h), size, box, resample, seed = case
    img = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))
    for level in tk.simd_levels():
        tk.set_simd(level)
        try:
            assert np.array_equal(_ours(img, size, resample, box), _pillow(img, size, resample, box)), level
        finally:
            tk.set_simd("auto")


@pytest.mark.parametrize("in_size, out_size", [
    ((205, 189), (160, 160)),  # a draft-decoded photo to a training size: both passes, horizontal first
    ((160, 400), (160, 120)),  # height shrinks by more than twice the width (Pillow 13: vertical first)
    ((90, 300), (120, 100)),  # width grows while height shrinks
    ((300, 300), (300, 120)),  # one pass only
])
def test_photo_like_geometries_and_both_pass_orders(simd, in_size, out_size):
    rng = np.random.default_rng(3)
    # Smooth content with noise, as photos are: a near-tie in rounding is where a wrong order shows.
    yy, xx = np.mgrid[: in_size[1], : in_size[0]]
    base = (np.sin(xx / 7.0) + np.cos(yy / 11.0)) * 60 + 128
    pixels = np.clip(base[..., None] + rng.normal(0, 9, (*base.shape, 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels)
    for resample in ("bilinear", "bicubic", "lanczos"):
        assert np.array_equal(_ours(img, out_size, resample, None), _pillow(img, out_size, resample, None))


def test_the_pass_order_follows_the_installed_pillow():
    import PIL

    major = int(PIL.__version__.split(".")[0])
    # Height shrinks by 300, width by 40: more than twice as much.
    assert tk.pillow_horizontal_first((200, 400), (160, 100)) is (major < 13)
    assert tk.pillow_horizontal_first((400, 200), (100, 160)) is True
    assert tk.pillow_horizontal_first((100, 200), (300, 100)) is (major < 13)  # width grows


def test_refusals_name_the_problem():
    img = Image.fromarray(np.zeros((10, 12, 3), np.uint8))
    out = np.empty((5, 6, 3), np.uint8)
    with pytest.raises(ValueError, match="RGB"):
        tk.pillow_resize(img.convert("L"), out)
    with pytest.raises(ValueError, match="resample must be one of"):
        tk.pillow_resize(img, out, "nearest")
    with pytest.raises(ValueError, match="box can't exceed original image size"):
        tk.pillow_resize(img, out, "bilinear", (0, 0, 13, 10))
    with pytest.raises(ValueError, match="box offset can't be negative"):
        tk.pillow_resize(img, out, "bilinear", (-1, 0, 5, 5))
    with pytest.raises(ValueError, match="box can't be empty"):
        tk.pillow_resize(img, out, "bilinear", (5, 0, 4, 5))
    with pytest.raises(TypeError, match="uint8"):
        tk.pillow_resize(img, np.empty((5, 6, 3), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        tk.pillow_resize(img, np.empty((5, 12, 3), np.uint8)[:, ::2])
    with pytest.raises(ValueError, match=r"\(height, width, 3\)"):
        tk.pillow_resize(img, np.empty((5, 6, 4), np.uint8))
    with pytest.raises(TypeError, match=r"\(height, width, 3\)"):
        tk.pillow_resize(img, np.empty(90, np.uint8))


def test_an_image_pillow_keeps_in_several_blocks_is_refused_by_name():
    size = Image.core.get_block_size()
    width = 1024
    img = Image.new("RGB", (width, size // (width * 4) + 1))  # one row more than a block holds
    with pytest.raises(tk.PillowLayoutError, match="one piece"):
        tk.pillow_resize(img, np.empty((8, 8, 3), np.uint8))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_box_that_is_not_finite_is_refused(bad):
    image = Image.new("RGB", (40, 30), (10, 20, 30))
    out = np.zeros((10, 12, 3), np.uint8)
    with pytest.raises(ValueError, match="finite"):
        tk.pillow_resize(image, out, "bilinear", (0.0, bad, 20.0, 15.0))
    assert not out.any()
