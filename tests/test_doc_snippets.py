"""Every code snippet in the docs runs, or is checked where it cannot run here.

Covered: README.md, docs/**/*.md and packages/*/README.md. Fenced blocks are
taken by file and line:

- ```python blocks run for real. The blocks of one file run in order in ONE
  namespace and one temporary working directory (shared with that file's shell
  blocks), the way a reader follows a page: a snippet may use what an earlier
  block of the same file made (a sample TAR, a converted dataset, a loader).
  Tracebacks point at the doc's own lines.
- ```bash / ```sh / ```console blocks (console: only the ``$ `` lines) are
  split into commands (``&&`` and ``;``, comments dropped). ``tbl ...`` and
  ``python ...`` run for real in that directory with this interpreter's
  environment, unless their prefix is in CHECKED_NOT_RUN (too slow, or a test
  suite of its own), in which case a ``tbl`` line must parse with the real
  ``tbl`` parser and a ``python -m MOD`` line must name an importable module.
  ``pip install`` lines never run (the test environment already holds the
  packages) but every target must be a package directory of this tree (its
  extras declared), never a TBL package by name: nothing here is published.
  ``nox`` lines never run (they are CI itself) but every session they name
  must be defined in noxfile.py. Any other command fails the test.
- ```text and unlabelled blocks (API listings, diagrams, pseudo-code) are not
  run, and must not hold commands (fence those as bash).

Over the whole text of every doc (prose, inline code, every block): each dotted
name of a TBL package (``tbl_loader.stream.order``, ``tbl_format.write``) must
resolve, and every ``pip install`` in inline code or in any block, comments
included, must pass the install check above.
"""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tbl_format.cli import build_parser as build_tbl_parser

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"
DOCS = sorted({ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *PACKAGES.glob("*/README.md")})
TBL_MODULES = ("tbl_format", "tbl_kernels", "tbl_loader", "tbl_resident", "tbl_bench")

PYTHON_LANGS = {"python", "py"}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
INERT_LANGS = {"", "text"}

# Commands documented but not run here, by prefix, with why; they are checked instead.
CHECKED_NOT_RUN = {
    "tbl bench": "measures for minutes; parsed by the real tbl parser",
    "python -m tbl_bench.demo": "2,000 photos and timed epochs (nox -s demo runs it)",
    "python -m pytest": "a test suite of its own (nox -s tests runs it)",
}
COMMAND_TIMEOUT_S = 120


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the block's first code line
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)\s*$")


def fenced_blocks(doc: Path) -> list[Block]:
    """Every fenced block of a markdown file, with its language and first line."""
    blocks: list[Block] = []
    lines = doc.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence) and set(lines[i].strip()) == {fence[0]}):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{doc.relative_to(ROOT)}:{start}: unclosed code fence")
        blocks.append(Block(doc, start + 1, lang, "\n".join(body) + "\n"))
        i += 1
    return blocks


def shell_commands(block: Block) -> list[tuple[int, list[str]]]:
    """(doc line, argv) of every command in a shell block."""
    logical: list[tuple[int, str]] = []
    pending, pending_line = "", 0
    for n, raw in enumerate(block.text.splitlines(), start=block.line):
        if block.lang == "console":
            if not raw.startswith("$ "):
                continue
            raw = raw[2:]
        if not pending:
            pending_line = n
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        logical.append((pending_line, pending + raw))
        pending = ""
    commands = []
    for n, line in logical:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        argv: list[str] = []
        for token in [*lexer, ";"]:
            if token in (";", "&&"):
                if argv:
                    commands.append((n, argv))
                argv = []
            elif set(token) <= set(";&|<>"):
                raise AssertionError(f"{block.doc.relative_to(ROOT)}:{n}: shell operator {token!r} in a snippet; "
                                     "write one plain command per line")
            else:
                argv.append(token)
    return commands


# --- static checks: install lines and nox sessions -------------------------------------------

def _project(path: Path) -> dict:
    return tomllib.loads((path / "pyproject.toml").read_text())["project"]


