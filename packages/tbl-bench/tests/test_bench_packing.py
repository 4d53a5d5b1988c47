"""The packing benchmark's workloads, in process on a few hundred documents: what they serve is the stream."""

from __future__ import annotations

import numpy as np
import pytest

from tbl_bench import packing


def test_workload_lengths_and_stream():
    lengths = packing.document_lengths(1_000_000)
    assert lengths.min() >= 1 and lengths.max() == packing.MAX_LENGTH  # the long tail reaches 32k, clipped
    assert 395 <= np.median(lengths) <= 405
    flat = packing.stream(lengths[:10])
    assert np.array_equal(flat, packing.token(np.arange(int(lengths[:10].sum()))))


def test_tbl_workload_packs_every_document_token(tmp_path):
    path = packing.write_dataset(str(tmp_path), 300)
    assert packing.write_dataset(str(tmp_path), 300) == path  # written once, reused
    lengths = packing.document_lengths(300)
    work = packing.tbl_packing(path, "best_fit")
    assert work.run_epoch(0) == int(lengths.sum()) == work.items_per_epoch
    rows = work.info["rows"]
    slots = rows * packing.SLOTS
    # Pieces share one token where a document is cut, so the rows' token slots are the stream plus the cuts.
    cuts = int(np.maximum(0, -(-(lengths - 1) // (packing.SLOTS - 1)) - 1).sum())
    assert work.info["padding_fraction"] == pytest.approx(1 - (lengths.sum() + cuts) / slots, abs=1e-12)


def test_grain_workload_packs_every_document_token():
    pytest.importorskip("grain")
    lengths = packing.document_lengths(300)
    work = packing.grain_packing(300, "first_fit")
    assert work.run_epoch(0) == int(lengths.sum())
    rows = work.info["rows"]
    assert work.info["padding_fraction"] == pytest.approx(1 - lengths.sum() / (rows * packing.SLOTS), abs=1e-12)
