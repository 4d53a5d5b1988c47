"""TurboLoader TBL v2 RAW_U8 files are served through the same zero-copy path."""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np
import pytest
from conftest import collect, make_images, reference_images

from tbl_loader import ImageLoader

RAW_U8 = 8


def write_v2(path, images: np.ndarray, labels=None):
    """A TurboLoader v2 file of uncompressed RAW_U8 samples, back to back (SPEC.md section 8)."""
    n, h, w, _ = images.shape
    header_size = 64 + 24 * n
    payload = images.tobytes()
    size = h * w * 3
    entries = b"".join(
        struct.pack("<QIIHHBBH", header_size + i * size, size, size, w, h, RAW_U8, 2 if labels is not None else 0, 0)
        for i in range(n)
    )
    meta = b""
    if labels is not None:
        for i, label in enumerate(labels):
            block = json.dumps({"label": int(label)}).encode()
            meta += struct.pack("<QIHH", i, len(block), 1, 0) + block
    meta_offset = header_size + len(payload) if meta else 0
    flags = 2 if meta else 0

    def header(crc: int) -> bytes:
        return (b"TBL\x02" + struct.pack("<IQIIQQII", 2, n, header_size, 0, meta_offset, len(meta), flags, crc)
                + bytes(16))

    head = header(zlib.crc32(header(0)))
    path.write_bytes(head + entries + payload + meta)
    return path


@pytest.mark.parametrize("with_labels", [False, True])
def test_v2_raw_u8_file_is_served(tmp_path, with_labels):
    imgs = make_images(37, (9, 11, 3), seed=5)
    labels = np.arange(37) * 3 % 10 if with_labels else None
    path = write_v2(tmp_path / "turbo.tbl", imgs, labels)
    with ImageLoader(path, 8, seed=2, hflip=0.5, backend="numpy") as loader:
        got, lab, idx = collect(loader)
    assert np.array_equal(np.sort(idx), np.arange(37))
    want = reference_images(imgs, idx, seed=2, epoch=0, hflip=0.5, dtype="float32", layout="CHW")
    assert np.array_equal(got, want)
    if with_labels:
        assert np.array_equal(lab, labels[idx])
    else:
        assert lab is None
