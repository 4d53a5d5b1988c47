from __future__ import annotations

import subprocess
import sys

import pytest

import tbl_format as tf
from tbl_format import cli


@pytest.fixture(autouse=True)
def no_installed_plugins(monkeypatch):
    """Keep these tests independent of which other TBL packages are installed (and of their import time)."""
    monkeypatch.setattr(cli, "entry_points", lambda group: [])


@pytest.fixture
def dataset(tmp_path):
    return tf.write([{"i": i, "s": "x" * i} for i in range(100)], tmp_path / "d.tbl", metadata={"class_names": ["a"]})


def test_inspect(dataset, capsys):
    assert cli.main(["inspect", str(dataset)]) == 0
    out = capsys.readouterr().out
    assert "rows:      100" in out and "class_names" in out and "str" in out and "CRC-32" in out


def test_verify_ok_and_corrupt(dataset, capsys, hdr):
    assert cli.main(["verify", str(dataset)]) == 0
    assert "OK" in capsys.readouterr().out
    heap = hdr.read(dataset)["columns"][1]["regions"]["heap"]
    raw = bytearray(dataset.read_bytes())
    raw[heap["offset"] + heap["size"] - 3] ^= 1
    dataset.write_bytes(bytes(raw))
    assert cli.main(["verify", str(dataset)]) == 1
    err = capsys.readouterr().err
    assert str(dataset) in err and "DataChecksumError" in err
    raw[1] ^= 1
    dataset.write_bytes(bytes(raw))
    assert cli.main(["verify", str(dataset)]) == 1
    assert "BadMagicError" in capsys.readouterr().err
    assert cli.main(["inspect", str(dataset)]) == 1


def test_verify_missing_file(tmp_path, capsys):
    assert cli.main(["verify", str(tmp_path / "nope.tbl")]) == 2


def test_progress_printer_without_tqdm():
    import io

    stream = io.StringIO()
    p = cli._Progress("verify x", stream)
    p.tqdm = None
    p(100 << 20, 200 << 20)
    p(200 << 20, 200 << 20)
    p.close()
    assert "100.0%" in stream.getvalue() and stream.getvalue().endswith("\n")


class _EP:
    def __init__(self, name, fn):
        self.name, self.value, self._fn = name, f"fake:{name}", fn

    def load(self):
        return self._fn()


def test_broken_plugin_does_not_break_core(monkeypatch, dataset, capsys):
    def good():
        def register(sub):
            p = sub.add_parser("hello")
            p.set_defaults(func=lambda args: 7)

        return register

    def broken():
        raise ImportError("missing dependency")

    monkeypatch.setattr(cli, "entry_points", lambda group: [_EP("zzz", broken), _EP("hello", good)])
    assert cli.main(["hello"]) == 7
    assert cli.main(["inspect", str(dataset)]) == 0
    assert "plugin 'zzz'" in capsys.readouterr().err


def test_console_script_module(dataset):
    r = subprocess.run([sys.executable, "-m", "tbl_format.cli", "verify", str(dataset)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
