"""The monorepo's structural contracts, checked statically from the sources.

- Dependency direction (no cycles): tbl-format <- tbl-loader <- tbl-resident,
  tbl-kernels <- tbl-loader, everything <- tbl-bench.
- Nothing imports another package's private (underscore) modules.
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

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"

IMPORT_NAME = {
    "tbl-format": "tbl_format",
    "tbl-kernels": "tbl_kernels",
    "tbl-loader": "tbl_loader",
    "tbl-resident": "tbl_resident",
    "tbl-bench": "tbl_bench",
}
ALLOWED_DEPS = {
    "tbl_format": set(),
    "tbl_kernels": set(),
    "tbl_loader": {"tbl_format", "tbl_kernels"},
    "tbl_resident": {"tbl_format", "tbl_kernels", "tbl_loader"},
    "tbl_bench": {"tbl_format", "tbl_kernels", "tbl_loader", "tbl_resident"},
}


def _sources(module: str) -> list[Path]:
    dist = next(d for d, m in IMPORT_NAME.items() if m == module)
    return sorted((PACKAGES / dist / "src" / module).rglob("*.py"))


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
    module = IMPORT_NAME[dist]
    text = (PACKAGES / dist / "src" / module / "__init__.py").read_text()
    match = re.search(r'^__version__\s*=\s*"([^"]+)"', text, re.M)
    if match is None:  # the compiled package may keep its version next to the build files
        pyproject = tomllib.loads((PACKAGES / dist / "pyproject.toml").read_text())
        version = pyproject["project"]["version"]
    else:
        version = match.group(1)
    return tuple(int(p) for p in version.split(".")[:3])


def _pin(dependent: str, dependency: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    pyproject = tomllib.loads((PACKAGES / dependent / "pyproject.toml").read_text())
    spec = next(d for d in pyproject["project"]["dependencies"] if d.startswith(dependency))
    low = re.search(r">=\s*([\d.]+)", spec)
    high = re.search(r"<\s*([\d.]+)", spec)
    assert low and high, f"{dependent} must pin {dependency} as >=MIN,<NEXT (got {spec!r})"
    return tuple(int(p) for p in low.group(1).split(".")), tuple(int(p) for p in high.group(1).split("."))


@pytest.mark.parametrize(
    ("dependent", "dependency"),
    [("tbl-loader", "tbl-kernels"), ("tbl-loader", "tbl-format"), ("tbl-resident", "tbl-loader")],
)
def test_sibling_pins_admit_the_sibling_in_this_tree(dependent, dependency):
    low, high = _pin(dependent, dependency)
    current = _version(dependency)
    assert low <= current < high, f"{dependent} pins {dependency} to [{low}, {high}) but the tree has {current}"
    # "<NEXT_MINOR": the upper bound is the next minor of the lower bound.
    assert high == (low[0], low[1] + 1), f"{dependent}'s pin on {dependency} should end at the next minor"
