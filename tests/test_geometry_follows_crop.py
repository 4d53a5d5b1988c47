"""Boxes that follow the crop: a detection-style dataset of real photographs, boxes from a sidecar.

A real-photo TAR (tbl-bench's generator) is converted with ``tbl convert
--sidecar`` (boxes per image, xyxy in source pixels) and served with
RandomResizedCrop + horizontal flip and ``geometry={"boxes": "xyxy"}``. Every
served box must equal the source box mapped by the batch's own crop box and
flip, computed here box by box in Python floats (IEEE float64, the documented
rule of ``tbl_loader.image.geometry``) and rounded once to float32; the crop
boxes and flips must be the documented draws, and the served pixels the
crop-resize of the stored image by that very crop box and flip.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import numpy as np
import pytest

import tbl_format
import tbl_kernels
from tbl_bench.data import make_image_tar
from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_loader.errors import GeometryFieldError
from tbl_loader.image.geometry import visible
from tbl_loader.stream import order

N = 14
OUT = 40
CROP = RandomResizedCrop(OUT, scale=(0.08, 0.4))
SEED = 7


def _tbl(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "tbl_format.cli", *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """The TAR, its sidecar of boxes ({member: {"boxes": [[x1, y1, x2, y2], ...]}}) and each member's size."""
    root = tmp_path_factory.mktemp("boxes")
    tar_path = root / "photos.tar"
    make_image_tar(tar_path, N, num_classes=2, min_size=60, max_size=120, seed=5, workers=1)
    from PIL import Image

    rng = np.random.default_rng(3)
    sidecar, sizes = {}, {}
    with tarfile.open(tar_path) as tar:
        for m in (m for m in tar.getmembers() if m.isfile()):
            with Image.open(tar.extractfile(m)) as img:
                w, h = img.size
            boxes = []
            for _ in range(int(rng.integers(0, 4))):  # some images have none
                x1, y1 = rng.uniform(0, w - 4), rng.uniform(0, h - 4)
                boxes.append([round(x1, 2), round(y1, 2), round(rng.uniform(x1 + 1, w), 2),
                              round(rng.uniform(y1 + 1, h), 2)])
            sidecar[m.name], sizes[m.name] = {"boxes": boxes + [[0.5, 0.5, 3.5, 2.5]]}, (h, w)  # + a corner box
    (root / "boxes.json").write_text(json.dumps(sidecar))
    return tar_path, root / "boxes.json", sidecar, sizes


@pytest.fixture(scope="module", params=["raw", "jpeg"])
def converted(request, photos, tmp_path_factory):
    tar_path, sidecar_path, _, _ = photos
    dst = tmp_path_factory.mktemp("conv") / "ds"
    # The photos fit the cap: stored as they came, so the sidecar's source pixels are stored pixels.
    _tbl("convert", str(tar_path), str(dst), "--max-size", "200", "--store", request.param, "--sidecar",
         str(sidecar_path), "--keep-path", "--shard-rows", "5", "--workers", "1", "--quiet")
    return request.param, dst


def _expected(source_boxes, crop_box, flip):
    """The documented rule, one box at a time in Python floats, on the stored boxes (the sidecar's numbers
    as the converter stores them: float32)."""
    top, left, height, width = (float(v) for v in crop_box)
    out = []
    for x1, y1, x2, y2 in np.asarray(source_boxes, dtype=np.float32).reshape(-1, 4).tolist():
        xs = [min(max(((x - left) * OUT) / width, 0.0), float(OUT)) for x in (float(x1), float(x2))]
        ys = [min(max(((y - top) * OUT) / height, 0.0), float(OUT)) for y in (float(y1), float(y2))]
        if flip:
            xs = [OUT - xs[1], OUT - xs[0]]
        out.append([xs[0], ys[0], xs[1], ys[1]])
    return np.array(out, dtype=np.float64).reshape(-1, 4).astype(np.float32)


