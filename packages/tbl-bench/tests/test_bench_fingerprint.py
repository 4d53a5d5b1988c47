import psutil

from tbl_bench.fingerprint import cpu_model, load_average, machine_fingerprint, usable_cores


def test_machine_facts_come_from_psutil():
    m = machine_fingerprint(bandwidth_bytes=1 << 20)
    assert m["cpu_model"] == cpu_model() and m["cpu_model"] not in ("", "unknown")
    assert m["cpu_count"] == psutil.cpu_count(logical=True)
    assert 1 <= m["usable_cores"] <= m["cpu_count"]
    assert m["mem_total_kb"] == psutil.virtual_memory().total >> 10
    assert len(m["loadavg_start"]) == 3 and all(x >= 0 for x in m["loadavg_start"])
    assert m["memcpy_gbps"] > 0
    assert m["packages"]["psutil"] == psutil.__version__


def test_usable_cores_and_load():
    assert usable_cores() >= 1
    assert len(load_average()) == 3
