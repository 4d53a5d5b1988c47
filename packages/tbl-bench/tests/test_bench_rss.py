import subprocess
import sys
import time

import numpy as np

from tbl_bench.rss import RssSampler, read_rss, read_tree_rss


def test_read_rss_is_plausible():
    s = read_rss()
    assert 1_000 < s.anon_kb < 64 << 20  # between 1 MiB and 64 GiB
    assert s.file_kb > 0


def test_sampler_sees_an_anonymous_allocation():
    with RssSampler(interval=0.005) as sampler:
        buf = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, pages touched
        time.sleep(0.05)
        del buf
    r = sampler.result()
    assert r["growth_anon_kb"] >= 48 << 10
    assert r["peak_anon_kb"] >= r["baseline_anon_kb"]
    assert r["peak_file_kb"] >= r["baseline_file_kb"]
    assert r["samples"] >= 2


def test_tree_includes_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(32 << 20); time.sleep(5)"])
    try:
        deadline = time.time() + 5
        while time.time() < deadline:
            if read_tree_rss().anon_kb - read_rss().anon_kb > 24 << 10:
                break
            time.sleep(0.05)
        assert read_tree_rss().anon_kb - read_rss().anon_kb > 24 << 10
    finally:
        child.kill()
        child.wait()
