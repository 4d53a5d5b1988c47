import json

import pytest

from tbl_bench.config import Config
from tbl_bench.report import ratios, render_markdown, write_report
from tbl_bench.results import SCHEMA, config_result, load_results


def _result(name, tool, role, throughput, peer=False, **params):
    cfg = Config("images", name, tool, "m:f", params, role=role, peer=peer, unit="images/s")
    t = 100 / throughput
    round_ = {"status": "ok", "reason": None, "items_per_epoch": 100, "setup_s": 0.5, "warmup_s": [t],
              "epochs_s": [t * 0.9, t, t * 1.2], "cpu_s": [t, t, t], "info": {},
              "rss": {"baseline_anon_kb": 1024, "baseline_file_kb": 2048, "peak_anon_kb": 10240,
                      "peak_file_kb": 4096, "growth_anon_kb": 9216, "growth_file_kb": 2048,
                      "tree_growth_anon_kb": 9216}}
    return config_result(cfg, [round_])


@pytest.fixture
def doc():
    results = [
        _result("memcpy/consume", "memcpy", "ceiling", 20000.0, level="consume"),
        _result("pil/consume/plain", "pil", "baseline", 250.0, level="consume", aug="plain"),
        _result("pil/consume/crop", "pil", "baseline", 200.0, level="consume", aug="crop"),
        _result("tbl/consume/plain", "tbl", "subject", 5000.0, level="consume", aug="plain"),
        _result("tbl/consume/crop", "tbl", "subject", 4000.0, level="consume", aug="crop"),
        _result("turboloader/consume/plain", "turboloader", "subject", 2500.0, peer=True, level="consume",
                aug="plain"),
    ]
    skipped = config_result(Config("images", "ffcv/consume/plain", "ffcv", "m:f", peer=True),
                            [{"status": "skipped", "reason": "ffcv does not import"}])
    return {
        "schema": SCHEMA, "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T00:10:00Z",
        "machine": {"hostname": "box", "cpu_model": "Test CPU 9000", "cpu_count": 2, "usable_cores": 2,
                    "mem_total_kb": 8 << 20, "memcpy_gbps": 12.5, "memcpy_bytes": 256 << 20,
                    "platform": "Linux", "python": "3.11.7", "python_implementation": "CPython",
                    "packages": {"numpy": "2.0", "ffcv": None}},
        "options": {"quick": True}, "sizes": {"images": 100},
        "suites": {
            "images": {"title": "Image serving", "unit": "images/s", "compare_on": ["level", "aug"], "rounds": 3,
                       "ratios": {"tbl / turboloader, plain": 2.0}, "results": [*results, skipped]},
        },
    }


def test_ratios_pair_results_on_the_comparison_keys(doc):
    suite = doc["suites"]["images"]
    crop = next(r for r in suite["results"] if r["name"] == "tbl/consume/crop")
    rat = ratios(crop, suite)
    assert rat["baseline"] == ("pil/consume/crop", pytest.approx(20.0), "pil")
    assert rat["ceiling"] == ("memcpy/consume", pytest.approx(0.2), "memcpy")  # the ceiling has no aug: matches any


def test_ceilings_and_baselines_are_not_compared_with_baselines(doc):
    suite = doc["suites"]["images"]
    ceiling = next(r for r in suite["results"] if r["role"] == "ceiling")
    base = next(r for r in suite["results"] if r["name"] == "pil/consume/plain")
    assert ratios(ceiling, suite) == {}
    assert set(ratios(base, suite)) == {"ceiling"}


def test_markdown_names_the_machine_the_ratios_and_the_peers(doc):
    md = render_markdown(doc)
    assert "Test CPU 9000" in md and "12.5 GB/s" in md
    assert "20.00x (pil/consume/crop)" in md and "0.25x (memcpy/consume)" in md
    assert "`ffcv/consume/plain`: skipped: ffcv does not import" in md
    assert "| tbl / turboloader, plain | 2.00 |" in md
    assert "`turboloader/consume/plain` (peer)" in md
    assert "3 rounds" in md and "Quick run" in md
    assert "Not installed: ffcv" in md
    row = next(line for line in md.splitlines() if line.startswith("| `tbl/consume/plain`"))
    assert "| 5,000 | 0.02 | 0.018 | 0.024 |" in row  # throughput, median, min, max (s)


def test_write_report_from_json(doc, tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(doc))
    loaded = load_results(path)
    md = write_report(loaded, tmp_path / "out", docs_path=tmp_path / "docs" / "benchmarks.md")
    assert md.exists() and "![Image serving](images.png)" in md.read_text()
    png = tmp_path / "out" / "images.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "images.png" not in (tmp_path / "docs" / "benchmarks.md").read_text()


def test_load_results_rejects_other_json(tmp_path):
    (tmp_path / "x.json").write_text('{"schema": "other"}')
    with pytest.raises(ValueError, match="not a tbl-bench/2 results file"):
        load_results(tmp_path / "x.json")
    (tmp_path / "old.json").write_text('{"schema": "tbl-bench/1"}')
    with pytest.raises(ValueError, match="history"):
        load_results(tmp_path / "old.json")
