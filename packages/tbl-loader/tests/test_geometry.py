"""Geometry fields (``geometry={"boxes": "xyxy"}``) and the crop boxes and flips every image batch carries."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_images, needs_per_sample

import tbl_format
from tbl_loader import ImageDataset, ImageLoader, Mix, Padded, RandomResizedCrop
from tbl_loader.errors import GeometryFieldError
from tbl_loader.image.spec import resized_center_crop_windows
from tbl_loader.stream import order

N, H, W = 30, 24, 32
SEED = 5


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    images = make_images(N, (H, W, 3))
    rng = np.random.default_rng(2)
    samples = []
    for i in range(N):
        k = i % 4
        x1, y1 = rng.uniform(-2, W - 2, k), rng.uniform(-2, H - 2, k)
        boxes = np.stack([x1, y1, x1 + rng.uniform(0.5, 12, k), y1 + rng.uniform(0.5, 12, k)], axis=1)
        samples.append({"image": images[i], "label": i, "boxes": boxes.astype(np.float32), "name": f"s{i}",
                        "two": np.array([[0, 0, W, H], [W - 3, 1, W, 4]], np.int64)})  # a fixed-shape int leaf
    return tbl_format.write(samples, tmp_path_factory.mktemp("geo") / "ds", variable=["boxes"], shard_rows=12)


def _reference(stored, crop_box, flip, out_hw):
    """The documented rule, box by box in Python floats, rounded once to float32."""
    top, left, height, width = (float(v) for v in crop_box)
    oh, ow = out_hw
    out = []
    for x1, y1, x2, y2 in np.asarray(stored).reshape(-1, 4).tolist():
        xs = [min(max(((x - left) * ow) / width, 0.0), float(ow)) for x in (x1, x2)]
        ys = [min(max(((y - top) * oh) / height, 0.0), float(oh)) for y in (y1, y2)]
        if flip:
            xs = [ow - xs[1], ow - xs[0]]
        out.append([xs[0], ys[0], xs[1], ys[1]])
    return np.array(out, np.float64).reshape(-1, 4).astype(np.float32)


CROP = RandomResizedCrop((12, 16), scale=(0.1, 0.6))
CASES = {
    "random_resized_crop": (dict(random_resized_crop=[CROP, RandomResizedCrop(8)]), (12, 16)),
    "center_crop": (dict(center_crop=(20, 16)), (20, 16)),
    "resize_center_crop": (dict(resize=18, center_crop=16), (16, 16)),
    "none": ({}, (H, W)),
}


def _drawn(case, epoch, ids):
    if case == "random_resized_crop":
        return order.random_resized_crop_boxes(SEED, epoch, ids, H, W, CROP.scale, CROP.ratio).astype(np.float64)
    if case == "center_crop":
        return np.tile(order.center_crop_box(H, W, 20, 16), (len(ids), 1)).astype(np.float64)
    if case == "resize_center_crop":
        return np.tile(resized_center_crop_windows([H], [W], 18, 16, 16), (len(ids), 1))
    return np.tile(np.array([0.0, 0.0, H, W]), (len(ids), 1))


# resize + center_crop resamples each sample with tbl-kernels 0.2's per-sample call
@pytest.mark.parametrize("case", [pytest.param(c, marks=needs_per_sample) if c == "resize_center_crop" else c
                                  for c in CASES])
@pytest.mark.parametrize("var,backend", [("list", "torch"), ("pad", "numpy")])
def test_boxes_follow_the_first_view(path, case, var, backend):
    options, out_hw = CASES[case]
    loader = ImageLoader(path, 7, seed=SEED, hflip=0.5, fields=("boxes", "two"), var=var, backend=backend,
                         geometry={"boxes": "xyxy", "two": "xyxy"}, prefetch=1, **options)
    stored = tbl_format.open(path)
    loader.set_epoch(1)
    for batch in loader:
        ids = np.asarray(batch.indices)
        assert np.array_equal(np.asarray(batch.crop_boxes), _drawn(case, 1, ids))
        assert np.array_equal(np.asarray(batch.flips), order.flip_draws(SEED, 1, ids, 0.5))
        boxes, two = batch.fields["boxes"], np.asarray(batch.fields["two"])
        if var == "pad":
            assert isinstance(boxes, Padded)
            lengths = boxes.lengths[:, 0]
            assert not boxes.data[np.arange(boxes.data.shape[1])[None, :] >= lengths[:, None]].any()  # padding: 0
            rows = [boxes.data[k, : lengths[k]] for k in range(len(ids))]
        else:
            rows = [np.asarray(b) for b in boxes]
        for k, row in enumerate(ids.tolist()):
            crop, flip = np.asarray(batch.crop_boxes)[k], bool(batch.flips[k])
            assert np.array_equal(rows[k], _reference(stored[row]["boxes"], crop, flip, out_hw))
            assert two.dtype == np.float32 and np.array_equal(two[k], _reference(stored[row]["two"], crop, flip,
                                                                                  out_hw))
    stored.close()
    loader.close()


def test_map_style_dataset_and_mix_carry_the_same_geometry(path):
    options = dict(seed=SEED, hflip=0.5, random_resized_crop=CROP, fields=("boxes",), geometry={"boxes": "xyxy"},
                   backend="numpy")
    loader = ImageLoader(path, 6, prefetch=0, **options)
    ds = ImageDataset.from_loader(loader)
    batch = next(iter(loader))
    again = ds.get_batch(np.asarray(batch.indices).tolist(), epoch=0)
    for name in ("crop_boxes", "flips", "images"):
        assert np.array_equal(getattr(again, name), getattr(batch, name))
    assert all(np.array_equal(a, b) for a, b in zip(again.fields["boxes"], batch.fields["boxes"], strict=True))
    mix = Mix([loader, ImageLoader(path, 6, prefetch=0, **options)], batch_size=8, seed=1, prefetch=0)
    mixed = next(iter(mix))
    assert mixed.crop_boxes.shape == (8, 4) and mixed.flips.shape == (8,)
    for k in range(8):  # each sample keeps the geometry its source drew for it (source epoch 0 here)
        one = ds.get_batch([int(mixed.indices[k])], epoch=0)
        assert np.array_equal(one.crop_boxes[0], mixed.crop_boxes[k]) and one.flips[0] == mixed.flips[k]
        assert np.array_equal(one.fields["boxes"][0], mixed.fields["boxes"][k])
    mix.close()
    loader.close()


def test_bad_geometry_is_refused_by_name(path):
    with pytest.raises(GeometryFieldError, match="not among the served fields"):
        ImageLoader(path, 4, fields=("two",), geometry={"boxes": "xyxy"})
    with pytest.raises(GeometryFieldError, match="not a geometry kind"):
        ImageLoader(path, 4, fields=("boxes",), geometry={"boxes": "xywh"})
    with pytest.raises(GeometryFieldError, match=r"\(k, 4\) numbers"):
        ImageDataset(path, fields=("boxes", "name"), geometry={"boxes": "xyxy", "name": "xyxy"})