TREE_PROJECTS = {_project(p.parent)["name"]: p.parent for p in sorted(PACKAGES.glob("*/pyproject.toml"))}
_REQ_NAME = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_problems(args: list[str]) -> list[str]:
    """Why `pip install ARGS` cannot work from a checkout of this tree ([] when it can)."""
    problems, targets = [], []
    it = iter(args)
    for arg in it:
        if arg in ("-e", "--editable"):
            targets.append(next(it, ""))
        elif arg.startswith("-"):
            if arg in ("-r", "--requirement", "-c", "--constraint"):
                problems.append(f"{arg}: requirement files are not part of this tree")
        else:
            targets.append(arg)
    if not targets:
        problems.append("pip install without a target")
    tree_dirs = {_canonical(name): path for name, path in TREE_PROJECTS.items()}
    for target in targets:
        path_part, extras = re.fullmatch(r"(.*?)(?:\[([^\]]*)\])?", target).groups()
        if "/" in path_part or path_part.startswith("."):
            pkg = (ROOT / path_part).resolve()
            if not (pkg / "pyproject.toml").is_file():
                problems.append(f"{target}: {path_part} is not a package directory of this tree")
                continue
            declared = set(_project(pkg).get("optional-dependencies", {}))
            for extra in filter(None, (e.strip() for e in (extras or "").split(","))):
                if extra not in declared:
                    problems.append(f"{target}: {pkg.name} declares no extra {extra!r} (has {sorted(declared)})")
        else:
            m = _REQ_NAME.match(target)
            if m and _canonical(m.group(1)) in tree_dirs:
                problems.append(f"{target}: TBL packages are not published; install "
                                f"./packages/{tree_dirs[_canonical(m.group(1))].name} from a checkout")
    return problems


