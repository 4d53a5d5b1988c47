"""Mapped shards under file replacement and removal, and the bound on open maps (file descriptors)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np

import tbl_format
from tbl_format import write
from tbl_loader.pytree import PyTreeDataset, PyTreeLoader

ROWS = 300


def samples(tag: float):
    return ({"id": i, "val": np.full(8, tag + i, np.float64), "s": f"{tag}:{i}"} for i in range(ROWS))


def test_rename_over_and_unlink_while_mapped_and_read(tmp_path):
    path = write(samples(0.0), tmp_path / "d.tbl")
    ds = PyTreeDataset(path)
    old = ds.get_batch(np.arange(ROWS))
    view = ds[5]["val"]  # a zero-copy view of the old map
    loader = PyTreeLoader(path, 32, seed=1, prefetch=2, return_indices=True, backend="numpy")
    it = iter(loader)
    first = next(it)  # the producer thread is running and reading the map
    write(samples(1000.0), tmp_path / "new.tbl")
    os.replace(tmp_path / "new.tbl", path)  # a new file renamed over the mapped one
    seen = [first] + [next(it) for _ in range(3)]
    os.unlink(path)  # and now removed altogether
    seen += list(it)
    for batch, idx in seen:
        assert np.array_equal(batch["val"], old["val"][idx]) and batch["s"] == [old["s"][i] for i in idx]
    again = ds.get_batch(np.arange(ROWS))
    for key in ("id", "val"):
        assert np.array_equal(again[key], old[key])
    assert again["s"] == old["s"]
    assert np.array_equal(view, np.full(8, 5.0))
    loader.close()
    ds.close()


def test_replaced_shard_is_detected_by_a_new_open(tmp_path):
    path = write(samples(0.0), tmp_path / "ds", shard_rows=100)
    ds = PyTreeDataset(path)
    before = ds.get_batch([150])["val"]
    shard = sorted(p for p in path.iterdir() if p.suffix == ".tbl")[1]
    write(samples(7.0), tmp_path / "other.tbl")
    os.replace(tmp_path / "other.tbl", shard)
    assert np.array_equal(ds.get_batch([150])["val"], before)  # the open map serves the old bytes
    ds.close()
    try:
        ds[150]
    except tbl_format.ManifestMismatchError as exc:
        assert shard.name in str(exc)
    else:
        raise AssertionError("a shard replaced behind the manifest must be rejected")


FD_SCRIPT = textwrap.dedent(
    """
    import os, resource, sys
    import numpy as np
    from tbl_loader.pytree import PyTreeDataset
    path, shards = sys.argv[1], int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_NOFILE, (128, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    rows = 2 * shards
    ds = PyTreeDataset(path, max_open=16)
    rng = np.random.default_rng(0)
    for i in rng.integers(0, rows, 300).tolist():
        assert ds[i]["id"] == i % 2, i
    idx = rng.integers(0, rows, 256)  # touches ~230 shards: gathered in groups of at most max_open
    assert np.array_equal(ds.get_batch(idx)["id"], idx % 2)
    assert sum(1 for _ in ds) == rows
    assert ds.open_shards <= 16
    print("fds", len(os.listdir("/proc/self/fd")))
    """
)


def test_thousands_of_shards_stay_within_the_descriptor_limit(tmp_path):
    shards = 1500
    # 1,500 two-row shard files (equal rows: each shard's header names it, so none is a duplicate).
    dst = write(({"id": i % 2, "s": "x" * (i % 2)} for i in range(2 * shards)), tmp_path / "many", shard_rows=2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", FD_SCRIPT, str(dst), str(shards)], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.split()[-1]) < 64


TRUNCATE_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from tbl_loader.pytree import PyTreeDataset
    ds = PyTreeDataset(sys.argv[1])
    ds.get_batch(range(300))
    os.truncate(sys.argv[1], 4096)  # what no TBL tool ever does to a published file
    ds.get_batch(range(300))
    print("survived")
    """
)


def test_truncating_a_mapped_file_in_place_kills_the_reader_with_sigbus(tmp_path):
    """Documents why published files are immutable: the reader cannot survive an in-place truncation."""
    import signal

    path = write(samples(0.0), tmp_path / "d.tbl")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-c", TRUNCATE_SCRIPT, str(path)], capture_output=True, text=True,
                          timeout=60, env=env)
    assert proc.returncode == -signal.SIGBUS and "survived" not in proc.stdout
