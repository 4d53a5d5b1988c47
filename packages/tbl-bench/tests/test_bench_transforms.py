import numpy as np
import pytest
from PIL import Image

from tbl_bench.levels import consume_batch
from tbl_bench.peers.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    normalize_chw,
    random_resized_crop_box,
    transform_image,
)


def test_random_resized_crop_box_stays_inside():
    rng = np.random.default_rng(0)
    for w, h in [(300, 200), (50, 400), (8, 8)]:
        for _ in range(200):
            left, top, cw, ch = random_resized_crop_box(w, h, rng)
            assert 0 <= left and 0 <= top and 0 < cw and 0 < ch
            assert left + cw <= w and top + ch <= h


def test_normalize_matches_the_definition():
    a = np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    out = normalize_chw(Image.fromarray(a))
    ref = ((a / 255 - np.array(IMAGENET_MEAN)) / np.array(IMAGENET_STD)).transpose(2, 0, 1)
    assert out.shape == (3, 5, 7) and out.dtype == np.float32
    assert np.allclose(out, ref, atol=1e-5)


def test_transform_image_shapes_and_bad_aug():
    img = Image.fromarray(np.zeros((40, 60, 3), np.uint8))
    rng = np.random.default_rng(0)
    for aug in ("plain", "flip", "crop"):
        assert transform_image(img, 16, aug, rng).shape == (3, 16, 16)
    with pytest.raises(ValueError, match="aug"):
        transform_image(img, 16, "rotate", rng)


def test_levels():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert consume_batch(x, "produce") == 0.0
    assert consume_batch(x, "consume") == 66.0
    with pytest.raises(ValueError, match="level"):
        consume_batch(x, "devour")