def nox_sessions() -> set[str]:
    """Session names defined in noxfile.py: every function decorated with nox.session."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if ast.unparse(target) == "nox.session":
                    name = node.name
                    if isinstance(dec, ast.Call):
                        name = next((kw.value.value for kw in dec.keywords if kw.arg == "name"), name)
                    names.add(name)
    return names


NOX_FLAGS = {"-l", "--list", "-r", "-R", "--reuse-existing-virtualenvs", "--no-reuse-existing-virtualenvs"}


def nox_problems(args: list[str]) -> list[str]:
    sessions, problems = nox_sessions(), []
    named = []
    it = iter(args)
    for arg in it:
        if arg == "--":
            break
        if arg in ("-s", "--session", "--sessions", "-e"):
            named.append(next(it, ""))
            continue
        if arg.startswith("-") and arg not in NOX_FLAGS:
            problems.append(f"nox option {arg!r} is not one this test knows")
        elif not arg.startswith("-"):
            if named:
                named.append(arg)
            else:
                problems.append(f"nox argument {arg!r} is not a session (use -s NAME)")
    for name in named:
        if name.split("(", 1)[0] not in sessions:
            problems.append(f"nox session {name!r} is not defined in noxfile.py (has {sorted(sessions)})")
    if not named and not set(args) & {"-l", "--list"}:
        problems.append("nox without -s runs the default sessions; name them")
    return problems


# --- running shell commands ------------------------------------------------------------------

def checked_not_run_problems(argv: list[str]) -> list[str]:
    if argv[0] == "tbl":
        try:
            build_tbl_parser().parse_args(argv[1:])
        except SystemExit as exc:
            return [f"the tbl parser rejects it (exit {exc.code})"]
        return []
    if argv[1] == "-m":
        module = argv[2]
        if importlib.util.find_spec(module) is None:
            return [f"module {module} is not importable"]
        if module == "pytest":
            return [f"{a} does not exist" for a in argv[3:] if not a.startswith("-") and not (ROOT / a).exists()]
        return []
    return [f"{argv[1]} does not exist"] if not (ROOT / argv[1]).exists() else []


def _not_run_reason(argv: list[str]) -> str | None:
    line = " ".join(["python" if argv[0] == "python3" else argv[0], *argv[1:]])
    return next((why for prefix, why in CHECKED_NOT_RUN.items() if line.startswith(prefix)), None)


def run_command(where: str, argv: list[str], cwd: Path) -> None:
    bindir = Path(sys.executable).parent
    if argv[0] == "tbl":
        exe = bindir / "tbl"
        assert exe.exists(), f"{where}: no `tbl` script next to {sys.executable}"
        cmd = [str(exe), *argv[1:]]
    else:
        cmd = [sys.executable, *argv[1:]]
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    if proc.returncode != 0:
        raise AssertionError(f"{where}: `{shlex.join(argv)}` exited {proc.returncode}\n"
                             f"--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}")


def shell_command_problems(where: str, argv: list[str], cwd: Path | None) -> list[str]:
    """Check one command; run it in `cwd` when it is one that runs (cwd=None: check only)."""
    if argv[0] == "pip" or argv[:3] in (["python", "-m", "pip"], ["python3", "-m", "pip"]):
        rest = argv[1:] if argv[0] == "pip" else argv[3:]
        if rest[:1] != ["install"]:
            return [f"only `pip install` is expected in a snippet, got {shlex.join(argv)}"]
        return install_problems(rest[1:])
    if argv[0] == "nox":
        return nox_problems(argv[1:])
    if argv[0] in ("tbl", "python", "python3"):
        if argv[0] != "tbl" and len(argv) < 2:
            return ["a bare `python` is not a snippet"]
        if _not_run_reason(argv) is not None:
            return checked_not_run_problems(argv)
        if cwd is not None:
            run_command(where, argv, cwd)
        return []
    return [f"`{argv[0]}` is neither run nor checked by this test; use tbl, python, pip install or nox"]


# --- the tests -------------------------------------------------------------------------------

def _doc_id(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def test_docs_are_found():
    names = {_doc_id(d) for d in DOCS}
    assert {"README.md", "docs/architecture.md"} <= names
    assert {f"packages/{p}/README.md" for p in ("tbl-format", "tbl-kernels", "tbl-loader", "tbl-resident",
                                                "tbl-bench")} <= names


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_snippets_run(doc, tmp_path, monkeypatch):
    blocks = fenced_blocks(doc)
    for block in blocks:
        if block.lang not in PYTHON_LANGS | SHELL_LANGS | INERT_LANGS:
            pytest.fail(f"{block.where}: fence language {block.lang!r}: use python, bash, console or text")
    namespace: dict = {"__name__": "__doc_snippet__"}
    monkeypatch.chdir(tmp_path)
    try:
        for block in blocks:
            if block.lang in PYTHON_LANGS:
                # Padding keeps the doc's line numbers in tracebacks.
                code = compile("\n" * (block.line - 1) + block.text, str(block.doc), "exec")
                exec(code, namespace)
            elif block.lang in SHELL_LANGS:
                for line, argv in shell_commands(block):
                    problems = shell_command_problems(f"{block.doc.relative_to(ROOT)}:{line}", argv, tmp_path)
                    assert not problems, f"{block.doc.relative_to(ROOT)}:{line}: {shlex.join(argv)}: {problems}"
    finally:
        namespace.clear()  # drop loaders (and their producer threads and maps) before the directory goes
        gc.collect()


_COMMAND_WORDS = re.compile(r"^\s*(\$ )?(pip|python3?|tbl|nox) \S")


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_inert_blocks_hold_no_commands(doc):
    bad = [f"{b.where}: {line.strip()}" for b in fenced_blocks(doc) if b.lang in INERT_LANGS
           for line in b.text.splitlines() if _COMMAND_WORDS.match(line)]
    assert not bad, "commands in a block that is not fenced as bash (so never run or checked):\n" + "\n".join(bad)


_INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _prose(doc: Path) -> str:
    """The doc's text outside fenced blocks (fences are checked block by block)."""
    text, out, inside = doc.read_text().splitlines(), [], None
    for line in text:
        m = _FENCE.match(line)
        if m and inside is None:
            inside = m.group(2)
        elif inside is not None and line.strip().startswith(inside) and set(line.strip()) == {inside[0]}:
            inside = None
        elif inside is None:
            out.append(line)
    return "\n".join(out)


_PIP_INSTALL = re.compile(r"pip install ([^;&|#)`\n]*)")


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_install_line_works_from_a_checkout(doc):
    """Inline code and every line of every block, comments included (a block's commands are also checked as run)."""
    texts = _INLINE_CODE.findall(_prose(doc)) + [line for b in fenced_blocks(doc) for line in b.text.splitlines()]
    problems = []
    for text in texts:
        for m in _PIP_INSTALL.finditer(text):
            problems += [f"{text.strip()}: {p}" for p in install_problems(shlex.split(m.group(1)))]
    assert not problems, f"{_doc_id(doc)}:\n" + "\n".join(problems)


