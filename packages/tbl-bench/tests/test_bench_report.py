import json

import pytest

from tbl_bench.bench import SCHEMA, load_results
from tbl_bench.harness import RESULT_KEYS
from tbl_bench.report import ratios, render_markdown, write_report


def _result(name, tool, role, throughput, **params):
    r = dict.fromkeys(RESULT_KEYS)
    r.update(suite="images", name=name, kind="workload", tool=tool, role=role, params=params, status="ok",
             reason=None, items_per_epoch=100, unit="images/s", warmup=1, epochs_s=[100 / throughput] * 3,
             setup_s=0.5, median_s=100 / throughput, min_s=100 / throughput, max_s=100 / throughput,
             throughput=throughput, info={},
             rss={"baseline_anon_kb": 1024, "baseline_file_kb": 2048, "peak_anon_kb": 10240,
                  "peak_file_kb": 4096, "growth_anon_kb": 9216, "growth_file_kb": 2048})
    return r


@pytest.fixture
def doc():
    results = [
        _result("memcpy/consume", "memcpy", "floor", 20000.0, level="consume"),
        _result("pil/consume/plain", "pil", "baseline", 250.0, level="consume", aug="plain"),
        _result("pil/consume/crop", "pil", "baseline", 200.0, level="consume", aug="crop"),
        _result("tbl/consume/plain", "tbl", "subject", 5000.0, level="consume", aug="plain"),
        _result("tbl/consume/crop", "tbl", "subject", 4000.0, level="consume", aug="crop"),
    ]
    skipped = dict(_result("ffcv/consume/plain", "ffcv", "subject", 1.0), status="skipped",
                   reason="ffcv does not import", throughput=None)
    script = dict.fromkeys(RESULT_KEYS)
    script.update(suite="kernels", name="kernels", kind="script", status="ok", params={}, role="subject",
                  info={"script": {"results": [{"kernel": "gather_normalize", "gbps": 3.25, "threads": 2}]}})
    return {
        "schema": SCHEMA, "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T00:10:00Z",
        "machine": {"hostname": "box", "cpu_model": "Test CPU 9000", "cpu_count": 2, "usable_cores": 2,
                    "mem_total_kb": 8 << 20, "memcpy_gbps": 12.5, "memcpy_bytes": 256 << 20,
                    "platform": "Linux", "python": "3.11.7", "python_implementation": "CPython",
                    "packages": {"numpy": "2.0", "ffcv": None}},
        "options": {"quick": True}, "sizes": {"images": 100},
        "suites": {
            "images": {"title": "Image serving", "unit": "images/s", "compare_on": ["level", "aug"],
                       "results": [*results, skipped]},
            "kernels": {"title": "C++ kernels", "unit": "", "compare_on": [], "results": [script]},
        },
    }


def test_ratios_pair_results_on_the_comparison_keys(doc):
    suite = doc["suites"]["images"]
    crop = next(r for r in suite["results"] if r["name"] == "tbl/consume/crop")
    rat = ratios(crop, suite)
    assert rat["baseline"] == ("pil/consume/crop", pytest.approx(20.0), "pil")
    assert rat["floor"] == ("memcpy/consume", pytest.approx(0.2), "memcpy")  # the floor has no aug: matches any


def test_floors_and_baselines_are_not_compared_with_baselines(doc):
    suite = doc["suites"]["images"]
    floor = next(r for r in suite["results"] if r["role"] == "floor")
    base = next(r for r in suite["results"] if r["name"] == "pil/consume/plain")
    assert ratios(floor, suite) == {}
    assert set(ratios(base, suite)) == {"floor"}


def test_markdown_names_the_machine_and_the_ratios(doc):
    md = render_markdown(doc)
    assert "Test CPU 9000" in md and "12.5 GB/s" in md
    assert "20.00x (pil/consume/crop)" in md and "0.25x (memcpy/consume)" in md
    assert "ffcv does not import" in md
    assert "| gather_normalize | 3.25 | 2 |" in md
    assert "Not installed: ffcv" in md


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
    with pytest.raises(ValueError, match="tbl-bench results"):
        load_results(tmp_path / "x.json")
