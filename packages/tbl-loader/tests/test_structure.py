"""tbl-loader's sub-packages by axis, and the import rule between them, checked from the sources.

Serving (stream, host, source, image, pytree, tokens, mix) never imports the
conversion (``tbl_loader.conversion``) or the Ray engine: a training process
loads neither Pillow's conversion rule nor multiprocessing pools it does not
use, and conversion can change without touching what serves. Within serving,
each axis imports only the axes below it: the stream knows no pixels and no
threads, the host pipeline knows no sample kind, and so on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import tbl_loader

PKG = Path(tbl_loader.__file__).parent

# What each part of tbl_loader may import of tbl_loader (besides itself). "errors", "_kernels" and
# "version" are leaves every part may use.
LEAVES = {"errors", "_kernels", "version"}
ALLOWED = {
    "stream": set(),
    "host": {"stream"},
    "source": {"stream"},
    "pytree": {"stream", "host", "source"},
    "image": {"stream", "host", "source", "pytree"},
    "tokens": {"stream", "host", "source", "pytree"},  # CollatedBatch: the DataLoader batch protocol
    "mix": {"stream", "host", "source", "pytree", "image", "tokens"},
    "conversion": {"stream", "host", "source", "image", "pytree", "tokens"},  # tokens: tbl tokenize writes them
    "ray": {"conversion", "source"},
    "__init__": {"stream", "host", "source", "pytree", "image", "tokens", "mix", "conversion"},
    "cli": {"conversion", "ray", "source"},
}
SERVING = {"stream", "host", "source", "pytree", "image", "tokens", "mix"}


def _part(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _imported_parts(path: Path, text: str | None = None) -> list[tuple[str, int]]:
    """The tbl_loader parts a file imports (module level and inside functions), with line numbers."""
    rel = path.relative_to(PKG)
    package = list(rel.parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = [*base, *(node.module.split(".") if node.module else [])]
                if not node.module:  # from . import a, b: each name is a part or a module of this package
                    found += [((target + [a.name])[0], node.lineno) for a in node.names]
                    continue
            elif node.module and node.module.split(".")[0] == "tbl_loader":
                target = node.module.split(".")[1:]
            else:
                continue
            if target:
                found.append((target[0], node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "tbl_loader" and len(parts) > 1:
                    found.append((parts[1], node.lineno))
    return found


FILES = sorted(PKG.rglob("*.py"))


def test_every_module_lives_in_an_axis():
    loose = sorted(p.name for p in PKG.glob("*.py"))
    assert loose == ["__init__.py", "_kernels.py", "cli.py", "errors.py", "mix.py", "version.py"], loose
    assert {p.name for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "stream", "host", "source", "image", "pytree", "tokens", "conversion", "ray"}


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(PKG)) for p in FILES])
def test_imports_follow_the_axes(path):
    part = _part(path)
    if part in LEAVES:
        allowed = set()
    else:
        allowed = ALLOWED[part]
    bad = [f"line {line}: {part} imports {target}" for target, line in _imported_parts(path)
           if target != part and target not in LEAVES and target not in allowed]
    assert not bad, f"{path.relative_to(PKG)}: " + "; ".join(bad)


def test_serving_never_imports_conversion():
    bad = [f"{p.relative_to(PKG)}:{line}" for p in FILES if _part(p) in SERVING
           for target, line in _imported_parts(p) if target in {"conversion", "ray"}]
    assert not bad, bad


def test_the_rule_catches_a_violation():
    # The checker itself: a serving module importing the conversion is seen, relative or absolute, at
    # module level or inside a function.
    probe = PKG / "image" / "probe.py"
    for text in ("from ..conversion import convert\n", "import tbl_loader.conversion.images\n",
                 "def f():\n    from ..conversion.decode import MODES\n", "from .. import conversion\n"):
        assert [target for target, _ in _imported_parts(probe, text)] == ["conversion"], text


def _probes(path: Path, text: str | None = None) -> list[str]:
    """``hasattr(x, "name")`` / ``getattr(x, "name", ...)`` on a dataset or shard source: a loader asking a dataset
    which methods it has, instead of the one protocol its source speaks (tbl_loader.source.local)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"hasattr", "getattr"}):
            continue
        if len(node.args) < 2 or not isinstance(node.args[1], ast.Constant):
            continue
        target = ast.unparse(node.args[0]).lower()
        if any(word in target for word in ("dataset", "shards", "layout")):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", [p for p in FILES if _part(p) in SERVING], ids=lambda p: str(p.relative_to(PKG)))
def test_no_loader_asks_a_dataset_which_methods_it_has(path):
    assert not _probes(path), _probes(path)


def test_the_probe_rule_catches_a_probe():
    probe = PKG / "image" / "probe.py"
    assert _probes(probe, 'if callable(getattr(dataset, "prepare_rows", None)):\n    pass\n')
    assert _probes(probe, 'x = hasattr(self.shards, "layout")\n')
    assert not _probes(probe, 'x = getattr(value, "shape", None)\n')