def test_served_boxes_follow_the_crop_and_flip(converted, photos):
    store, dst = converted
    _, _, sidecar, sizes = photos
    loader = ImageLoader(dst, 5, seed=SEED, random_resized_crop=CROP, hflip=0.5, dtype="uint8", layout="HWC",
                         fields=("boxes", "path"), geometry={"boxes": "xyxy"}, backend="numpy", prefetch=0)
    ds = tbl_format.open(dst)
    seen = {"visible": 0, "cropped away": 0, "flipped": 0}
    for epoch in range(3):
        loader.set_epoch(epoch)
        for batch in loader:
            ids = np.asarray(batch.indices)
            hw = np.array([sizes[p] for p in batch.fields["path"]], dtype=np.int64)
            assert np.array_equal(batch.flips, order.flip_draws(SEED, epoch, ids, 0.5))
            drawn = order.random_resized_crop_boxes(SEED, epoch, ids, hw[:, 0], hw[:, 1], CROP.scale, CROP.ratio)
            if store == "raw":  # a JPEG decoded at a reduced DCT scale reports the region its pixels came from
                assert np.array_equal(batch.crop_boxes, drawn.astype(np.float64))
                stored = ds.values("image", ids.tolist())
                want = np.empty((len(ids), OUT, OUT, 3), np.uint8)
                tbl_kernels.crop_resize_images([np.ascontiguousarray(s) for s in stored],
                                               batch.crop_boxes.astype(np.int32), want, None,
                                               batch.flips.view(np.uint8), "HWC")
                assert np.array_equal(batch.images, want)
            for k, path in enumerate(batch.fields["path"]):
                got = batch.fields["boxes"][k]
                want_boxes = _expected(sidecar[path]["boxes"], batch.crop_boxes[k], bool(batch.flips[k]))
                assert got.dtype == np.float32 and np.array_equal(got, want_boxes), (path, epoch)
                shown = visible(got)
                seen["visible"] += int(shown.sum())
                seen["cropped away"] += int((~shown).sum())
                seen["flipped"] += int(batch.flips[k])
                assert np.all((got >= 0) & (got <= OUT))
                # A box cropped away entirely keeps its place with zero area.
                assert np.array_equal(shown, (got[:, 2] > got[:, 0]) & (got[:, 3] > got[:, 1]))
    ds.close()
    loader.close()
    assert min(seen.values()) > 0, seen  # every case of the rule was exercised


def test_geometry_needs_a_served_field_of_boxes(converted):
    _, dst = converted
    with pytest.raises(GeometryFieldError, match="not among the served fields"):
        ImageLoader(dst, 4, random_resized_crop=CROP, geometry={"boxes": "xyxy"})
    with pytest.raises(GeometryFieldError, match=r"\(k, 4\) numbers"):
        ImageLoader(dst, 4, random_resized_crop=CROP, fields=("path",), geometry={"path": "xyxy"})
    with pytest.raises(GeometryFieldError, match="not a geometry kind"):
        ImageLoader(dst, 4, random_resized_crop=CROP, fields=("boxes",), geometry={"boxes": "cxcywh"})


