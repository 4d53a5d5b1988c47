"""Serve-time JPEG rows are not trusted: the frame header is read and checked against the row's height/width
columns before the decoder allocates, at every DCT scale; a seeded fuzz (jpeg_fuzz.py) in its own process.

``TBL_FUZZ_JPEG_CASES=1000`` runs that many fuzz cases (half with verify="never", half "lazy"); 100 by default.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import collect
from test_variable_loader import PER_SAMPLE, encode_jpeg, loader, make_images, simplejpeg, write_jpeg

from tbl_loader import RandomResizedCrop
from tbl_loader.errors import ImageGeometryError, JpegDecodeError
from tbl_loader.image import jpeg as jpeg_module
from tbl_loader.image.jpeg import JpegHeader, decode_jpeg, read_jpeg_header

pytestmark = pytest.mark.skipif(simplejpeg is None or not PER_SAMPLE, reason="needs simplejpeg and tbl-kernels 0.2")

FUZZ_CASES = int(os.environ.get("TBL_FUZZ_JPEG_CASES", "100"))
HERE = Path(__file__).parent


def sof(data: bytes) -> int:
    """Offset of the SOF0 segment's length field."""
    return data.index(b"\xff\xc0") + 2


def with_header(data: bytes, *, height: int | None = None, width: int | None = None,
                precision: int | None = None, components: int | None = None) -> bytes:
    """``data`` with its frame header's fields rewritten (the rest of the bytes unchanged)."""
    b, k = bytearray(data), sof(data)
    if precision is not None:
        b[k + 2] = precision
    if height is not None:
        b[k + 3:k + 5] = height.to_bytes(2, "big")
    if width is not None:
        b[k + 5:k + 7] = width.to_bytes(2, "big")
    if components is not None:
        b[k + 7] = components
    return bytes(b)


def test_header_is_read_as_other_readers_read_it():
    from PIL import Image

    for img in make_images(6, seed=2):
        data = encode_jpeg(img)
        with Image.open(io.BytesIO(data)) as im:
            assert read_jpeg_header(data) == JpegHeader(im.size[1], im.size[0], 3, 8) == (*img.shape[:2], 3, 8)
    grey = io.BytesIO()
    Image.fromarray(np.zeros((9, 14), np.uint8)).save(grey, "JPEG", progressive=True)
    assert read_jpeg_header(np.frombuffer(grey.getvalue(), np.uint8)) == JpegHeader(9, 14, 1, 8)


@pytest.mark.parametrize(("data", "match"), [
    (b"", "start-of-image"), (b"\x89PNG\r\n\x1a\n", "start-of-image"), (b"\xff\xd8\xff\xff", "ends before"),
    (b"\xff\xd8\x00\x00\x00\x00", "offset 2: a marker expected"), (b"\xff\xd8\xff\xd9\x00\x00", "0xd9 before"),
    (b"\xff\xd8\xff\xe0\xff\xff\x00\x00", "runs past"), (b"\xff\xd8\xff\xc0\x00\x05\x08\x00\x10", "8 at least"),
])
def test_malformed_headers_are_named(data, match):
    with pytest.raises(ValueError, match=match):
        read_jpeg_header(data)


