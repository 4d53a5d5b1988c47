from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import tbl_kernels
from tbl_loader import _kernels

PIN = _kernels.KernelsPin(minimum=(0, 1, 0), below=(0, 4))
FIX = 'pip install "tbl-kernels>=0.1.0,<0.4" (from a TBL checkout: pip install ./packages/tbl-kernels)'


def _abi(version):
    return _kernels.KERNELS_ABIS[tuple(int(v) for v in version.split("+")[0].split("rc")[0].split(".")[:2])]


def _fake(version, abi):
    m = types.ModuleType("tbl_kernels")
    m.__version__ = version
    m.KERNELS_ABI = abi
    return m


def test_installed_kernels_pass():
    assert _kernels.kernels is tbl_kernels
    assert _kernels.check_kernels(tbl_kernels) is tbl_kernels


def test_the_pin_is_the_pyproject_dependency():
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    (declared,) = [Requirement(d) for d in pyproject["project"]["dependencies"] if d.startswith("tbl-kernels")]
    assert Requirement(_kernels.KERNELS_PIN.requirement) == declared


@pytest.mark.parametrize(
    ("requirements", "minimum", "below"),
    [
        (["numpy>=1.24", "tbl-kernels>=0.1.0,<0.2"], (0, 1, 0), (0, 2)),
        (["tbl-kernels<0.2,>=0.1.0", "tbl-format<0.2,>=0.1.0"], (0, 1, 0), (0, 2)),
        (["tbl_kernels >= 0.1.3 , < 0.3"], (0, 1, 3), (0, 3)),
        (["TBL.Kernels>=1.0.0,<1.1"], (1, 0, 0), (1, 1)),
    ],
)
def test_parse_kernels_pin(requirements, minimum, below):
    assert _kernels.parse_kernels_pin(requirements) == _kernels.KernelsPin(minimum, below)


@pytest.mark.parametrize(
    "requirements",
    [
        [],
        ["tbl-kernels-extra>=0.1.0,<0.2"],
        ["tbl-kernels>=0.1.0"],
        ["tbl-kernels==0.1.0"],
        ["tbl-kernels>=0.1.0,<0.2,!=0.1.1"],
        ["tbl-kernels>=0.1.0,<=0.2"],
        ["tbl-kernels>=0.1.0,<0.2; python_version >= '3.11'"],
        ["tbl-kernels>=0.1.0,<0.2", "tbl-kernels>=0.1.0,<0.2"],
    ],
)
def test_parse_kernels_pin_refuses_other_forms(requirements):
    with pytest.raises(ValueError, match="tbl-kernels"):
        _kernels.parse_kernels_pin(requirements)


@pytest.mark.parametrize(
    "version",
    ["0.0.9", "0.1.0", "0.1.7", "0.1.2rc1", "0.1.3+local", "0.2.0rc1", "0.2.0", "0.3.0", "0.4.0", "0.10.0", "1.0.0"],
)
def test_admits_agrees_with_packaging(version):
    specifier = Requirement(PIN.requirement).specifier
    assert PIN.admits(version) == specifier.contains(Version(version), prereleases=True)


def test_every_admitted_series_has_a_known_abi():
    """The pin and KERNELS_ABIS move together: a series the pin admits without a known ABI would fail at import."""
    pin = _kernels.KERNELS_PIN
    series = [(0, minor) for minor in range(pin.minimum[1], pin.below[1])]
    assert pin.minimum[0] == pin.below[0] == 0 and series
    assert sorted(_kernels.KERNELS_ABIS) == series


@pytest.mark.parametrize("version", ["0.1.0", "0.1.7", "0.1.2rc1", "0.1.3+local", "0.2.0", "0.2.5", "0.3.0", "0.3.1"])
def test_versions_in_range_pass(version):
    assert _kernels.check_kernels(_fake(version, _abi(version)), PIN).__version__ == version


@pytest.mark.parametrize("version", ["0.0.9", "0.4.0", "1.0.0", "garbage", None])
def test_versions_out_of_range_name_versions_and_the_fix(version):
    with pytest.raises(ImportError) as info:
        _kernels.check_kernels(_fake(version, 3), PIN)
    assert str(info.value) == (
        f"tbl-loader needs tbl-kernels>=0.1.0,<0.4 but tbl-kernels {version} is installed; fix it with: {FIX}"
    )


