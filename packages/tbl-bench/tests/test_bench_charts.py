import json

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from tbl_bench.charts import (
    QUICK_STAMP,
    break_even_epoch,
    decorate_figure,
    error_bar_spans,
    machine_caption,
    write_charts,
    write_demo_chart,
)
from tbl_bench.config import Config
from tbl_bench.report import render_markdown
from tbl_bench.results import SCHEMA, config_result, load_results


def _result(name, role, epochs_s, suite="images", items=100):
    cfg = Config(suite, name, name.split("/")[0], "m:f", {}, role=role, unit="images/s")
    rec = {"status": "ok", "reason": None, "items_per_epoch": items, "setup_s": 0.1, "warmup_s": [1.0],
           "epochs_s": epochs_s, "cpu_s": epochs_s, "info": {}, "rss": None,
           "loadavg_before": [1.5, 1.0, 0.5], "loadavg_after": [3.25, 1.2, 0.6]}
    return config_result(cfg, [rec])


def _doc(quick, results, suite="images"):
    return {"schema": SCHEMA, "started": "2026-01-01T00:00:00Z", "finished": "2026-01-01T00:01:00Z",
            "machine": {"hostname": "box", "cpu_model": "Test CPU 9000", "cpu_count": 8, "physical_cores": 4,
                        "usable_cores": 6, "mem_total_kb": 8 << 20, "memcpy_gbps": 12.5, "memcpy_bytes": 1 << 20,
                        "loadavg_start": [0.5, 0.25, 0.125], "loadavg_end": [4.0, 2.0, 1.0], "platform": "Linux",
                        "python": "3.11", "packages": {}},
            "options": {"quick": quick}, "sizes": {},
            "suites": {suite: {"title": "Image serving", "unit": "images/s", "compare_on": [], "rounds": 1,
                               "ratios": {}, "results": results}}}


def test_break_even_epoch():
    assert break_even_epoch(10.0, 1.0, 3.0) == 5  # 10 + 5 * 1 == 5 * 3
    assert break_even_epoch(10.5, 1.0, 3.0) == 6
    assert break_even_epoch(0.0, 1.0, 2.0) == 1
    assert break_even_epoch(0.3, 0.1, 0.2) == 3  # 0.3 / 0.1 is 2.9999999999999996 in floats
    assert break_even_epoch(10.0, 3.0, 3.0) is None
    assert break_even_epoch(10.0, 4.0, 3.0) is None
    with pytest.raises(ValueError):
        break_even_epoch(-1.0, 1.0, 2.0)
    with pytest.raises(ValueError):
        break_even_epoch(1.0, 0.0, 2.0)


def test_error_bars_span_the_slowest_and_fastest_epoch():
    r = _result("tbl/consume", "subject", [0.5, 1.0, 2.0])  # 200, 100, 50 items/s
    below, above = error_bar_spans([r])
    assert r["throughput"] == 100
    assert below == [50.0] and above == [100.0]


def test_caption_names_machine_and_load():
    doc = _doc(False, [_result("tbl/consume", "subject", [1.0, 1.0])])
    caption = machine_caption(doc)
    assert "Test CPU 9000" in caption and "6 usable of 8 logical cores (4 physical)" in caption
    assert "start 0.50 / 0.25 / 0.12" in caption and "end 4.00 / 2.00 / 1.00" in caption
    assert "1-min load around rounds 1.50 to 3.25" in caption
    assert "12.5 GB/s" in caption


@pytest.mark.parametrize("quick", [True, False])
def test_every_figure_carries_the_caption_and_a_quick_run_carries_the_stamp(quick):
    doc = _doc(quick, [_result("tbl/consume", "subject", [1.0, 1.0])])
    fig = plt.figure()
    decorate_figure(fig, doc, bottom=0.1)
    texts = [t.get_text() for t in fig.texts]
    plt.close(fig)
    assert machine_caption(doc) in texts
    assert (QUICK_STAMP.upper() in texts) is quick
    assert (QUICK_STAMP in texts) is quick


def test_charts_are_written(tmp_path):
    doc = _doc(True, [_result("memcpy/consume", "ceiling", [0.01, 0.02]),
                      _result("tbl/consume", "subject", [0.1, 0.2]),
                      _result("pil/consume", "baseline", [1.0, 2.0])])
    paths = write_charts(doc, tmp_path)
    assert paths["images"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_chart(tmp_path):
    tbl = _result("tbl", "subject", [0.2, 0.25], suite="demo")
    pil = _result("pil", "baseline", [6.0, 6.5], suite="demo")
    convert = _result("convert", "subject", [2.5], suite="demo")
    doc = _doc(True, [tbl, pil], suite="demo")
    path = write_demo_chart(doc, tmp_path / "demo.png", subject=tbl, baseline=pil, convert=convert)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_memory_copy_is_called_a_ceiling_everywhere(tmp_path):
    doc = _doc(False, [_result("memcpy/consume", "ceiling", [0.01]), _result("tbl/consume", "subject", [0.1])])
    md = render_markdown(doc)
    assert "vs ceiling" in md and md.lower().count("floor") == md.count("not a floor") == 1
    # Results files written before the rename read back with the new word.
    doc["suites"]["images"]["results"][0]["role"] = "floor"
    (tmp_path / "old.json").write_text(json.dumps(doc))
    assert load_results(tmp_path / "old.json")["suites"]["images"]["results"][0]["role"] == "ceiling"
