"""Every session a user or CI runs.

Packages are installed from their own directories, the way a user installs
them (non-editable, build isolation on), siblings from source. torch is pinned
to the CPU build that lies on the development machines' disk; any looser spec
would pull a multi-GB CUDA build.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import nox

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


def _kernels_pin() -> tuple[str, str]:
    """(MIN, NEXT_MINOR) of tbl-loader's pin on tbl-kernels, read from its metadata."""
    meta = tomllib.loads((PKG / "tbl-loader" / "pyproject.toml").read_text())
    spec = next(d for d in meta["project"]["dependencies"] if d.startswith("tbl-kernels"))
    low, high = re.search(r">=\s*([\d.]+)", spec), re.search(r"<\s*([\d.]+)", spec)
    return low.group(1), high.group(1)


def _kernels_in_tree_version() -> str:
    text = (PKG / "tbl-kernels" / "src" / "tbl_kernels" / "__init__.py").read_text()
    return re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M).group(1)


@nox.session(python="3.11")
@nox.parametrize("kernels", ["oldest", "newest"])
def kernels_matrix(session: nox.Session, kernels: str) -> None:
    """tbl-loader's tests against the oldest and the newest tbl-kernels its pin admits.

    newest is the tree's tbl-kernels. oldest is the pin's MIN: the tree's own
    sources when they are at MIN, otherwise the sources of the release tag
    ``tbl-kernels-vMIN`` (exported with git archive, never a moving branch).
    """
    minimum, _ = _kernels_pin()
    source = PKG / "tbl-kernels"
    if kernels == "oldest" and _kernels_in_tree_version() != minimum:
        tag = f"tbl-kernels-v{minimum}"
        tmp = Path(session.create_tmp()) / tag
        tmp.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", tag, "packages/tbl-kernels"], cwd=ROOT, capture_output=True)
        if archive.returncode != 0:
            session.error(f"cannot test the oldest supported kernels: git tag {tag} is missing")
        subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive.stdout, check=True)
        source = tmp / "packages" / "tbl-kernels"
    session.install(TORCH, *TEST_DEPS, "scikit-image")
    session.install(str(source))
    _install_packages(session, ["tbl-format", "tbl-loader"])
    session.run("python", "-c", "import tbl_kernels, tbl_loader; print('tbl-kernels', tbl_kernels.__version__)")
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

