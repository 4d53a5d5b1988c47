"""`tbl --version` names every installed TBL distribution and its version, one per line, from the metadata."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distributions

import tbl_format


def _installed_tbl() -> dict[str, str]:
    found = {}
    for dist in distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("tbl-"):
            found[name] = dist.version
    return found


def test_version_lists_every_installed_tbl_distribution() -> None:
    run = subprocess.run([sys.executable, "-m", "tbl_format.cli", "--version"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == ""
    lines = run.stdout.splitlines()
    assert lines == sorted(lines)
    printed = dict(line.split(" ") for line in lines)
    expected = {"tbl-format": tbl_format.__version__, **_installed_tbl()}
    assert printed == expected
    assert printed["tbl-format"] == tbl_format.__version__
