"""The tbl-kernels release record (packages/tbl-kernels/RELEASES.toml) is true to the history.

Each release is a (version, ABI, commit) on main; kernels_matrix builds the
loader pin's MIN from its commit. These checks read the git history of this
clone, so they need one (a source tarball has no history to check against).
"""

from __future__ import annotations

import re
import subprocess
import tomllib

import pytest
from import_rules import PACKAGES, ROOT
from packaging.requirements import Requirement
from packaging.version import Version

RECORD = PACKAGES / "tbl-kernels" / "RELEASES.toml"
INIT = "packages/tbl-kernels/src/tbl_kernels/__init__.py"
RELEASES = tomllib.loads(RECORD.read_text())["release"]

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git history of a clone")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def _declared(init_text: str) -> tuple[str, int]:
    version = re.search(r'^__version__\s*=\s*"([^"]+)"', init_text, re.M).group(1)
    abi = int(re.search(r"^KERNELS_ABI\s*=\s*(\d+)", init_text, re.M).group(1))
    return version, abi


def test_versions_are_recorded_once_in_increasing_order():
    versions = [Version(r["version"]) for r in RELEASES]
    assert versions == sorted(set(versions)), versions


@pytest.mark.parametrize("release", RELEASES, ids=lambda r: r["version"])
def test_each_release_commit_is_on_main_and_declares_its_version_and_abi(release):
    commit = release["commit"]
    assert re.fullmatch(r"[0-9a-f]{40}", commit), f"record the full hash, not {commit!r}"
    assert _git("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0, f"{commit} is not in HEAD's history"
    shown = _git("show", f"{commit}:{INIT}")
    assert shown.returncode == 0, shown.stderr
    assert _declared(shown.stdout) == (release["version"], release["abi"])


def test_the_loader_pin_minimum_is_a_recorded_release():
    pyproject = tomllib.loads((PACKAGES / "tbl-loader" / "pyproject.toml").read_text())
    (pin,) = [r for r in map(Requirement, pyproject["project"]["dependencies"]) if r.name == "tbl-kernels"]
    (minimum,) = [Version(s.version) for s in pin.specifier if s.operator == ">="]
    assert minimum in {Version(r["version"]) for r in RELEASES}, f"tbl-kernels {minimum} is not in {RECORD.name}"


def test_a_released_version_keeps_its_sources():
    """Changing the kernels' code under a released version number would make two different 0.1.0s."""
    tree_version, tree_abi = _declared((ROOT / INIT).read_text())
    release = next((r for r in RELEASES if Version(r["version"]) == Version(tree_version)), None)
    if release is None:
        assert Version(tree_version) > max(Version(r["version"]) for r in RELEASES), "unreleased versions go up"
        return
    assert tree_abi == release["abi"]
    diff = _git("diff", "--stat", release["commit"], "--", "packages/tbl-kernels/src")
    assert diff.returncode == 0 and diff.stdout == "", (
        f"packages/tbl-kernels/src differs from tbl-kernels {tree_version}'s commit {release['commit']}; "
        f"bump the version (and KERNELS_ABI on a binding change):\n{diff.stdout}"
    )
