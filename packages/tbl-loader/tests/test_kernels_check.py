"""The import-time check of the compiled kernels' version and ABI."""

from __future__ import annotations

import tomllib
import types
from pathlib import Path

import pytest

import tbl_kernels
from tbl_loader import _kernels


def _fake(version, abi):
    m = types.ModuleType("tbl_kernels")
    m.__version__ = version
    m.KERNELS_ABI = abi
    return m


def test_installed_kernels_pass():
    assert _kernels.kernels is tbl_kernels
    assert _kernels.check_kernels(tbl_kernels) is tbl_kernels


@pytest.mark.parametrize("version", ["0.1.0", "0.1.7", "0.1.2rc1", "0.1.3+local"])
def test_versions_in_range_pass(version):
    assert _kernels.check_kernels(_fake(version, _kernels.KERNELS_ABI)).__version__ == version


@pytest.mark.parametrize("version", ["0.0.9", "0.2.0", "1.0.0", "garbage", None])
def test_versions_out_of_range_name_versions_and_the_fix(version):
    with pytest.raises(ImportError) as info:
        _kernels.check_kernels(_fake(version, _kernels.KERNELS_ABI))
    msg = str(info.value)
    assert f"tbl-kernels {version} is installed" in msg
    assert "tbl-kernels>=0.1.0,<0.2" in msg
    assert 'pip install "tbl-kernels>=0.1.0,<0.2"' in msg


def test_abi_mismatch_names_both_abis_and_the_fix():
    ours, other = _kernels.KERNELS_ABI, _kernels.KERNELS_ABI + 1
    with pytest.raises(ImportError, match=rf"ABI {ours} but the installed tbl-kernels 0\.1\.0 has ABI {other}") as info:
        _kernels.check_kernels(_fake("0.1.0", other))
    assert 'pip install "tbl-kernels>=0.1.0,<0.2"' in str(info.value)


def test_pin_agrees_with_pyproject():
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    deps = [d.replace(" ", "") for d in pyproject["project"]["dependencies"]]
    assert _kernels.KERNELS_REQUIREMENT in deps