def _capped(h, w, cap):
    """``tbl convert --max-size``'s stored size (longer side capped, the shorter rounded half up)."""
    if max(h, w) <= cap:
        return h, w
    short = max(1, (2 * min(h, w) * cap + max(h, w)) // (2 * max(h, w)))
    return (short, cap) if w >= h else (cap, short)


@pytest.mark.parametrize("how", [("--size", "48"), ("--size", "48", "--mode", "squash"), ("--max-size", "64")])
def test_convert_maps_sidecar_boxes_into_stored_pixels(photos, tmp_path, how):
    tar_path, sidecar_path, sidecar, sizes = photos
    dst = tmp_path / "ds"
    _tbl("convert", str(tar_path), str(dst), *how, "--sidecar", str(sidecar_path), "--geometry", "boxes=xyxy",
         "--keep-path", "--workers", "1", "--quiet")
    ds = tbl_format.open(dst)
    for row in range(len(ds)):
        sample = ds[row]
        h, w = sizes[sample["path"]]
        assert tuple(sample["orig_size"]) == (h, w)
        if how[0] == "--max-size":
            region, (sh, sw) = (0.0, 0.0, h, w), _capped(h, w, 64)
        elif "squash" in how:
            region, (sh, sw) = (0.0, 0.0, h, w), (48, 48)
        else:  # the central square, fractional offsets
            side = min(h, w)
            region, (sh, sw) = ((h - side) / 2, (w - side) / 2, side, side), (48, 48)
        want = []
        for x1, y1, x2, y2 in sidecar[sample["path"]]["boxes"]:  # the JSON's numbers, in float64
            top, left, rh, rw = (float(v) for v in region)
            xs = [min(max(((float(x) - left) * sw) / rw, 0.0), float(sw)) for x in (x1, x2)]
            ys = [min(max(((float(y) - top) * sh) / rh, 0.0), float(sh)) for y in (y1, y2)]
            want.append([xs[0], ys[0], xs[1], ys[1]])
        got = sample["boxes"]
        assert got.dtype == np.float32 and np.array_equal(got, np.array(want, dtype=np.float32)), sample["path"]
    ds.close()
    # Served: the stored boxes follow the served crop and flip as in the tests above.
    out = 24
    loader = ImageLoader(dst, 4, seed=SEED, random_resized_crop=RandomResizedCrop(out, scale=(0.2, 1.0)), hflip=0.5,
                         fields=("boxes",), geometry={"boxes": "xyxy"}, backend="numpy", prefetch=0)
    stored = tbl_format.open(dst)
    for batch in loader:
        for k, row in enumerate(np.asarray(batch.indices).tolist()):
            top, left, ch, cw = (float(v) for v in batch.crop_boxes[k])
            want = []
            for x1, y1, x2, y2 in stored[row]["boxes"].tolist():
                xs = [min(max(((x - left) * out) / cw, 0.0), float(out)) for x in (x1, x2)]
                ys = [min(max(((y - top) * out) / ch, 0.0), float(out)) for y in (y1, y2)]
                if batch.flips[k]:
                    xs = [out - xs[1], out - xs[0]]
                want.append([xs[0], ys[0], xs[1], ys[1]])
            assert np.array_equal(batch.fields["boxes"][k], np.array(want, np.float32).reshape(-1, 4))
    stored.close()
    loader.close()


def test_convert_refuses_geometry_without_boxes(photos, tmp_path):
    tar_path, _, _, _ = photos
    sidecar = tmp_path / "caption.json"
    with tarfile.open(tar_path) as tar:
        sidecar.write_text(json.dumps({m.name: {"caption": "a photo"} for m in tar.getmembers() if m.isfile()}))
    result = subprocess.run([sys.executable, "-m", "tbl_format.cli", "convert", str(tar_path), str(tmp_path / "ds"),
                             "--size", "32", "--sidecar", str(sidecar), "--geometry", "caption=xyxy", "--workers",
                             "1", "--quiet"], capture_output=True, text=True)
    assert result.returncode != 0 and "must hold lists of [x1, y1, x2, y2] boxes" in result.stderr
    assert not (tmp_path / "ds").exists()


def test_ray_conversion_maps_the_boxes_as_the_local_one(photos, tmp_path):
    """`tbl convert --engine ray --sidecar --keep-path --geometry` stores what the local engine stores, row for
    row: the boxes mapped through the center crop, the paths and original sizes."""
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'tbl-loader[ray]'")
    tar_path, sidecar_path, _, _ = photos
    args = ["--size", "32", "--sidecar", str(sidecar_path), "--keep-path", "--geometry", "boxes=xyxy", "--quiet"]
    _tbl("convert", str(tar_path), str(tmp_path / "local"), "--shard-rows", "5", "--workers", "1", *args)
    _tbl("convert", str(tar_path), str(tmp_path / "ray"), "--shard-rows", "5", "--engine", "ray", *args)
    with tbl_format.open(tmp_path / "local") as a, tbl_format.open(tmp_path / "ray") as b:
        assert a.schema == b.schema and a.metadata == b.metadata and len(a) == len(b) == N
        for i in range(N):
            x, y = a[i], b[i]
            assert x["path"] == y["path"] and np.array_equal(x["orig_size"], y["orig_size"])
            assert np.array_equal(x["image"], y["image"]) and np.array_equal(x["boxes"], y["boxes"]), i
