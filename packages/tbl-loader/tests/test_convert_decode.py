"""reference_preprocess: THE definition of a converted image, checked against an independent Pillow rewrite."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFile, ImageOps

pytest.importorskip("skimage")

from convert_images import encode, jpeg_set, photos, truncated_jpeg, variants, write_tree

import tbl_format
from tbl_loader.conversion.decode import reference_preprocess
from tbl_loader.conversion.images import convert
from tbl_loader.errors import PillowConfigError, UnsupportedImageModeError

FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC, "lanczos": Image.Resampling.LANCZOS}


def independent(data: bytes, size: int, mode: str, resample: str = "bilinear", draft: bool = True) -> np.ndarray:
    """The documented rule, written again from the documentation with plain Pillow calls."""
    im = Image.open(io.BytesIO(data))
    if draft and im.format == "JPEG":
        im.draft("RGB", (size, size))
    im = ImageOps.exif_transpose(im)
    if im.mode.startswith("I"):
        v = np.clip(np.asarray(im).astype(np.int64), 0, 65535)
        im = Image.fromarray(np.rint(v / 257).astype(np.uint8)).convert("RGB")
    elif "A" in im.mode or "a" in im.mode or "transparency" in im.info:
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        im = Image.alpha_composite(white, im.convert("RGBA")).convert("RGB")
    else:
        im = im.convert("RGB")
    w, h = im.size
    if mode == "squash":
        box = (0, 0, w, h)
    else:
        s = min(w, h)
        box = ((w - s) / 2, (h - s) / 2, (w - s) / 2 + s, (h - s) / 2 + s)
    return np.asarray(im.resize((size, size), FILTERS[resample], box=box, reducing_gap=None))


@pytest.fixture(scope="module")
def files() -> dict[str, bytes]:
    return variants(seed=3)


@pytest.mark.parametrize("mode", ["center_crop", "squash"])
@pytest.mark.parametrize("size", [24, 64, 150])
def test_reference_equals_independent_pillow(files: dict[str, bytes], mode: str, size: int) -> None:
    for name, data in files.items():
        ref = reference_preprocess(data, size, mode)
        assert ref.shape == (size, size, 3) and ref.dtype == np.uint8, name
        assert np.array_equal(ref, independent(data, size, mode)), name


@pytest.mark.parametrize("resample", ["bicubic", "lanczos"])
def test_other_filters_and_no_draft(files: dict[str, bytes], resample: str) -> None:
    for name in ("big.jpg", "rgb.png"):
        for draft in (True, False):
            got = reference_preprocess(files[name], 48, "center_crop", resample=resample, draft=draft)
            assert np.array_equal(got, independent(files[name], 48, "center_crop", resample, draft)), name


def test_reference_reads_paths(tmp_path, files: dict[str, bytes]) -> None:
    p = tmp_path / "x.jpg"
    p.write_bytes(files["rgb.jpg"])
    assert np.array_equal(reference_preprocess(p, 32), reference_preprocess(files["rgb.jpg"], 32))
    assert np.array_equal(reference_preprocess(str(p), 32), reference_preprocess(files["rgb.jpg"], 32))


def test_draft_never_decodes_below_size() -> None:
    """The draft scale keeps both decoded sides >= S, for sizes around every scale boundary."""
    rng = np.random.default_rng(0)
    photo = photos()[1]
    for _ in range(40):
        s = int(rng.integers(8, 40))
        w, h = int(rng.integers(s, 9 * s + 2)), int(rng.integers(s, 9 * s + 2))
        data = encode(Image.fromarray(photo).resize((w, h)), "JPEG")
        im = Image.open(io.BytesIO(data))
        im.draft("RGB", (s, s))
        assert min(im.size) >= s, (w, h, s, im.size)


def test_draft_is_used_and_keeps_quality(files: dict[str, bytes]) -> None:
    data = files["big.jpg"]  # sides >= 3 * 200, so S = 64 decodes at a reduced DCT scale
    with_draft = reference_preprocess(data, 64, "squash").astype(np.int16)
    without = reference_preprocess(data, 64, "squash", draft=False).astype(np.int16)
    assert not np.array_equal(with_draft, without)
    assert np.abs(with_draft - without).mean() < 3.0


def test_center_crop_matches_resize_then_crop(files: dict[str, bytes]) -> None:
    """Semantics of the box arithmetic: close to 'shorter side to S, then central S x S' done in two steps."""
    im = Image.open(io.BytesIO(files["rgb.png"])).convert("RGB")
    w, h = im.size
    s = 40
    scale = s / min(w, h)
    big = im.resize((max(s, round(w * scale)), max(s, round(h * scale))), Image.Resampling.BILINEAR)
    left, top = (big.size[0] - s) // 2, (big.size[1] - s) // 2
    two_step = np.asarray(big.crop((left, top, left + s, top + s))).astype(np.int16)
    got = reference_preprocess(files["rgb.png"], s, "center_crop", draft=False).astype(np.int16)
    assert np.abs(got - two_step).mean() < 8.0


def test_exif_orientation_applied() -> None:
    photo = photos()[2][:90, :150]
    exif = Image.Exif()
    exif[0x0112] = 6
    tagged = encode(Image.fromarray(photo), "PNG", exif=exif.tobytes())
    upright = encode(Image.fromarray(np.ascontiguousarray(np.rot90(photo, k=-1))), "PNG")
    assert np.array_equal(reference_preprocess(tagged, 50, "squash"), reference_preprocess(upright, 50, "squash"))
    assert not np.array_equal(reference_preprocess(tagged, 50, "squash"), reference_preprocess(encode(Image.fromarray(photo), "PNG"), 50, "squash"))


def test_colour_conversions(files: dict[str, bytes]) -> None:
    grey = reference_preprocess(files["grey.jpg"], 32)
    assert np.array_equal(grey[..., 0], grey[..., 1]) and np.array_equal(grey[..., 1], grey[..., 2])
    rgb = reference_preprocess(files["rgb.png"], 32).astype(np.int16)
    cmyk = reference_preprocess(files["cmyk.jpg"], 32).astype(np.int16)
    assert np.abs(cmyk - rgb).mean() < 6.0  # not inverted, not channel-swapped
    # the 16-bit image holds grey * 257 + noise < 257: 8-bit scaling recovers grey within 1, never clips to white
    g16 = reference_preprocess(files["grey16.png"], 32).astype(np.int16)
    g8 = reference_preprocess(encode(Image.open(io.BytesIO(files["grey16.png"])).convert("I"), "TIFF"), 32)
    assert g16.mean() < 250 and np.array_equal(g16, g8)


def test_sixteen_bit_exact_values() -> None:
    v = np.arange(0, 65536, 256, dtype=np.uint16).reshape(16, 16)
    v[0, :4] = [128, 129, 385, 65535]
    got = reference_preprocess(encode(Image.fromarray(v), "PNG"), 16, "squash")
    want = (v.astype(np.int64) + 128) // 257
    assert np.array_equal(got[..., 0], want.astype(np.uint8))
    assert list(got[0, :4, 0]) == [0, 1, 1, 255]


def test_alpha_composited_on_white() -> None:
    a = np.zeros((20, 20, 4), np.uint8)
    a[..., :3] = 10  # dark colour under full transparency must not show
    a[:, 10:, 3] = 255
    got = reference_preprocess(encode(Image.fromarray(a, "RGBA"), "PNG"), 20, "squash")
    assert (got[:, :10] == 255).all() and (got[:, 10:] == 10).all()
    pal = Image.fromarray(a[..., :3]).quantize(2)
    got = reference_preprocess(encode(pal, "PNG", transparency=0), 20, "squash")
    assert (got == 255).all()  # the only palette entry is transparent
    keyed = np.full((20, 20, 3), 10, np.uint8)
    keyed[:, 10:] = 200
    got = reference_preprocess(encode(Image.fromarray(keyed), "PNG", transparency=(10, 10, 10)), 20, "squash")
    assert (got[:, :10] == 255).all() and (got[:, 10:] == 200).all()  # an RGB colour key is transparency too


def test_unsupported_mode_named() -> None:
    f = Image.fromarray(np.ones((8, 8), np.float32))
    with pytest.raises(UnsupportedImageModeError, match="'F'"):
        reference_preprocess(encode(f, "TIFF"), 8)


def test_corrupt_inputs_raise() -> None:
    with pytest.raises(OSError, match="truncated"):
        reference_preprocess(truncated_jpeg(), 32)
    with pytest.raises(OSError):
        reference_preprocess(b"", 32)
    with pytest.raises(OSError):
        reference_preprocess(b"this is not an image", 32)


def test_refuses_load_truncated_images(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(PillowConfigError):
        reference_preprocess(jpeg_set(1)[0], 32)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"size": 0}, "size"), ({"size": 8, "mode": "fit"}, "mode"), ({"size": 8, "resample": "nearest"}, "resample")],
)
def test_bad_parameters(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        reference_preprocess(jpeg_set(1)[0], **kwargs)


def test_converter_output_equals_independent(tmp_path, files: dict[str, bytes]) -> None:
    """Every colour case through the multi-process converter equals the independent implementation."""
    root = write_tree(tmp_path / "src", {f"cls/{name}": data for name, data in files.items()})
    convert(root, tmp_path / "out.tbl", 40, mode="squash", workers=2, progress=False)
    ds = tbl_format.open(tmp_path / "out.tbl")
    got = np.concatenate([np.array(a) for a in ds.segments("image")])
    ds.close()
    want = np.stack([independent(files[name], 40, "squash") for name in sorted(files)])
    assert np.array_equal(got, want)


def test_converter_refuses_load_truncated_images(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = write_tree(tmp_path / "src", {"a/x.jpg": jpeg_set(1)[0]})
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(PillowConfigError):
        convert(root, tmp_path / "out.tbl", 16, workers=2, progress=False)
    assert not (tmp_path / "out.tbl").exists()


@pytest.mark.parametrize("resample", list(FILTERS))
@pytest.mark.parametrize("mode", ["center_crop", "squash"])
def test_preprocess_into_gives_preprocess_image_bytes_with_and_without_the_kernel(
        files: dict[str, bytes], mode: str, resample: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tbl_loader.conversion import fast_resize
    from tbl_loader.conversion.decode import preprocess_image, preprocess_into

    for kernel in (True, False):
        if not kernel:
            monkeypatch.setattr(fast_resize, "kernel_resize_available", lambda resample: False)
        for name, data in files.items():
            for size in (24, 150):
                out = np.full((size, size, 3), 7, np.uint8)
                preprocess_into(data, size, mode, resample, True, out)
                want = np.asarray(preprocess_image(data, size, mode, resample, True))
                assert np.array_equal(out, want), (name, size, kernel)


def test_the_kernel_resize_runs_wherever_the_kernels_have_it() -> None:
    """No silent slow path: with tbl-kernels 0.2 and Pillow 11.2+ the self-check passes and the kernel runs."""
    import tbl_kernels
    from tbl_loader.conversion import fast_resize

    expected = callable(getattr(tbl_kernels, "pillow_resize", None)) and hasattr(Image.Image, "__arrow_c_array__")
    assert all(fast_resize.kernel_resize_available(r) is expected for r in FILTERS)


def test_a_kernel_that_differs_from_pillow_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    import tbl_kernels
    from tbl_loader.conversion import fast_resize

    if not callable(getattr(tbl_kernels, "pillow_resize", None)):
        pytest.skip("these kernels have no pillow_resize")
    real = tbl_kernels.pillow_resize

    def off_by_one(img, out, resample="bilinear", box=None):
        real(img, out, resample, box)
        out[0, 0, 0] ^= 1

    monkeypatch.setattr(tbl_kernels, "pillow_resize", off_by_one)
    fast_resize.kernel_resize_available.cache_clear()
    try:
        assert fast_resize.kernel_resize_available("bilinear") is False
        out = np.empty((16, 16, 3), np.uint8)
        img = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 30, 3), dtype=np.uint8))
        fast_resize.resize_into(img, out, "bilinear", None)
        assert np.array_equal(out, np.asarray(img.resize((16, 16), Image.Resampling.BILINEAR, reducing_gap=None)))
    finally:
        fast_resize.kernel_resize_available.cache_clear()


def test_an_image_in_several_pillow_blocks_is_resized_by_pillow() -> None:
    from tbl_loader.conversion import fast_resize

    width = 1024
    rows = Image.core.get_block_size() // (width * 4) + 1  # one row more than a block holds
    img = Image.new("RGB", (width, rows), (10, 200, 30))
    img.paste((250, 5, 90), (0, rows // 2, width, rows))
    out = np.empty((32, 32, 3), np.uint8)
    fast_resize.resize_into(img, out, "bilinear", None)
    assert np.array_equal(out, np.asarray(img.resize((32, 32), Image.Resampling.BILINEAR, reducing_gap=None)))