_DOTTED = re.compile(r"\b(" + "|".join(TBL_MODULES) + r")((?:\.[A-Za-z_]\w*)+)")


def _resolve(dotted: str) -> str | None:
    """None when `a.b.c` names a module or an attribute that exists, else why not."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        name = ".".join(parts[: i + 1])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but something it imports does not
                raise
            return f"{name} does not exist"
    return None


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_named_tbl_apis_exist(doc):
    names = sorted({m.group(0) for m in _DOTTED.finditer(doc.read_text())})
    missing = [why for why in map(_resolve, names) if why]
    assert not missing, f"{_doc_id(doc)} names what the packages do not have:\n" + "\n".join(missing)


def test_one_python_floor():
    """Python 3.11 everywhere: every pyproject, ruff, every nox session, the README."""
    floors = {name: _project(path).get("requires-python") for name, path in TREE_PROJECTS.items()}
    assert set(floors.values()) == {">=3.11"}, floors
    ruff = tomllib.loads((ROOT / "ruff.toml").read_text())
    assert ruff["target-version"] == "py311"
    noxfile = ast.parse((ROOT / "noxfile.py").read_text())
    pythons = {ast.unparse(kw.value) for node in ast.walk(noxfile) if isinstance(node, ast.Call)
               and ast.unparse(node.func) == "nox.session" for kw in node.keywords if kw.arg == "python"}
    assert pythons == {"'3.11'"}, pythons
    assert "Needs Python 3.11+" in (ROOT / "README.md").read_text()
    stated = {v for doc in DOCS for v in re.findall(r"(?:Python|CPython) (3\.\d+)(?:\+| and newer)", doc.read_text())}
    assert stated <= {"3.11", "3.12"}, f"docs state other floors: {stated}"


# --- the checks above must be able to fail ---------------------------------------------------

def test_install_check_rejects_what_cannot_work():
    assert install_problems(["./packages/tbl-format", "./packages/tbl-bench[peers]", "nox"]) == []
    assert install_problems(["./packages/tbl-nothing"])
    assert install_problems(["./packages/tbl-bench[nonexistent]"])
    assert install_problems(["tbl-format"])
    assert install_problems(["tbl_loader[numpy]>=0.1"])
    assert install_problems([])


def test_nox_check_rejects_unknown_sessions():
    assert nox_problems(["-s", "tests", "format_only", "lint"]) == []
    assert nox_problems(["-s", "kernels_matrix(kernels='oldest')"]) == []
    assert nox_problems(["-s", "no_such_session"])
    assert nox_problems(["tests"])


def test_shell_parsing_and_refusals():
    block = Block(ROOT / "README.md", 1, "bash", "pip install nox && nox -s demo   # comment\n"
                                                  "tbl convert a.tar \\\n  b.tbl --size 160\n")
    assert shell_commands(block) == [(1, ["pip", "install", "nox"]), (1, ["nox", "-s", "demo"]),
                                     (2, ["tbl", "convert", "a.tar", "b.tbl", "--size", "160"])]
    with pytest.raises(AssertionError, match="operator"):
        shell_commands(Block(ROOT / "README.md", 1, "bash", "tbl inspect x | head\n"))
    assert shell_command_problems("x", ["rm", "-rf", "x"], None)
    assert shell_command_problems("x", ["tbl", "bench", "--no-such-flag"], None)
    assert shell_command_problems("x", ["python", "-m", "tbl_bench.demo_no_such_module"], None)
    assert _resolve("tbl_format.no_such_name")
    assert _resolve("tbl_format.open") is None


def test_readme_test_command_is_what_ci_runs():
    """The README's second setup command is exactly the nox line of .ci/run."""
    ci = (ROOT / ".ci" / "run").read_text()
    ci_line = next(line for line in ci.splitlines() if line.startswith("python3 -m nox "))
    ci_sessions = ci_line.split(" -s ", 1)[1].split()
    readme = (ROOT / "README.md").read_text()
    readme_line = next(line for line in readme.splitlines() if line.startswith("pip install nox && nox -s tests"))
    readme_sessions = readme_line.split("&& nox -s ", 1)[1].split("#", 1)[0].split()
    assert readme_sessions == ci_sessions
