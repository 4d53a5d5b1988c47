"""tbl_bench.stats_overhead: epochs of one loader with the stage clocks on and off, in alternating order."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tbl_format

pytest.importorskip("tbl_loader")


@pytest.fixture(scope="module")
def fixed_path(tmp_path_factory):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (40, 16, 16, 3), dtype=np.uint8)
    return tbl_format.write([{"image": im, "label": np.int64(i % 3)} for i, im in enumerate(images)],
                            tmp_path_factory.mktemp("stats") / "fixed.tbl")


def test_pairs_alternate_the_clocks_and_only_the_on_epochs_are_timed(fixed_path, monkeypatch):
    from tbl_bench import stats_overhead
    from tbl_loader import ImageLoader

    sides, kernel_seconds = [], []
    original = ImageLoader.time_stages

    def recording(self, on=True):
        kernel_seconds.append(self.stats()["seconds"]["kernel"])
        sides.append(on)
        return original(self, on)

    monkeypatch.setattr(ImageLoader, "time_stages", recording)
    out = stats_overhead.measure(str(fixed_path), batch_size=8, pairs=3)
    assert sides == [True, False, False, True, True, False]  # on-off, off-on, on-off
    # The kernel seconds grow over an epoch with the clocks on and stay put over one with them off.
    grew = [b > a for a, b in zip(kernel_seconds, kernel_seconds[1:], strict=False)]
    assert grew == [True, False, False, True, True]
    assert len(out["pairs"]) == 3 and all(r["batches"] == 5 for r in out["pairs"])
    assert all(r["overhead"] == pytest.approx(r["on_s"] / r["off_s"] - 1) for r in out["pairs"])
    assert out["min_overhead"] <= out["median_overhead"] <= out["max_overhead"]


def test_cli_prints_every_pair_and_writes_json(fixed_path, tmp_path, capsys):
    from tbl_bench import stats_overhead

    assert stats_overhead.main([str(fixed_path), "--batch-size", "8", "--pairs", "2", "--crop", "12",
                                "--json", str(tmp_path / "o.json")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("pair ") == 2 and "the stage clocks cost" in printed
    saved = json.loads((tmp_path / "o.json").read_text())
    assert saved["crop"] == 12 and len(saved["pairs"]) == 2 and len(saved["load_before"]) == 3
