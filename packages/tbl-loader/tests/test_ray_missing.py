"""Without Ray (the core install), tbl_loader.ray and `tbl convert --engine ray` say which pip command adds it."""

from __future__ import annotations

import subprocess
import sys

# Ray made unimportable in a fresh interpreter: None in sys.modules makes `import ray` raise ImportError.
NO_RAY = "import sys; sys.modules['ray'] = None; sys.modules['ray.data'] = None\n"


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_RAY + code], capture_output=True, text=True, timeout=120)


def test_import_names_the_pip_command():
    r = run("import tbl_loader\n"
            "try:\n    import tbl_loader.ray\nexcept ImportError as e:\n"
            "    print(type(e).__name__, e)\nelse:\n    print('imported')\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("RayUnavailableError") and "pip install 'tbl-loader[ray]'" in r.stdout


def test_cli_engine_ray_names_the_pip_command(tmp_path):
    (tmp_path / "src" / "a").mkdir(parents=True)
    r = run("from tbl_format.cli import main\n"
            f"raise SystemExit(main(['convert', {str(tmp_path / 'src')!r}, {str(tmp_path / 'out')!r}, '--size', '8', "
            "'--engine', 'ray']))\n")
    assert r.returncode == 2, r.stderr
    assert "pip install 'tbl-loader[ray]'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
