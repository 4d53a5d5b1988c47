"""Golden files: every committed file in tests/golden meets the outcome recorded in expected.json.

Regenerate with ``python packages/tbl-format/tests/golden/make_golden.py``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import tbl_format as tf
import tbl_format.reader as native_reader
from tbl_format import turboloader as v2

GOLDEN = Path(__file__).parent / "golden"
EXPECTED = json.loads((GOLDEN / "expected.json").read_text())


@pytest.fixture(params=["numpy", "no-numpy"])
def np_mode(request, monkeypatch):
    if request.param == "numpy":
        pytest.importorskip("numpy")
    else:
        monkeypatch.setattr(v2, "_numpy", lambda: None)
        monkeypatch.setattr(native_reader, "_numpy", lambda: None)
    return request.param


def _outcome(path: Path) -> tuple[str, str | None, str | None]:
    """Open, read every row (by index and in order), touch every fixed-size column, verify."""
    stage = "open"
    try:
        ds = tf.open(path)
        stage = "read"
        rows = [ds[i] for i in range(len(ds))]
        assert len(list(ds)) == len(rows)
        stage = "verify"
        ds.verify()
    except tf.FormatError as exc:
        return "error", stage, type(exc).__name__
    ds.close()
    return "ok", None, None


def test_manifest_lists_exactly_the_committed_files():
    assert sorted(EXPECTED) == sorted(p.name for p in GOLDEN.glob("*.tbl"))
    assert sum(p.stat().st_size for p in GOLDEN.glob("*.tbl")) < 320 * 1024


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_golden_file(name, np_mode):
    want = EXPECTED[name]
    for mod in want.get("requires", []):
        pytest.importorskip(mod)
    got = _outcome(GOLDEN / name)
    assert got == (want["outcome"], want.get("stage"), want.get("error"))
    if want["outcome"] == "ok":
        assert len(tf.open(GOLDEN / name)) == want["rows"]
    else:
        # Every error named in the manifest is part of the public API.
        assert issubclass(getattr(tf, want["error"]), tf.FormatError)


def test_v2_golden_files_are_reproducible():
    """The v2 files come from the golden writer alone, so regenerating them gives the same bytes."""
    pytest.importorskip("lz4")
    spec = importlib.util.spec_from_file_location("tbl_golden_make", GOLDEN / "make_golden.py")
    mg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mg)
    for name, data in mg.v2_files().items():
        assert (GOLDEN / name).read_bytes() == data, name
    assert mg.EXPECTED == EXPECTED


def test_valid_golden_contents():
    """Spot-check the data, not just that it opens."""
    ds = tf.open(GOLDEN / "native_valid.tbl")
    assert ds.metadata == {"class_names": ["a", "b"]}
    assert [r["s"] for r in ds] == ["", "a", "bé", "ok\u2603"]
    assert [r["i"] for r in ds] == [-3, 4, 11, 18]
    raw = tf.open(GOLDEN / "v2_valid_raw.tbl")
    assert raw.leaf_paths == ["image", "label", "meta"]
    assert [r["label"] for r in raw] == [1, 4, 7]
    v11 = tf.open(GOLDEN / "native_valid_v11.tbl")
    assert list(v11) == [{"tags": [], "o": 0, "none": None}, {"tags": ["a"], "o": None, "none": None},
                         {"tags": None, "o": 2, "none": None}, {"tags": [], "o": None, "none": None}]
    assert v11.shard(0).version == (1, 1)
    if importlib.util.find_spec("zstandard") is not None:
        assert [r["s"] for r in tf.open(GOLDEN / "native_valid_zstd.tbl")] == ["", "zstd", "bé" * 40, "ok\u2603"]
    mixed = tf.open(GOLDEN / "v2_valid_mixed.tbl")
    assert [r["format"] for r in mixed] == [1, 2, 1]
    assert [r["meta"] for r in mixed] == [b"", b"\x00\x01custom", b""]