@pytest.fixture
def one_image():
    img = make_images(1, seed=9)[0]
    return img, encode_jpeg(img)


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_a_size_lie_is_refused_at_every_dct_scale(one_image, scale):
    img, data = one_image
    h, w = img.shape[:2]
    assert decode_jpeg(data, scale, height=h, width=w).shape[:2] == (-(-h // scale), -(-w // scale))
    for lie in [(h + 1, w), (h, w - 1), (w, h), (2 * h, 2 * w)]:
        with pytest.raises(ImageGeometryError, match=f"header says {h} x {w}, its height/width columns say "
                                                     f"{lie[0]} x {lie[1]}"):
            decode_jpeg(data, scale, height=lie[0], width=lie[1])


def test_a_bomb_declared_small_is_refused_before_the_decoder_runs(one_image, monkeypatch):
    img, data = one_image

    class NoDecoder:  # the decoder allocates from the header: it must not be reached
        __version__ = "test"

        @staticmethod
        def decode_jpeg(*args, **kwargs):
            raise AssertionError("the decoder ran")

    monkeypatch.setattr(jpeg_module, "_simplejpeg", lambda: NoDecoder)
    bomb = with_header(data, height=16000, width=16000)
    for scale in (1, 8):
        with pytest.raises(ImageGeometryError, match="header says 16000 x 16000"):
            decode_jpeg(bomb, scale, height=img.shape[0], width=img.shape[1])
    for fields, match in [({"precision": 12}, "12-bit samples"), ({"components": 4}, "4 colour components")]:
        with pytest.raises(ValueError, match=match):
            decode_jpeg(with_header(data, **fields), 1, height=img.shape[0], width=img.shape[1])


@pytest.mark.parametrize("out", [3, 24])  # 3: boxes >= 8x the output (DCT scale 1/8); 24: scale 1
def test_the_loader_names_the_row_whose_columns_lie(tmp_path, out):
    images = make_images(6, seed=4)
    images = [np.ascontiguousarray(np.pad(im, ((0, 80 - im.shape[0]), (0, 80 - im.shape[1]), (0, 0))))
              for im in images]  # 80 x 80: every box of the crop fits 1/8 of it at out=3
    blobs = [encode_jpeg(im) for im in images]
    sizes = [im.shape[:2] for im in images]
    sizes[3] = (79, 80)  # row 3's columns lie by one pixel
    path = write_jpeg(tmp_path / "lie.tbl", blobs, sizes)
    crop = RandomResizedCrop(out, scale=(0.9, 1.0), ratio=(1.0, 1.0))
    with loader(path, 6, shuffle=False, random_resized_crop=crop) as ld, \
            pytest.raises(ImageGeometryError, match=r"lie\.tbl: row 3: the JPEG header says 80 x 80, its "
                                                    r"height/width columns say 79 x 80"):
        collect(ld)


def test_the_loader_names_a_row_of_12_bit_samples(tmp_path):
    images = make_images(4, seed=6)
    blobs = [encode_jpeg(im) for im in images]
    blobs[2] = with_header(blobs[2], precision=12)
    path = write_jpeg(tmp_path / "deep.tbl", blobs, [im.shape[:2] for im in images])
    with loader(path, 4, shuffle=False) as ld, pytest.raises(JpegDecodeError, match="row 2.*12-bit") as info:
        collect(ld)
    assert info.value.row == 2


def run_fuzz(cases: int, seed: int, verify: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    out = subprocess.run([sys.executable, str(HERE / "jpeg_fuzz.py"), str(cases), str(seed), verify],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


# Rows that must never be served, whatever the DCT scale: their bytes or their columns lie.
NEVER_SERVED = ("size_lie", "header_size", "bomb_header", "real_bomb", "precision", "components", "segment_length",
                "truncate", "garbage")


@pytest.mark.parametrize("verify", ["never", "lazy"])
def test_fuzz_of_serve_time_jpeg_rows(verify):
    """0 crashes (anything but the named errors), 0 rows served whose bytes are not their declared size,
    every unmodified row served, and a peak RSS bounded by the declared sizes: the headers claim up to
    65535 x 65535 (12 GB decoded), the columns at most 300 x 300 (270 kB), and the process grows by under 16 MiB."""
    cases = max(FUZZ_CASES // 2, 20)
    report = run_fuzz(cases, 1000 if verify == "never" else 2000, verify)
    assert report["crashes"] == []
    assert report["mismatches"] == []
    assert report["honest_refused"] == []
    served = {k.split(":")[0] for k, n in report["outcomes"].items() if k.endswith(":served")}
    assert "honest" in served and not served & set(NEVER_SERVED), report["outcomes"]
    assert report["largest_bomb"] > 1 << 30 and report["largest_declared"] <= 300 * 300 * 3
    assert report["peak_rss"] - report["baseline_rss"] < 16 << 20, report
    if verify == "lazy":  # a byte flipped in the written shard is caught by its block checksum
        assert not any(k.startswith("in_shard:") and not k.endswith("DataChecksumError") for k in report["outcomes"])
