"""tbl convert's progress bar is optional (the `progress` extra): without tqdm a conversion runs with no bar."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("skimage")

from convert_images import jpeg_set, write_tree

import tbl_format
from tbl_loader.conversion.images import convert


def _convert(tmp_path: Path, name: str) -> np.ndarray:
    files = {f"n0001_cat/img_{i:03d}.JPEG": d for i, d in enumerate(jpeg_set(6, seed=3))}
    root = write_tree(tmp_path / f"src-{name}", files)
    rep = convert(root, tmp_path / f"{name}.tbl", 32, workers=1, progress=True, report=False)
    assert rep.written == 6 and rep.failed == 0
    ds = tbl_format.open(tmp_path / f"{name}.tbl")
    try:
        return np.concatenate([np.array(a) for a in ds.segments("image")])
    finally:
        ds.close()


def test_progress_without_tqdm_runs_with_no_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    with_bar = _convert(tmp_path, "bar")
    assert "convert" in capsys.readouterr().err  # tqdm drew its bar on stderr
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ImportError
    without_bar = _convert(tmp_path, "nobar")
    assert capsys.readouterr().err == ""
    assert np.array_equal(with_bar, without_bar)
