"""The sample photos are the `photos` extra: without scikit-image / scikit-learn a named error gives the pip command."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tbl_bench import data, sample


@pytest.mark.parametrize(("module", "dist"), [("skimage", "scikit-image"), ("sklearn", "scikit-learn")])
def test_missing_photo_package_names_the_pip_command(module: str, dist: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    data.load_source_photos.cache_clear()
    try:
        with pytest.raises(data.PhotosUnavailableError, match=r"pip install 'tbl-bench\[photos\]'") as info:
            data.make_image_tar(tmp_path / "x.tar", 2, workers=1)
        assert info.value.missing == dist
        assert not (tmp_path / "x.tar").exists()
        assert sample.main([str(tmp_path / "y.tar"), "--images", "2", "--workers", "1"]) == 2
        err = capsys.readouterr().err
        assert dist in err and "tbl-bench[photos]" in err and "Traceback" not in err
    finally:
        data.load_source_photos.cache_clear()  # the next test loads the real photos again
