import subprocess
import sys
import time

import numpy as np
import pytest

from tbl_bench.rss import RssSampler, read_rss, read_tree_rss

# psutil splits resident memory into anonymous and file-backed pages on Linux only.
SPLIT = sys.platform.startswith("linux")


def test_read_rss_is_plausible():
    s = read_rss()
    assert 1_000 < s.rss_kb < 64 << 20  # between 1 MiB and 64 GiB
    if SPLIT:
        assert s.file_kb > 0 and s.anon_kb > 0
        assert s.anon_kb + s.file_kb == s.rss_kb
    else:
        assert s.anon_kb is None and s.file_kb is None


def test_sampler_sees_an_anonymous_allocation():
    with RssSampler(interval=0.005) as sampler:
        buf = np.ones(64 << 20, dtype=np.uint8)  # 64 MiB, pages touched
        time.sleep(0.05)
        sampler.sample_now()  # at least one sample while buf lives, however loaded the machine (the thread may lag)
        del buf
    r = sampler.result()
    assert r["growth_rss_kb"] >= 48 << 10
    if SPLIT:
        assert r["growth_anon_kb"] >= 48 << 10
        assert r["peak_anon_kb"] >= r["baseline_anon_kb"]
        assert r["peak_file_kb"] >= r["baseline_file_kb"]
    assert r["samples"] >= 2


@pytest.mark.skipif(not SPLIT, reason="file-backed RSS is reported on Linux only")
def test_sampler_sees_a_mapped_file_as_file_backed(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"\1" * (32 << 20))
    with RssSampler(interval=0.005) as sampler:
        m = np.memmap(path, dtype=np.uint8, mode="r")
        assert int(m[:: 4096].sum()) == (32 << 20) // 4096  # touch every page
        sampler.sample_now()
        del m
    r = sampler.result()
    assert r["growth_file_kb"] >= 24 << 10
    assert r["growth_anon_kb"] < 16 << 10


def test_tree_includes_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(32 << 20); time.sleep(5)"])
    try:
        deadline = time.time() + 5
        while time.time() < deadline:
            if read_tree_rss().rss_kb - read_rss().rss_kb > 24 << 10:
                break
            time.sleep(0.05)
        assert read_tree_rss().rss_kb - read_rss().rss_kb > 24 << 10
        if SPLIT:
            assert read_tree_rss().anon_kb - read_rss().anon_kb > 24 << 10
        assert read_rss(child.pid).rss_kb > 24 << 10
    finally:
        child.kill()
        child.wait()
