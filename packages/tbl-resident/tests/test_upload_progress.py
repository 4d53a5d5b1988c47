"""The upload's progress bar is optional (the `progress` extra): without tqdm an upload runs with no bar."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from tbl_resident.upload import upload_rows


def _upload() -> torch.Tensor:
    segments = [np.arange(60, dtype=np.uint8).reshape(6, 10), np.arange(60, 100, dtype=np.uint8).reshape(4, 10)]
    dst = torch.empty((10, 10), dtype=torch.uint8)
    stats = upload_rows(segments, dst, chunk_bytes=30, progress=True)
    assert stats.bytes == 100
    return dst


def test_upload_without_tqdm_runs_with_no_bar(capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    with_bar = _upload()
    assert "upload" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now raises ImportError
    without_bar = _upload()
    assert capsys.readouterr().err == ""
    assert torch.equal(with_bar, without_bar)
    assert torch.equal(without_bar, torch.arange(100, dtype=torch.uint8).reshape(10, 10))
