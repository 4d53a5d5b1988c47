"""ImageLoader(jpeg_dct="fast"): FFCV's IDCT, opt-in, exact against the reference, deterministic, fingerprinted."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import collect
from test_variable_loader import (
    PER_SAMPLE,
    SEED,
    encode_jpeg,
    expected,
    loader,
    make_images,
    simplejpeg,
    write_jpeg,
    write_raw,
)

from tbl_loader import RandomResizedCrop
from tbl_loader.errors import StateMismatchError
from tbl_loader.image.jpeg import DCT_METHODS, check_dct, dct_scale, scale_boxes
from tbl_loader.image.spec import fit_windows
from tbl_loader.stream import order

pytestmark = pytest.mark.skipif(simplejpeg is None or not PER_SAMPLE, reason="needs simplejpeg and tbl-kernels 0.2")


@pytest.fixture(scope="module")
def dct_images() -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    out = make_images(30, seed=3)
    for img in out[::3]:  # some fine detail, where the two IDCTs part
        img ^= rng.integers(0, 64, img.shape, dtype=np.uint8)
    return out


@pytest.fixture(scope="module")
def jpeg(tmp_path_factory, dct_images):
    blobs = [encode_jpeg(im) for im in dct_images]
    path = write_jpeg(tmp_path_factory.mktemp("dct") / "jpeg", blobs, [im.shape[:2] for im in dct_images], 8)
    return path, blobs


def reference_decoder(blobs, fastdct):
    """The documented serve-time decode with simplejpeg's own switch for the IDCT."""

    def decode(ids, boxes, out_hw):
        scales = dct_scale(boxes[:, 2], boxes[:, 3], *out_hw)
        full, decoded, sources = [], [], []
        for i, k in zip(ids, scales, strict=True):
            h, w, _, _ = simplejpeg.decode_jpeg_header(blobs[i])
            img = simplejpeg.decode_jpeg(blobs[i], "RGB", fastdct=fastdct, min_height=-(-h // k),
                                         min_width=-(-w // k))
            full.append((h, w))
            decoded.append(img.shape[:2])
            sources.append(img)
        if boxes.dtype == np.float64:
            full_hw, dec_hw = np.array(full, np.float64), np.array(decoded)
            return sources, fit_windows(boxes * np.concatenate([dec_hw / full_hw] * 2, axis=1), dec_hw)
        return sources, scale_boxes(boxes, np.array(full), np.array(decoded))

    return decode


@pytest.mark.parametrize("dct", DCT_METHODS)
def test_each_idct_is_exact_against_the_reference(jpeg, dct_images, dct):
    path, blobs = jpeg
    with loader(path, 7, hflip=0.5, num_threads=2, jpeg_dct=dct) as ld:
        ld.set_epoch(2)
        got, _, ids = collect(ld)
    want = expected(dct_images, ids, epoch=2, hflip=0.5, decode=reference_decoder(blobs, dct == "fast"))
    assert np.array_equal(got, want)


def test_fast_idct_changes_pixels_and_is_not_the_default(jpeg):
    path, blobs = jpeg
    fast = [simplejpeg.decode_jpeg(b, "RGB", fastdct=True) for b in blobs]
    accurate = [simplejpeg.decode_jpeg(b, "RGB") for b in blobs]
    assert any(not np.array_equal(f, a) for f, a in zip(fast, accurate, strict=True))
    runs = {}
    for dct in (None, "accurate", "fast"):
        with loader(path, 10, dtype="uint8", **({} if dct is None else {"jpeg_dct": dct})) as ld:
            runs[dct] = collect(ld)[0]
    assert np.array_equal(runs[None], runs["accurate"])
    assert not np.array_equal(runs["fast"], runs["accurate"])


def test_fast_idct_with_dct_downscaling_is_exact(jpeg, dct_images):
    path, blobs = jpeg
    small = RandomResizedCrop(4, scale=(0.5, 1.0))
    with loader(path, 16, random_resized_crop=small, dtype="uint8", jpeg_dct="fast") as ld:
        got, _, ids = collect(ld)
    hs = np.array([dct_images[i].shape[0] for i in ids])
    ws = np.array([dct_images[i].shape[1] for i in ids])
    boxes = order.random_resized_crop_boxes(SEED, 0, ids, hs, ws, small.scale, small.ratio)
    assert set(dct_scale(boxes[:, 2], boxes[:, 3], 4, 4).tolist()) >= {2, 4}
    want = expected(dct_images, ids, epoch=0, dtype="uint8", crop=small, decode=reference_decoder(blobs, True))
    assert np.array_equal(got, want)


def test_fast_idct_stream_is_the_same_every_way(jpeg):
    path, _ = jpeg
    runs = []
    for batch, prefetch, threads in [(7, 0, 1), (64, 2, 2)]:
        with loader(path, batch, hflip=0.5, prefetch=prefetch, num_threads=threads, jpeg_dct="fast") as ld:
            runs.append(collect(ld))
    for field in range(3):
        assert np.array_equal(runs[0][field], runs[1][field])
    first = loader(path, 8, hflip=0.5, jpeg_dct="fast")
    head = collect(first, limit=2)
    state = first.state_dict()
    first.close()
    resumed = loader(path, 3, hflip=0.5, jpeg_dct="fast")
    resumed.load_state_dict(state)
    tail = collect(resumed)
    resumed.close()
    for field in range(3):
        assert np.array_equal(np.concatenate([head[field], tail[field]]), runs[0][field])


def test_the_idct_is_part_of_the_stream_fingerprint(jpeg):
    path, _ = jpeg
    states = {}
    for dct in DCT_METHODS:
        with loader(path, jpeg_dct=dct) as ld:
            states[dct] = ld.state_dict()
    assert "jpeg_dct" not in states["accurate"]["stream_settings"]  # states saved before the option resume
    assert states["fast"]["stream_settings"]["jpeg_dct"] == "fast"
    for saved, other in (("fast", "accurate"), ("accurate", "fast")):
        with loader(path, jpeg_dct=other) as ld, pytest.raises(StateMismatchError):
            ld.load_state_dict(states[saved])


def test_jpeg_dct_is_checked_and_never_ignored(jpeg, tmp_path, dataset_path):
    with pytest.raises(ValueError, match=r"jpeg_dct must be one of \('accurate', 'fast'\)"):
        loader(jpeg[0], jpeg_dct="fastest")
    with pytest.raises(ValueError, match="jpeg_dct must be one of"):
        check_dct(True)
    raw = write_raw(tmp_path / "raw", make_images(4))
    with pytest.raises(ValueError, match="applies to JPEG storage"):
        loader(raw, jpeg_dct="fast")
    with pytest.raises(ValueError, match="applies to JPEG storage"):
        loader(dataset_path, random_resized_crop=None, jpeg_dct="fast")
    with loader(raw, jpeg_dct="accurate") as ld:  # the default is accepted everywhere
        assert collect(ld)[0].shape[0] == 4
