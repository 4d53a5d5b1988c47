import argparse
import json

from tbl_bench.bench import SCHEMA
from tbl_bench.cli import main, register_bench
from tbl_bench.suites import SUITES


def test_register_adds_the_bench_subcommand():
    parser = argparse.ArgumentParser(prog="tbl")
    sub = parser.add_subparsers(dest="command")
    register_bench(sub)
    args = parser.parse_args(["bench", "images", "convert", "--peers", "--quick", "--out", "o", "--data-dir", "d"])
    assert args.suites == ["images", "convert"] and args.peers and args.quick
    assert args.out == "o" and args.data_dir == "d" and callable(args.func)
    args = parser.parse_args(["bench", "--report-only", "r.json"])
    assert args.report_only == "r.json" and args.suites == []


def test_list_and_bad_suite(capsys):
    assert main(["--list"]) == 0
    assert capsys.readouterr().out.split() == list(SUITES)
    assert main(["no-such-suite"]) == 2
    assert "unknown suite" in capsys.readouterr().err


def test_report_only(tmp_path, capsys):
    doc = {"schema": SCHEMA, "started": "s", "finished": "f", "options": {}, "sizes": {}, "suites": {},
           "machine": {"hostname": "h", "cpu_model": "cpu", "cpu_count": 1, "usable_cores": 1, "mem_total_kb": 1,
                       "memcpy_gbps": 1.0, "memcpy_bytes": 1 << 20, "platform": "p", "python": "3",
                       "packages": {}}}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert main(["--report-only", str(tmp_path / "r.json"), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "report.md").exists()
    assert main(["--report-only", str(tmp_path / "r.json"), "--quick"]) == 2
