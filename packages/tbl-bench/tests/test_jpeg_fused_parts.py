"""tbl_bench.jpeg_fused_parts times the parts of the fused JPEG pass on the rows of a JPEG dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tbl_format

K = pytest.importorskip("tbl_kernels")
if not hasattr(K, "decode_crop_resize_jpegs"):
    pytest.skip("these kernels have no fused JPEG decode (0.3.0 and later)", allow_module_level=True)
simplejpeg = pytest.importorskip("simplejpeg")

from tbl_bench.jpeg_fused_parts import _boxes, _enclosing_boxes, _eval_windows, main  # noqa: E402


@pytest.fixture(scope="module")
def jpeg_path(tmp_path_factory):
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int")})
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("parts") / "jpeg.tbl"
    with tbl_format.Writer(path, schema) as w:
        for i in range(12):
            h, w_ = 48 + 8 * (i % 3), 64
            img = rng.integers(0, 256, (h, w_, 3), dtype=np.uint8)
            w.write({"image": simplejpeg.encode_jpeg(img, quality=90), "height": h, "width": w_})
    return path


def test_boxes_are_inside_their_images_and_repeat_with_the_seed():
    sizes = np.array([[48, 64], [256, 192], [7, 300]], np.int64)
    boxes = _boxes(sizes, 0)
    assert np.array_equal(boxes, _boxes(sizes, 0))
    top, left, h, w = boxes.T
    assert (h >= 1).all() and (w >= 1).all()
    assert (top + h <= sizes[:, 0]).all() and (left + w <= sizes[:, 1]).all()


@pytest.mark.parametrize(("transform", "resample"), [("crop", "crop-resize"), ("eval", "resize-crop")])
def test_every_part_is_timed(jpeg_path, capsys, transform, resample):
    """RandomResizedCrop boxes through the crop-resize kernels; the evaluation windows through the resize-crop ones."""
    argv = [str(jpeg_path), "--rows", "12", "--size", "16", "--rounds", "1", "--json", "--transform", transform]
    assert main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    parts = {"simplejpeg full decode", "kernels full decode", "kernels region decode"}
    for dtype in ("uint8", "float16", "float32"):
        parts |= {f"{resample} from decoded, {dtype}", f"fused, {dtype}"}
    assert set(res) == parts
    assert all(v >= 0 for v in res.values())


def test_the_evaluation_windows_follow_torchvisions_resize_then_center_crop():
    """Resize(round(16 * 256 / 224) = 18) + CenterCrop(16): a 36 x 72 image becomes 18 x 36, cropped at
    (1, 10); in source pixels (2, 20, 32, 32). Enclosing boxes round outwards."""
    sizes = np.array([[36, 72], [72, 36], [40, 40]], np.int64)
    windows = _eval_windows(sizes, 16)
    np.testing.assert_allclose(windows[0], [2, 20, 32, 32])
    np.testing.assert_allclose(windows[1], [20, 2, 32, 32])
    np.testing.assert_allclose(windows[2], [40 / 18, 40 / 18, 16 * 40 / 18, 16 * 40 / 18])
    boxes = _enclosing_boxes(windows)
    assert boxes.dtype == np.int32
    assert boxes[0].tolist() == [2, 20, 32, 32] and boxes[2].tolist() == [2, 2, 36, 36]
    assert (boxes[:, :2] + boxes[:, 2:] <= sizes).all()
