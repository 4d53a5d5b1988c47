"""Two real torch.distributed (gloo) processes split one epoch into equal disjoint shards.

The test process is rank 0 (torch is already imported here) and one subprocess is
rank 1; rank and world size are taken from the initialized process group.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import make_images, write_dataset

from tbl_loader import ImageLoader
from tbl_loader.stream import order
from tbl_loader.stream.distributed import resolve_rank_world

WORKER = textwrap.dedent(
    """
    import sys
    import numpy as np
    import torch.distributed as dist
    from tbl_loader import ImageLoader

    path, store, out = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + store, rank=1, world_size=2)
    loader = ImageLoader(path, 5, seed=9, backend="torch", prefetch=2)
    assert (loader.rank, loader.world_size) == (1, 2)
    loader.set_epoch(1)
    np.save(out, np.concatenate([b.indices.numpy() for b in loader]))
    loader.close()
    dist.barrier()
    dist.destroy_process_group()
    """
)


def _rank0(path):
    loader = ImageLoader(path, 5, seed=9, backend="torch", prefetch=2)
    assert (loader.rank, loader.world_size) == (0, 2)
    loader.set_epoch(1)
    idx = np.concatenate([b.indices.numpy() for b in loader])
    loader.close()
    return idx


def test_two_gloo_processes_cover_the_epoch_once(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("torch.distributed unavailable or already initialized in this process")
    path = write_dataset(tmp_path / "ds.tbl", make_images(64, (4, 4, 3)), np.arange(64))
    store = tmp_path / "store"
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(path), str(store), str(tmp_path / "r1.npy")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=2,
                                timeout=datetime.timedelta(seconds=120))
        try:
            mine = _rank0(path)
            dist.barrier()
        finally:
            dist.destroy_process_group()
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    theirs = np.load(tmp_path / "r1.npy")
    perm = order.epoch_permutation(64, 9, 1)
    assert len(mine) == len(theirs) == 32
    assert not set(mine.tolist()) & set(theirs.tolist())
    assert np.array_equal(np.stack([mine, theirs], axis=1).reshape(-1), perm)
    assert resolve_rank_world(None, None) == (0, 1)  # the group is gone again


def test_resolve_rank_world_explicit_values():
    assert resolve_rank_world(1, 3) == (1, 3)
    with pytest.raises(ValueError, match="rank"):
        resolve_rank_world(3, 3)
    with pytest.raises(ValueError, match="world_size"):
        resolve_rank_world(0, 0)
    with pytest.raises(TypeError, match="rank"):
        resolve_rank_world(0.5, 2)
