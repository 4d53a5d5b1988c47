import os
import stat
import sys
from pathlib import Path

import pytest

from tbl_bench.config import Config
from tbl_bench.results import RESULT_KEYS, config_result
from tbl_bench.runner import call_in, run_config, run_round

HERE = Path(__file__).parent


@pytest.fixture
def child_env():
    """Environment for child interpreters that can import the test workloads (bench_workloads.py)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _cfg(name, target, params=None, **kw):
    kw.setdefault("preimport", ["numpy"])  # torch is not needed here and slow to import
    return Config("t", name, "test", target, params or {}, **kw)


def test_each_round_runs_in_its_own_interpreter(child_env):
    r = run_config(_cfg("a", "bench_workloads:counter", warmup=2, epochs=3), rounds=2, env=child_env)
    assert r["status"] == "ok", r["reason"]
    assert len(r["rounds"]) == 2
    pids = {rec["info"]["pid"] for rec in r["rounds"]}
    assert len(pids) == 2 and os.getpid() not in pids
    for rec in r["rounds"]:
        assert rec["info"]["calls"] == 1  # a fresh interpreter: module state never carries over
        assert len(rec["warmup_s"]) == 2 and len(rec["epochs_s"]) == 3 == len(rec["cpu_s"])
        assert rec["python"] == sys.executable
    # Two warm-up epochs, then three timed; each prepared (untimed) right before it runs.
    assert r["info"]["events"] == [f"{what} {e}" for e in range(5) for what in ("prepare", "run")]


def test_a_measured_tools_pool_workers_do_not_rerun_the_harness(child_env):
    # Spawn and forkserver workers re-run the parent's main module before their first task; the child's
    # main must not be the harness, or every pool a measured tool starts pays for importing it.
    r = run_config(_cfg("pool", "bench_workloads:pool_probe", warmup=0, epochs=1), env=child_env)
    assert r["status"] == "ok", r["reason"]
    assert r["info"]["worker_reran_main"] is False


def test_timing_continues_until_min_time_is_covered(child_env):
    r = run_config(_cfg("a", "bench_workloads:counter", {"sleep_s": 0.01}, warmup=0, epochs=2, min_time_s=0.1,
                        max_epochs=50), env=child_env)
    epochs = r["rounds"][0]["epochs_s"]
    assert 2 <= len(epochs) <= 50
    assert sum(epochs) >= 0.1 or len(epochs) == 50
    capped = run_config(_cfg("b", "bench_workloads:counter", {"sleep_s": 0.01}, warmup=0, epochs=1,
                             min_time_s=100.0, max_epochs=3), env=child_env)
    assert len(capped["rounds"][0]["epochs_s"]) == 3


def test_result_schema(child_env):
    r = run_config(_cfg("a", "bench_workloads:counter", {"items": 7, "alloc_mb": 32}, epochs=2), env=child_env)
    assert set(r) == set(RESULT_KEYS)
    assert r["status"] == "ok" and r["reason"] is None and r["items_per_epoch"] == 7
    assert r["min_s"] <= r["median_s"] <= r["max_s"]
    assert r["throughput"] == pytest.approx(7 / r["median_s"])
    assert r["rss"]["growth_anon_kb"] >= 24 << 10  # the 32 MiB the workload allocated
    assert r["params"] == {"items": 7, "alloc_mb": 32}
    quiet = run_config(_cfg("q", "bench_workloads:counter", rss=False), env=child_env)
    assert quiet["status"] == "ok" and quiet["rss"] is None


def test_failures_and_skips_are_results(child_env):
    bad = run_config(_cfg("bad", "bench_workloads:failing", {"message": "kaput-123"}), env=child_env)
    assert bad["status"] == "failed" and "kaput-123" in bad["reason"]
    assert set(bad) == set(RESULT_KEYS)
    skip = run_config(_cfg("skip", "bench_workloads:skipping", {"reason": "no gpu here"}), rounds=3, env=child_env)
    assert skip["status"] == "skipped" and skip["reason"] == "no gpu here"
    assert len(skip["rounds"]) == 1  # what cannot run here is not tried again
    pre = run_config(_cfg("pre", "bench_workloads:counter", skip="input missing"), env=child_env)
    assert pre["status"] == "skipped" and pre["reason"] == "input missing"
    miscount = run_config(_cfg("m", "bench_workloads:miscounting"), env=child_env)
    assert miscount["status"] == "failed" and "processed 11 items, expected 10" in miscount["reason"]


def test_timeout_is_a_failure(child_env):
    r = run_config(_cfg("slow", "bench_workloads:counter", timeout_s=0.01), env=child_env)
    assert r["status"] == "failed" and "timed out" in r["reason"]


def test_config_env_reaches_the_child(child_env):
    r = run_round(_cfg("e", "bench_workloads:counter", env={"TBL_BENCH_TEST_PEER": "from-config"}), env=child_env)
    assert r["info"]["peer_marker"] == "from-config"


def test_peer_configurations_run_under_the_peer_interpreter(child_env, tmp_path):
    # A "peer interpreter" that is this one behind a wrapper which marks its children.
    peer = tmp_path / "peer-python"
    peer.write_text(f'#!/bin/sh\nTBL_BENCH_TEST_PEER=yes exec "{sys.executable}" "$@"\n')
    peer.chmod(peer.stat().st_mode | stat.S_IXUSR)
    mine = run_round(_cfg("mine", "bench_workloads:counter"), peer_python=str(peer), env=child_env)
    theirs = run_round(_cfg("theirs", "bench_workloads:counter", peer=True), peer_python=str(peer), env=child_env)
    assert mine["info"]["peer_marker"] is None and mine["python"] == sys.executable
    assert theirs["info"]["peer_marker"] == "yes" and theirs["python"] == str(peer)
    # The peer sees tbl_bench through a directory holding only a link to the package.
    # (the directory is removed once the round has run).
    seen = Path(theirs["info"]["tbl_bench_file"])
    assert seen.parts[-3:] == ("path", "tbl_bench", "__init__.py") and seen != Path(mine["info"]["tbl_bench_file"])
    missing = run_round(_cfg("x", "bench_workloads:counter", peer=True), peer_python=str(tmp_path / "nope"))
    assert missing["status"] == "failed" and "does not exist" in missing["reason"]


def test_call_in(child_env, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", child_env["PYTHONPATH"])
    out = call_in(sys.executable, "bench_workloads:echo", {"a": 1, "b": [2, 3]})
    assert out["kwargs"] == {"a": 1, "b": [2, 3]} and out["pid"] != os.getpid()
    with pytest.raises(RuntimeError, match="kaput-456"):
        call_in(sys.executable, "bench_workloads:failing", {"message": "kaput-456"})


def _round(epochs, cpu=None, rss=None, info=None):
    return {"status": "ok", "reason": None, "items_per_epoch": 10, "setup_s": 0.5, "warmup_s": [1.0],
            "epochs_s": epochs, "cpu_s": cpu or epochs, "rss": rss, "info": info or {}}


def test_config_result_aggregates_rounds():
    cfg = _cfg("a", "m:f")
    rounds = [_round([1.0, 2.0, 9.0], rss={"peak_anon_kb": 5, "tree_peak_anon_kb": 9}),
              _round([4.0, 4.0, 4.0], rss={"peak_anon_kb": 7, "tree_peak_anon_kb": 8}, info={"last": True}),
              _round([0.5, 3.0, 3.0]),
              {"status": "failed", "reason": "child exited with status 1: MemoryError"}]
    r = config_result(cfg, rounds)
    assert r["status"] == "ok"
    assert r["median_s"] == 3.0  # median of the round medians 2, 4 and 3
    assert (r["min_s"], r["max_s"]) == (0.5, 9.0)
    assert r["throughput"] == pytest.approx(10 / 3.0)
    assert r["rss"] == {"peak_anon_kb": 7, "tree_peak_anon_kb": 9}
    assert r["info"] == {}  # the last ok round's
    assert r["reason"].startswith("1 of 4 rounds failed") and "MemoryError" in r["reason"]
    assert config_result(cfg, rounds[3:])["status"] == "failed"
    with pytest.raises(RuntimeError, match="different items"):
        config_result(cfg, [_round([1.0]), dict(_round([1.0]), items_per_epoch=11)])


def test_config_validation():
    with pytest.raises(ValueError, match="role"):
        _cfg("x", "m:f", role="referee")
    with pytest.raises(ValueError, match="module:function"):
        _cfg("x", "nofunction")
    with pytest.raises(ValueError, match="epochs"):
        _cfg("x", "m:f", epochs=0)
    with pytest.raises(ValueError, match="max_epochs"):
        _cfg("x", "m:f", epochs=5, max_epochs=2)


def test_a_venv_python_is_another_interpreter(tmp_path):
    """A venv's python links to the same binary as this one; it still sees other packages."""
    from tbl_bench.runner import _same_interpreter

    link = tmp_path / "bin" / "python"
    link.parent.mkdir()
    link.symlink_to(sys.executable)
    assert not _same_interpreter(str(link))
    assert _same_interpreter(sys.executable)


def test_a_run_records_the_peer_interpreters_versions(tmp_path):
    from tbl_bench.bench import run_bench
    from tbl_bench.context import BenchContext
    from tbl_bench.report import render_markdown

    peer = tmp_path / "peer-python"
    peer.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    peer.chmod(peer.stat().st_mode | stat.S_IXUSR)
    ctx = BenchContext(tmp_path / "data", quick=True, peers=True, peer_python=str(peer))
    doc = run_bench(["format_open"], ctx, tmp_path / "r.json", only=["no-such-configuration"])
    versions = doc["machine"]["peer_packages"]
    assert versions["psutil"] and versions["numpy"]
    assert f"Peer interpreter ({peer}): " in render_markdown(doc)
