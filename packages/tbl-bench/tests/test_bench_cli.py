import argparse
import json
import subprocess
import sys

from tbl_bench.cli import main, register_bench
from tbl_bench.results import RESULT_KEYS, SCHEMA, load_results
from tbl_bench.suites import SUITES


def test_register_adds_the_bench_subcommand():
    parser = argparse.ArgumentParser(prog="tbl")
    sub = parser.add_subparsers(dest="command")
    register_bench(sub)
    args = parser.parse_args(["bench", "--suite", "images", "kernels", "--peers", "--quick", "--rounds", "3",
                              "--json", "r.json", "--out", "o", "--data-dir", "d", "--peer-python", "/p/python"])
    assert args.suite_names == ["images", "kernels"] and args.peers and args.quick and args.rounds == 3
    assert args.json == "r.json" and args.out == "o" and args.data_dir == "d" and args.peer_python == "/p/python"
    assert callable(args.func)
    args = parser.parse_args(["bench", "images", "convert"])
    assert args.suites == ["images", "convert"]
    args = parser.parse_args(["bench", "--report-only", "r.json"])
    assert args.report_only == "r.json" and args.suites == [] and args.suite_names == []


def test_list_and_bad_arguments(capsys, tmp_path):
    assert main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(SUITES)
    assert main(["--suite", "no-such-suite"]) == 2
    assert "unknown suite" in capsys.readouterr().err
    assert main(["--suite", "pytree", "--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err
    assert main(["--suite", "pytree", "--peer-python", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_report_only(tmp_path):
    doc = {"schema": SCHEMA, "started": "s", "finished": "f", "options": {}, "sizes": {}, "suites": {},
           "machine": {"hostname": "h", "cpu_model": "cpu", "cpu_count": 1, "usable_cores": 1, "mem_total_kb": 1,
                       "memcpy_gbps": 1.0, "memcpy_bytes": 1 << 20, "platform": "p", "python": "3",
                       "packages": {}}}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert main(["--report-only", str(tmp_path / "r.json"), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "report.md").exists()
    assert main(["--report-only", str(tmp_path / "r.json"), "--quick"]) == 2


def test_a_quick_run_end_to_end(tmp_path):
    """`python -m tbl_bench` on two small configurations: subprocesses, rounds, the schema, the report."""
    out = tmp_path / "res.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tbl_bench", "--suite", "format_read", "--quick", "--rounds", "2",
         "--only", "tbl_format/sequential/produce", "--only", "list/sequential/produce",
         "--json", str(out), "--out", str(tmp_path / "report"), "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = load_results(out)
    assert doc["options"]["rounds"] == 2 and doc["options"]["quick"]
    suite = doc["suites"]["format_read"]
    assert suite["rounds"] == 2 and suite["unit"] == "rows/s"
    assert [r["name"] for r in suite["results"]] == ["tbl_format/sequential/produce", "list/sequential/produce"]
    for r in suite["results"]:
        assert set(r) == set(RESULT_KEYS) and r["status"] == "ok", r["reason"]
        assert len(r["rounds"]) == 2 and r["items_per_epoch"] == 20_000
        assert all(len(rec["epochs_s"]) == 2 for rec in r["rounds"])
    assert suite["results"][1]["role"] == "ceiling"
    md = (tmp_path / "report" / "report.md").read_text()
    assert "`tbl_format/sequential/produce`" in md and "(list/sequential/produce)" in md
