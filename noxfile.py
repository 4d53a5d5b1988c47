"""Every session a user or CI runs.

Packages are installed from their own directories, the way a user installs
them (non-editable, build isolation on), siblings from source. torch is pinned
to the CPU build that lies on the development machines' disk; any looser spec
would pull a multi-GB CUDA build.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import nox
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).parent
PKG = ROOT / "packages"
TORCH = "torch==2.13.0"
TEST_DEPS = ["pytest>=8", "hypothesis>=6"]

# Order matters: each package after the ones it depends on.
ALL_PACKAGES = ["tbl-format", "tbl-kernels", "tbl-loader", "tbl-resident", "tbl-bench"]

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False


def _install_packages(session: nox.Session, names: list[str], *extra: str) -> None:
    session.install(*[str(PKG / n) for n in names], *extra)


def _pytest(session: nox.Session, *paths: str) -> None:
    """Run pytest; exit status 5 (nothing collected) is not a failure, any other is."""
    args = ["-q", "-p", "no:cacheprovider", *paths, *session.posargs]
    session.run("python", "-m", "pytest", *args, success_codes=[0, 5])


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """All packages installed from their own directories; every package's tests and the cross-package tests."""
    session.install(TORCH, *TEST_DEPS, "scikit-image", "scikit-learn")
    _install_packages(session, ALL_PACKAGES)
    # One pytest run per package: test modules of different packages may share a
    # basename, which one pytest run over all of them would refuse to import.
    for name in ALL_PACKAGES:
        _pytest(session, f"packages/{name}/tests")
    _pytest(session, "tests")


@nox.session(python="3.11")
def format_only(session: nox.Session) -> None:
    """tbl-format alone, in a venv with neither numpy nor torch: its tests pass."""
    session.install(*TEST_DEPS)
    _install_packages(session, ["tbl-format"])
    session.run(
        "python", "-c",
        "import importlib.util as u, sys; "
        "bad = [m for m in ('numpy', 'torch') if u.find_spec(m)]; "
        "sys.exit(f'format_only venv must not contain {bad}' if bad else 0)",
    )
    _pytest(session, "packages/tbl-format/tests")


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install("ruff")
    session.run("ruff", "check", ".")


KERNELS_RELEASES = PKG / "tbl-kernels" / "RELEASES.toml"


def _kernels_pin() -> str:
    """MIN of tbl-loader's ``tbl-kernels>=MIN,<NEXT`` dependency, read from its pyproject (the pin's one home)."""
    meta = tomllib.loads((PKG / "tbl-loader" / "pyproject.toml").read_text())
    (pin,) = [r for r in map(Requirement, meta["project"]["dependencies"]) if r.name == "tbl-kernels"]
    (minimum,) = [s.version for s in pin.specifier if s.operator == ">="]
    return str(Version(minimum))


def _kernels_in_tree_version() -> str:
    """The tree's tbl-kernels version, read the way its build reads it (the regex in its pyproject)."""
    text = (PKG / "tbl-kernels" / "src" / "tbl_kernels" / "__init__.py").read_text()
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M).group(1)


def _kernels_release_commit(version: str) -> str:
    """The commit on main recorded in RELEASES.toml as the source of tbl-kernels ``version``."""
    releases = tomllib.loads(KERNELS_RELEASES.read_text())["release"]
    commits = [r["commit"] for r in releases if Version(r["version"]) == Version(version)]
    if len(commits) != 1:
        raise ValueError(f"{KERNELS_RELEASES.relative_to(ROOT)} must record tbl-kernels {version} once")
    return commits[0]


def _export_kernels(session: nox.Session, commit: str) -> Path:
    """packages/tbl-kernels as it is at ``commit``, exported with git archive into the session's tmp dir."""
    dest = Path(session.create_tmp()) / f"tbl-kernels-{commit[:12]}"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", commit, "packages/tbl-kernels"], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        session.error(
            f"cannot export tbl-kernels from commit {commit} (RELEASES.toml): {archive.stderr.decode().strip()}; "
            "a shallow clone needs `git fetch --unshallow`"
        )
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "packages" / "tbl-kernels"


@nox.session(python="3.11")
@nox.parametrize("kernels", ["oldest", "newest"])
def kernels_matrix(session: nox.Session, kernels: str) -> None:
    """tbl-loader's tests against the oldest and the newest tbl-kernels its pin admits.

    newest is the tree's tbl-kernels. oldest is the pin's MIN, built from the
    commit that RELEASES.toml records for it (git archive; no tag, no branch).
    """
    if kernels == "oldest":
        expected = _kernels_pin()
        source = _export_kernels(session, _kernels_release_commit(expected))
    else:
        expected, source = _kernels_in_tree_version(), PKG / "tbl-kernels"
    session.install(TORCH, *TEST_DEPS)
    session.install(str(source))
    # The loader's lz4 extra: its tests read LZ4-compressed columns.
    _install_packages(session, ["tbl-format"], str(PKG / "tbl-loader") + "[lz4]")
    session.run(
        "python", "-c",
        "import sys, tbl_kernels, tbl_loader; v = tbl_kernels.__version__; print('tbl-kernels', v); "
        f"sys.exit(0 if v == {expected!r} else f'expected tbl-kernels {expected}, got {{v}}')",
    )
    _pytest(session, "packages/tbl-loader/tests")


@nox.session(python="3.11")
def demo(session: nox.Session) -> None:
    """The README's first command: make a small real-photo dataset, convert it, serve epochs, compare."""
    session.install(TORCH)
    _install_packages(session, ALL_PACKAGES)
    session.run("python", "-m", "tbl_bench.demo", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Every benchmark suite (each configuration in its own subprocess); JSON, markdown and charts."""
    session.install(TORCH)
    _install_packages(session, ALL_PACKAGES)
    session.run("tbl", "bench", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session(python="3.11")
def bench_peers(session: nox.Session) -> None:
    """The benchmark suites with the peer tools installed (TurboLoader, litdata, FFCV when it imports)."""
    session.install(TORCH)
    _install_packages(session, ALL_PACKAGES)
    session.install(str(PKG / "tbl-bench") + "[peers]")
    session.run("tbl", "bench", "--peers", *session.posargs, env={"PYTHONUNBUFFERED": "1"})

