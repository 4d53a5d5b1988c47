"""No package has an import cycle among its modules, function-level imports included.

A cycle broken only by importing inside a function still couples the modules
both ways and makes import order matter; the graph is built from the sources
(``import_rules.import_graph``), so such imports count.
"""

from __future__ import annotations

import pytest
from import_rules import IMPORT_NAME, cycles, import_graph, package_dir


@pytest.mark.parametrize("module", sorted(IMPORT_NAME.values()))
def test_package_import_graph_is_acyclic(module):
    graph = import_graph(package_dir(module))
    assert len(graph) > 1, f"no modules found for {module}"
    found = cycles(graph)
    assert not found, f"{module} has import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def _package(tmp_path, files: dict[str, str]):
    root = tmp_path / "pkg"
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from .a import f\n",
        "a.py": "from .b import g\ndef f():\n    return g()\n",
        "b.py": "def g():\n    from .a import f  # hidden in a function\n    return f\n",
    })
    assert cycles(import_graph(root)) == [["pkg.a", "pkg.b"]]


def test_taking_a_submodule_from_the_own_package_is_not_a_cycle_but_a_name_from_init_is(tmp_path):
    root = _package(tmp_path, {
        "__init__.py": "from . import a\nfrom .b import VERSION\n",
        "a.py": "from . import b\n",
        "b.py": "VERSION = 1\n",
    })
    assert cycles(import_graph(root)) == []
    (root / "b.py").write_text("from pkg import a\nVERSION = 1\n")
    assert cycles(import_graph(root)) == [["pkg.a", "pkg.b"]]
    (root / "b.py").write_text("from . import VERSION_ELSEWHERE\n")
    assert cycles(import_graph(root)) == [["pkg", "pkg.a", "pkg.b"]]
