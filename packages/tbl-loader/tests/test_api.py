"""The public API: sorted __all__, every name importable, torch not imported by the package."""

from __future__ import annotations

import subprocess
import sys

import tbl_loader


def test_all_is_sorted_and_complete():
    assert tbl_loader.__all__ == sorted(tbl_loader.__all__)
    for name in tbl_loader.__all__:
        assert hasattr(tbl_loader, name), name
    for name in ("ImageLoader", "Batch", "RandomResizedCrop", "EpochOrder", "StateMismatchError", "convert", "order"):
        assert name in tbl_loader.__all__


def test_import_does_not_import_torch():
    code = "import sys, tbl_loader; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
