"""The monorepo's structural contracts, checked statically from the sources.

- Dependency direction (no cycles): tbl-format <- tbl-loader <- tbl-resident,
  tbl-kernels <- tbl-loader, everything <- tbl-bench.
- Nothing imports another package's private (underscore) modules, and across
  packages only names in the target's ``__all__`` are used (or in the ``__all__``
  of a submodule that the target's ``__all__`` exports, such as ``tbl_loader.stream.order``).
- Every sibling a package imports is declared in its pyproject.
- tbl-format imports neither numpy nor torch at module level (a data-prep box
  has neither), and torch is imported at module level only where it is needed.
- Every package's ``__all__`` is sorted.
- The loader's pin on tbl-kernels agrees with the kernels' version.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from import_rules import IMPORT_NAME, PACKAGES, ROOT, module_files, package_dir, sibling_violations
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ALLOWED_DEPS = {
    "tbl_format": set(),
    "tbl_kernels": set(),
    "tbl_loader": {"tbl_format", "tbl_kernels"},
    "tbl_resident": {"tbl_format", "tbl_kernels", "tbl_loader"},
    "tbl_bench": {"tbl_format", "tbl_kernels", "tbl_loader", "tbl_resident"},
}


def _sources(module: str) -> list[Path]:
    return sorted(package_dir(module).rglob("*.py"))


def _imports(path: Path, *, module_level_only: bool = False) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


@pytest.mark.parametrize("module", sorted(ALLOWED_DEPS))
def test_dependency_direction_and_no_private_imports(module):
    problems = []
    for path in _sources(module):
        for name, line in _imports(path):
            top = name.split(".")[0]
            if top in ALLOWED_DEPS and top != module:
                if top not in ALLOWED_DEPS[module]:
                    problems.append(f"{path.relative_to(ROOT)}:{line} imports {top} (not a dependency)")
                private = [p for p in name.split(".")[1:] if p.startswith("_") and not p.startswith("__")]
                if private:
                    problems.append(f"{path.relative_to(ROOT)}:{line} imports private {name}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", sorted(ALLOWED_DEPS))
def test_siblings_are_used_only_through_their_public_names(module):
    problems = [p for path in _sources(module) for p in sibling_violations(path, module)]
    assert not problems, "\n".join(problems)


def _declared(dist: str) -> set[str]:
    project = tomllib.loads((PACKAGES / dist / "pyproject.toml").read_text())["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    names = {re.match(r"[A-Za-z0-9_.-]+", spec).group(0).lower() for spec in specs}
    return {IMPORT_NAME[n] for n in names if n in IMPORT_NAME}


@pytest.mark.parametrize("dist", sorted(IMPORT_NAME))
def test_every_imported_sibling_is_declared(dist):
    module = IMPORT_NAME[dist]
    used = {name.split(".")[0] for path in _sources(module) for name, _ in _imports(path)}
    missing = (used & set(IMPORT_NAME.values())) - {module} - _declared(dist)
    assert not missing, f"{dist} imports {sorted(missing)} without declaring them in its pyproject"


def _fake_siblings(tmp_path) -> Path:
    """A tree with a sibling package ``tbl_loader`` whose ``__all__`` exports ``Good`` and the submodule ``order``."""
    src = tmp_path / "tbl-loader" / "src" / "tbl_loader"
    src.mkdir(parents=True)
    (src / "__init__.py").write_text('__all__ = ["Good", "order"]\n')
    (src / "order.py").write_text('__all__ = ["EpochOrder"]\n')
    (src / "output.py").write_text('__all__ = ["OutputSpec"]\n')
    return tmp_path


@pytest.mark.parametrize(
    ("source", "rejected"),
    [
        ("from tbl_loader import Good\nfrom tbl_loader.order import EpochOrder\n", None),
        ("import tbl_loader\ntbl_loader.Good\ntbl_loader.order\n", None),
        ("from tbl_loader import order\norder.EpochOrder\n", None),
        ("from tbl_loader import Hidden\n", "tbl_loader.Hidden"),
        ("from tbl_loader.output import OutputSpec\n", "tbl_loader.output"),
        ("from tbl_loader.order import BatchPlan\n", "tbl_loader.order.BatchPlan"),
        ("import tbl_loader\ntbl_loader.output\n", "tbl_loader.output"),
        ("import tbl_loader.output as out\n", "tbl_loader.output"),
        ("from tbl_loader import order\norder.BatchPlan\n", "tbl_loader.order.BatchPlan"),
    ],
)
def test_the_boundary_rule_rejects_names_outside_all(tmp_path, source, rejected):
    packages = _fake_siblings(tmp_path / "packages")
    user = tmp_path / "user.py"
    user.write_text(source)
    problems = sibling_violations(user, "tbl_resident", packages)
    if rejected is None:
        assert problems == []
    else:
        assert len(problems) == 1 and f"uses {rejected}" in problems[0], problems


def test_tbl_format_needs_neither_numpy_nor_torch_at_import():
    problems = [
        f"{path.relative_to(ROOT)}:{line} imports {name} at module level"
        for path in _sources("tbl_format")
        for name, line in _imports(path, module_level_only=True)
        if name.split(".")[0] in {"numpy", "torch", "lz4"}
    ]
    assert not problems, "\n".join(problems)


def test_kernels_never_import_torch():
    problems = [
        f"{path.relative_to(ROOT)}:{line} imports torch"
        for path in _sources("tbl_kernels")
        for name, line in _imports(path)
        if name.split(".")[0] == "torch"
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("module", sorted(ALLOWED_DEPS))
def test_public_api_is_sorted(module):
    init = next(p for p in _sources(module) if p.name == "__init__.py" and p.parent.name == module)
    tree = ast.parse(init.read_text())
    exported = [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    ]
    assert exported, f"{module} has no __all__"
    names = ast.literal_eval(exported[0])
    assert names == sorted(names), f"{module}.__all__ is not sorted"
    assert len(names) == len(set(names)), f"{module}.__all__ has duplicates"


def _version(dist: str) -> tuple[int, ...]:
    files = module_files(package_dir(IMPORT_NAME[dist]))
    texts = [files[name].read_text() for name in files if name.split(".")[-1] in (IMPORT_NAME[dist], "version")]
    match = next((m for m in (re.search(r'^__version__\s*=\s*"([^"]+)"', t, re.M) for t in texts) if m), None)
    if match is None:  # the compiled package may keep its version next to the build files
        pyproject = tomllib.loads((PACKAGES / dist / "pyproject.toml").read_text())
        version = pyproject["project"]["version"]
    else:
        version = match.group(1)
    return tuple(int(p) for p in version.split(".")[:3])


def _pin(dependent: str, dependency: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(MIN, NEXT) of ``dependent``'s ``>=MIN,<NEXT`` dependency on ``dependency``, from its pyproject."""
    pyproject = tomllib.loads((PACKAGES / dependent / "pyproject.toml").read_text())
    (requirement,) = [
        r for r in map(Requirement, pyproject["project"]["dependencies"]) if canonicalize_name(r.name) == dependency
    ]
    bounds = {s.operator: Version(s.version).release for s in requirement.specifier}
    assert set(bounds) == {">=", "<"}, f"{dependent} must pin {dependency} as >=MIN,<NEXT (got {requirement})"
    return bounds[">="], bounds["<"]


@pytest.mark.parametrize(
    ("dependent", "dependency"),
    [("tbl-loader", "tbl-kernels"), ("tbl-loader", "tbl-format"), ("tbl-resident", "tbl-loader")],
)
def test_sibling_pins_admit_the_sibling_in_this_tree(dependent, dependency):
    low, high = _pin(dependent, dependency)
    current = _version(dependency)
    assert low <= current < high, f"{dependent} pins {dependency} to [{low}, {high}) but the tree has {current}"
    # "<NEXT_MINOR": the upper bound is the minor after the tree's (the newest series the
    # dependent supports); MIN may be an older series it still supports (tbl-loader
    # runs on tbl-kernels 0.1 and 0.2, see docs/versioning.md).
    assert high == (current[0], current[1] + 1), f"{dependent}'s pin on {dependency} should end at the next minor"
