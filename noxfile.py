"""Every session a user or CI runs.

Packages are installed from their own directories, the way a user installs
them (non-editable, build isolation on), siblings from source. torch is pinned
to the CPU build that lies on the development machines' disk; any looser spec
would pull a multi-GB CUDA build.
"""

from __future__ import annotations

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
    session.install(TORCH, *TEST_DEPS)
    _install_packages(session, ALL_PACKAGES)
    _pytest(session, *[f"packages/{n}/tests" for n in ALL_PACKAGES], "tests")


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