@pytest.mark.parametrize(("version", "ours", "other"), [("0.1.0", 2, 3), ("0.2.0", 3, 2), ("0.2.1", 3, 4), ("0.3.0", 4, 3)])
def test_abi_mismatch_names_both_abis_and_the_fix(version, ours, other):
    with pytest.raises(ImportError) as info:
        _kernels.check_kernels(_fake(version, other), PIN)
    assert str(info.value) == (
        f"tbl-loader expects tbl-kernels {version} to have binding ABI {ours} but it has ABI {other}; "
        f"fix it with: {FIX}"
    )


def _with_per_sample(module, names=("crop_resize_images", "resize_crop_images")):
    for name in names:
        setattr(module, name, lambda *args: None)
    return module


def test_per_sample_kernels_name_the_upgrade_on_old_kernels():
    assert _kernels.per_sample_kernels(_with_per_sample(_fake("0.2.0", 3))).__version__ == "0.2.0"
    with pytest.raises(_kernels.KernelsFeatureError) as info:
        _kernels.per_sample_kernels(_fake("0.1.0", 2))
    assert str(info.value) == (
        "variable-size images need tbl-kernels 0.2 or newer (crop_resize_images, resize_crop_images) but "
        'tbl-kernels 0.1.0 is installed; fix it with: pip install "tbl-kernels>=0.2.0,<0.4" (from a TBL checkout: '
        "pip install ./packages/tbl-kernels)"
    )
    assert isinstance(info.value, ImportError)


def test_per_sample_kernels_need_resize_crop_images_too():
    """An ABI 3 build from before resize_crop_images was added (0.2.0 unreleased) is refused by name."""
    early = _with_per_sample(_fake("0.2.0", 3), ("crop_resize_images",))
    with pytest.raises(_kernels.KernelsFeatureError, match=r"\(resize_crop_images\) but tbl-kernels 0.2.0"):
        _kernels.per_sample_kernels(early)


def test_the_installed_kernels_have_what_their_abi_promises():
    """Run in both legs of the kernels matrix: 0.1 (ABI 2) lacks crop_resize_images, 0.2 (ABI 3) has it."""
    has = hasattr(tbl_kernels, "crop_resize_images")
    assert has == (tbl_kernels.KERNELS_ABI >= 3) == hasattr(tbl_kernels, "resize_crop_images")
    if has:
        assert _kernels.per_sample_kernels() is tbl_kernels
    else:
        with pytest.raises(_kernels.KernelsFeatureError):
            _kernels.per_sample_kernels()


@pytest.mark.parametrize(
    ("version", "abi", "expected"),
    [
        ("0.4.0", 4, "but tbl-kernels 0.4.0 is installed; fix it with: "),
        ("0.1.0", 99, "to have binding ABI 2 but it has ABI 99; fix it with: "),
    ],
)
def test_importing_the_loader_with_other_kernels_fails_with_the_fix(tmp_path, version, abi, expected):
    """What a user sees: ``import tbl_loader`` with a tbl_kernels outside the pin installed first on the path."""
    fake = tmp_path / "tbl_kernels"
    fake.mkdir()
    (fake / "__init__.py").write_text(f'__version__ = "{version}"\nKERNELS_ABI = {abi}\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", "import tbl_loader"], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: tbl-loader ") and last.endswith(expected + _kernels.KERNELS_PIN.fix), last


def test_jpeg_decode_kernels_are_optional():
    """The JPEG decode in the batch pass is used where the kernels have it (0.3, ABI 4); older kernels get None
    (JPEG storage is then decoded in a thread pool), never an error."""
    assert _kernels.jpeg_decode_kernels(_fake("0.2.0", 3)) is None
    assert _kernels.jpeg_decode_kernels(_fake("0.3.0", 4)) is None  # an ABI 4 module lacking the calls
    full = _fake("0.3.0", 4)
    for name in _kernels.JPEG_DECODE_FUNCTIONS:
        setattr(full, name, lambda *args: None)
    assert _kernels.jpeg_decode_kernels(full) is full
    has = hasattr(tbl_kernels, "decode_crop_resize_jpegs")
    assert has == (tbl_kernels.KERNELS_ABI >= 4)
    assert (_kernels.jpeg_decode_kernels() is tbl_kernels) == has
