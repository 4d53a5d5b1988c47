"""Mid-epoch resume: state dicts are interchangeable between ImageLoader and ResidentImageLoader."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import N_IMAGES, collect

from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_loader.errors import StateMismatchError
from tbl_resident import ResidentImageLoader

CROP = RandomResizedCrop((8, 6), scale=(0.2, 1.0))


@pytest.mark.parametrize("aug", [{"hflip": 0.5}, {"hflip": 0.5, "random_resized_crop": CROP},
                                 {"center_crop": 8}])
@pytest.mark.parametrize("direction", ["cpu->resident", "resident->cpu", "resident->resident"])
def test_mid_epoch_resume_across_loaders(dataset_path, aug, direction):
    kwargs = dict(seed=11, dtype="float16", **aug)

    def make(kind, batch_size):
        if kind == "cpu":
            return ImageLoader(dataset_path, batch_size, backend="torch", prefetch=0, **kwargs)
        return ResidentImageLoader(dataset_path, batch_size, device="cpu", **kwargs)

    src_kind, dst_kind = direction.replace("resident", "res").split("->")
    with make("cpu", 16) as straight:
        straight.set_epoch(1)
        want, want_lab, want_idx = collect(straight)
    with make(src_kind, 16) as first:
        first.set_epoch(1)
        head, head_lab, head_idx = collect(first, limit=3)
        state = first.state_dict()
    assert state["epoch"] == 1 and state["consumed"] == 48
    with make(dst_kind, 7) as second:  # another batch size: still exactly the rest of the epoch
        second.load_state_dict(state)
        second.set_epoch(1)  # the usual call at the top of a resumed loop keeps the position
        tail, tail_lab, tail_idx = collect(second)
        assert second.state_dict()["epoch"] == 2
    assert np.array_equal(np.concatenate([head_idx, tail_idx]), want_idx)
    assert np.array_equal(np.concatenate([head, tail]), want)
    assert np.array_equal(np.concatenate([head_lab, tail_lab]), want_lab)


def test_state_dicts_are_identical(dataset_path):
    kwargs = dict(seed=5, hflip=0.25, random_resized_crop=CROP, drop_last=True, padding="drop")
    with (ImageLoader(dataset_path, 16, backend="torch", **kwargs) as cpu,
          ResidentImageLoader(dataset_path, 16, device="cpu", **kwargs) as res):
        assert cpu.state_dict() == res.state_dict()
        collect(cpu, 2)
        collect(res, 2)
        assert cpu.state_dict() == res.state_dict()


def test_elastic_resume_changes_world_size(dataset_path):
    """Two ranks stop mid-epoch; three ranks finish it: nothing lost or repeated."""
    kwargs = dict(seed=2, hflip=0.5, padding="drop")
    head = []
    for rank in range(2):
        with ResidentImageLoader(dataset_path, 10, device="cpu", rank=rank, world_size=2, **kwargs) as r:
            _, _, idx = collect(r, limit=2)
            head.append(idx)
            state = r.state_dict()
    assert state["consumed"] == 40
    tail = []
    for rank in range(3):
        with ResidentImageLoader(dataset_path, 10, device="cpu", rank=rank, world_size=3, **kwargs) as r:
            r.load_state_dict(state)
            _, _, idx = collect(r)
            tail.append(idx)
    served = np.concatenate(head + tail)
    assert len(np.unique(served)) == len(served)
    assert len(served) == 40 + (N_IMAGES - 40) // 3 * 3


def test_break_then_continue_and_set_epoch(dataset_path):
    with ResidentImageLoader(dataset_path, 16, device="cpu", seed=1) as r, \
            ResidentImageLoader(dataset_path, 16, device="cpu", seed=1) as straight:
        want, _, _ = collect(straight)
        head, _, _ = collect(r, 2)  # break after two batches
        tail, _, _ = collect(r)  # the next iter continues where the first stopped
        assert np.array_equal(np.concatenate([head, tail]), want)
        it = iter(r)  # epoch 1
        next(it)
        r.set_epoch(5)  # moving elsewhere ends the running pass
        with pytest.raises(StopIteration):
            next(it)
        assert r.state_dict()["epoch"] == 5 and r.state_dict()["consumed"] == 0


def test_mismatched_state_is_refused(dataset_path):
    with ResidentImageLoader(dataset_path, 16, device="cpu", hflip=0.5) as a, \
            ResidentImageLoader(dataset_path, 16, device="cpu", hflip=0.25) as b:
        with pytest.raises(StateMismatchError):
            b.load_state_dict(a.state_dict())


def test_next_epoch_order_computed_ahead_matches_and_thread_ends(dataset_path):
    import threading

    from tbl_loader.stream import order
    from tbl_resident.order_ahead import OrderAhead, pass_order

    ahead = OrderAhead(seed=3, hflip=0.5)
    first = order.EpochOrder(N_IMAGES, 3, 0, world_size=2, rank=1)
    ids, flips = ahead.get(first)
    assert np.array_equal(ids, first.indices)
    following = order.EpochOrder(N_IMAGES, 3, 1, world_size=2, rank=1)
    ids1, flips1 = ahead.get(following)  # served from the background result
    want_ids, want_flips = pass_order(following, 3, 0.5)
    assert np.array_equal(ids1, want_ids) and np.array_equal(flips1, want_flips)
    resumed = order.EpochOrder(N_IMAGES, 3, 2, world_size=2, rank=1, start=10)  # not what was prepared
    assert np.array_equal(ahead.get(resumed)[0], resumed.indices)
    ahead.close()
    assert not any(t.name.startswith("tbl-resident-order") for t in threading.enumerate())

    with ResidentImageLoader(dataset_path, 16, device="cpu", hflip=0.5) as r:
        collect(r)
        collect(r)
    assert not any(t.name.startswith("tbl-resident-order") for t in threading.enumerate())
