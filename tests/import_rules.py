"""Static import rules of the monorepo, read from the sources with ``ast`` (nothing is imported).

- :func:`import_graph` / :func:`cycles`: the module import graph of one package,
  function-level imports included, and its cycles.
- :func:`sibling_violations`: uses of another package's names that are not in
  that package's ``__all__`` (or in the ``__all__`` of a submodule the package
  itself exports).

Used by ``test_import_graph.py`` and ``test_package_boundaries.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"

IMPORT_NAME = {
    "tbl-format": "tbl_format",
    "tbl-kernels": "tbl_kernels",
    "tbl-loader": "tbl_loader",
    "tbl-resident": "tbl_resident",
    "tbl-bench": "tbl_bench",
}


def package_dir(module: str, packages: Path = PACKAGES) -> Path:
    dist = next(d for d, m in IMPORT_NAME.items() if m == module)
    return packages / dist / "src" / module


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for the package whose directory is ``root``."""
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(parts)] = path
    return files


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(path: Path, importer: str, is_package: bool) -> list[tuple[str, list[str], int]]:
    """Every import in the file, at any depth: (module, names taken from it, line)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((_resolve(importer, is_package, node), [a.name for a in node.names], node.lineno))
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Edges between the modules of one package, function-level imports included.

    ``import pkg.a`` and ``from pkg.a import x`` give an edge to ``pkg.a``, and to
    ``pkg.a.x`` when that is a module. ``from pkg import sub`` inside ``pkg`` (an
    ancestor package, already being imported) gives only the edge to the
    submodule; taking any other name from an ancestor's ``__init__`` is an edge to it.
    """
    files = module_files(root)
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for target, names, _ in imported_modules(path, name, path.name == "__init__.py"):
            submodules = [f"{target}.{taken}" for taken in names if f"{target}.{taken}" in files]
            graph[name].update(sub for sub in submodules if sub != name)
            is_ancestor = name.startswith(target + ".")
            if target in files and target != name and (not is_ancestor or len(submodules) < len(names) or not names):
                graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@cache
def _declared_all(path: Path) -> frozenset[str] | None:
    """The literal ``__all__`` of a module file, or None when it has none."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    return None


def public_names(module: str, packages: Path = PACKAGES) -> frozenset[str] | None:
    """``__all__`` of ``module`` ("pkg" or "pkg.sub"), or None when it is not a public module of a sibling:
    a submodule is public only when its package's ``__all__`` exports it."""
    top, _, rest = module.partition(".")
    root = package_dir(top, packages)
    files = module_files(root)
    if not rest:
        return _declared_all(files[top])
    parent_all = _declared_all(files[top]) or frozenset()
    if "." in rest or rest not in parent_all or module not in files:
        return None
    return _declared_all(files[module]) or frozenset()


def _attribute_uses(tree: ast.AST, aliases: dict[str, str]) -> Iterable[tuple[str, str, int]]:
    """(module, attribute, line) for every ``alias.attribute`` where ``alias`` names a sibling module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            yield aliases[node.value.id], node.attr, node.lineno


def sibling_violations(path: Path, own: str, packages: Path = PACKAGES) -> list[str]:
    """Uses in ``path`` (a module of package ``own``) of sibling names outside their ``__all__``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    siblings = set(IMPORT_NAME.values()) - {own}
    problems: list[str] = []
    aliases: dict[str, str] = {}  # local name -> sibling module it is bound to

    def check(module: str, name: str, line: int) -> None:
        allowed = public_names(module, packages)
        if allowed is None:
            problems.append(f"{path}:{line} uses {module}, which is not a public module of its package")
        elif name not in allowed:
            problems.append(f"{path}:{line} uses {module}.{name}, which is not in {module}.__all__")

    def check_path(dotted: str, line: int) -> bool:
        """A dotted module path ``pkg.sub`` must be a public submodule; True when it may be read further."""
        if "." not in dotted:
            return True
        parent, _, sub = dotted.rpartition(".")
        check(parent, sub, line)
        return public_names(dotted, packages) is not None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if a.name.split(".")[0] in siblings):
                check_path(alias.name, node.lineno)
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in siblings:
            if not check_path(node.module, node.lineno):
                continue  # reported once, for the module
            for alias in node.names:
                check(node.module, alias.name, node.lineno)
                sub = f"{node.module}.{alias.name}"
                if "." not in node.module and public_names(sub, packages) is not None:
                    aliases[alias.asname or alias.name] = sub
    for module, attr, line in _attribute_uses(tree, aliases):
        check(module, attr, line)
    return sorted(set(problems))
