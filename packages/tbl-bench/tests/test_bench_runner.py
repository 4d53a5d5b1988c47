import os
from pathlib import Path

import pytest

from tbl_bench.harness import RESULT_KEYS, Config
from tbl_bench.runner import parse_json_output, run_config, run_configs


@pytest.fixture
def child_env():
    """Environment for child interpreters that can import the test workloads (bench_workloads.py)."""
    env = dict(os.environ)
    here = str(Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join([here, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _cfg(name, target, params=None, **kw):
    kw.setdefault("preimport", ["numpy"])  # torch is not needed here and slow to import
    return Config("t", name, "test", target, params or {}, **kw)


def test_each_configuration_runs_in_its_own_interpreter(child_env):
    a = run_config(_cfg("a", "bench_workloads:counter", warmup=2, epochs=3), env=child_env)
    b = run_config(_cfg("b", "bench_workloads:counter"), env=child_env)
    for r in (a, b):
        assert r["status"] == "ok", r["reason"]
        assert r["info"]["calls"] == 1  # a fresh interpreter: module state never carries over
        assert r["info"]["pid"] != os.getpid()
    assert a["info"]["pid"] != b["info"]["pid"]
    assert a["info"]["epochs_seen"] == [0, 1, 2, 3, 4]  # two warm-up epochs, then three timed
    assert len(a["epochs_s"]) == 3


def test_result_schema(child_env):
    r = run_config(_cfg("a", "bench_workloads:counter", {"items": 7, "alloc_mb": 32}, epochs=2), env=child_env)
    assert set(r) == set(RESULT_KEYS)
    assert r["status"] == "ok" and r["kind"] == "workload"
    assert r["items_per_epoch"] == 7
    assert r["min_s"] <= r["median_s"] <= r["max_s"]
    assert r["throughput"] == pytest.approx(7 / r["median_s"])
    assert r["rss"]["growth_anon_kb"] >= 24 << 10  # the 32 MiB the workload allocated
    assert r["params"] == {"items": 7, "alloc_mb": 32}


def test_failures_and_skips_are_results(child_env):
    bad = run_config(_cfg("bad", "bench_workloads:failing", {"message": "kaput-123"}), env=child_env)
    assert bad["status"] == "failed" and "kaput-123" in bad["reason"]
    assert set(bad) == set(RESULT_KEYS)
    skip = run_config(_cfg("skip", "bench_workloads:skipping", {"reason": "no gpu here"}), env=child_env)
    assert skip["status"] == "skipped" and skip["reason"] == "no gpu here"
    pre = run_config(_cfg("pre", "bench_workloads:counter", skip="input missing"), env=child_env)
    assert pre["status"] == "skipped" and pre["reason"] == "input missing"


def test_timeout_is_a_failure(child_env):
    r = run_config(_cfg("slow", "bench_workloads:counter", timeout_s=0.01), env=child_env)
    assert r["status"] == "failed" and "timed out" in r["reason"]


def test_run_configs_reports_each_result(child_env, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", child_env["PYTHONPATH"])
    seen = []
    out = run_configs([_cfg("a", "bench_workloads:counter"), _cfg("b", "bench_workloads:skipping")], on_result=seen.append)
    assert [r["status"] for r in out] == ["ok", "skipped"] and seen == out


def test_config_validation():
    with pytest.raises(ValueError, match="role"):
        _cfg("x", "m:f", role="referee")
    with pytest.raises(ValueError, match="module:function"):
        _cfg("x", "nofunction")
    with pytest.raises(ValueError, match="epochs"):
        _cfg("x", "m:f", epochs=0)


def test_parse_json_output():
    assert parse_json_output('{"a": 1}') == {"a": 1}
    assert parse_json_output('progress...\n[1, 2]\n') == [1, 2]
    with pytest.raises(ValueError):
        parse_json_output("no json")


def test_script_results_are_kept_whole(child_env, tmp_path):
    (tmp_path / "emit_json.py").write_text('import json; print("warming up"); print(json.dumps({"results": [{"op": "x", "gbps": 1.5}]}))\n')
    env = dict(child_env, PYTHONPATH=f"{tmp_path}{os.pathsep}{child_env['PYTHONPATH']}")
    r = run_config(_cfg("emit", "emit_json:", kind="script"), env=env)
    assert r["status"] == "ok" and r["info"]["script"] == {"results": [{"op": "x", "gbps": 1.5}]}
