"""Cross-check against TurboLoader itself (skipped unless ``turboloader`` is importable).

turboloader is never a dependency; run this in a scratch environment:

    python -m venv /tmp/tlvenv && /tmp/tlvenv/bin/pip install turboloader==2.39.0 numpy lz4 pytest
    PYTHONPATH=packages/tbl-format/src /tmp/tlvenv/bin/python -m pytest packages/tbl-format/tests/test_v2_turboloader.py

It checks, both ways, that the layout in SPEC.md is TurboLoader's: files written by
TurboLoader read identically through tbl_format, the golden writer produces
byte-identical files for the same samples, and TurboLoader reads the golden files.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

tl = pytest.importorskip("turboloader")
np = pytest.importorskip("numpy")

import tbl_format as tf  # noqa: E402

GOLDEN = Path(__file__).parent / "golden"
_spec = importlib.util.spec_from_file_location("tbl_golden_make", GOLDEN / "make_golden.py")
mg = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mg)


def _write_tl(path: Path, samples, *, compress: bool, metadata=()) -> bytes:
    w = tl.TblWriterV2(str(path), enable_compression=compress)
    for payload, fmt, width, height in samples:
        w.add_sample(payload, tl.SampleFormat(fmt), width=width, height=height)
    for i, text, typ in metadata:
        w.add_metadata(i, text.decode(), tl.MetadataType(typ))
    w.finalize()
    return path.read_bytes()


def _sample_sets():
    rng = np.random.default_rng(5)
    imgs = [rng.integers(0, 256, (6, 7, 3), dtype=np.uint8).tobytes() for _ in range(5)]
    raw = [(im, mg.RAW_U8, 7, 6) for im in imgs]
    labels = [(i, json.dumps({"label": int(i * 2)}).encode(), mg.META_JSON) for i in range(5)]
    mixed = [(b"\xff\xd8" + bytes(range(200)), mg.JPEG, 10, 20), (b"png" * 50, mg.PNG, 1, 2), (b"q", 0, 0, 0)]
    return {
        "raw": (raw, False, ()),
        "raw_labels": (raw, False, labels),
        "raw_partial_meta": (raw, False, [labels[3], labels[1]]),
        "mixed_lz4": (mixed, True, [(0, b"first", 1), (0, b"second", 255)]),
        "raw_lz4": ([(bytes(7 * 6 * 3), mg.RAW_U8, 7, 6)] + raw[:2], True, ()),
        "empty": ([], False, ()),
    }


@pytest.mark.parametrize("name", sorted(_sample_sets()))
def test_turboloader_files_read_identically(tmp_path, name):
    samples, compress, metadata = _sample_sets()[name]
    path = tmp_path / f"{name}.tbl"
    theirs = _write_tl(path, samples, compress=compress, metadata=metadata)
    ours = mg.v2_bytes(samples, compress=compress, metadata=metadata)
    assert ours == theirs, "the golden writer and TurboLoader disagree on the bytes of the same samples"

    reader = tl.TblReaderV2(str(path), verify_checksums=True)
    ds = tf.open(path, verify=True)
    assert len(ds) == reader.num_samples() == len(samples)
    for i in range(len(ds)):
        row = ds[i]
        expect = reader.read_sample(i)
        if "image" in row:
            info = reader.get_sample_info(i)
            assert row["image"].shape == (info["height"], info["width"], 3)
            assert row["image"].tobytes() == expect
        else:
            assert row["data"] == expect
            assert row["format"] == int(reader.get_sample_info(i)["format"])
        if "meta" in row:
            text, _typ = reader.read_metadata(i)
            assert row["meta"] == text.encode()
    if "image" in ds.schema.leaves and not compress:
        view, h, w = tl.tbl.open_raw_view(str(path))
        (col,) = ds.segments("image")
        assert np.array_equal(col, view)
        assert not col.flags.owndata  # a view of the map, not a copy


def test_turboloader_reads_golden_v2_files():
    expected = json.loads((GOLDEN / "expected.json").read_text())
    for name, e in expected.items():
        if not name.startswith("v2_valid"):
            continue
        path = GOLDEN / name
        reader = tl.TblReaderV2(str(path), verify_checksums=True)
        ds = tf.open(path)
        assert reader.num_samples() == len(ds) == e["rows"]
        for i in range(len(ds)):
            row = ds[i]
            got = row["image"].tobytes() if "image" in row else row["data"]
            assert got == reader.read_sample(i), (name, i)
