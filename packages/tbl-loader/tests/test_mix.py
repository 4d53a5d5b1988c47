"""Mix: exact proportions, a schedule that is a pure function of (seed, epoch), exact and elastic resume."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_images, write_dataset

import tbl_format
from tbl_loader import ImageDataset, ImageLoader, Mix, PyTreeDataset
from tbl_loader.errors import MixError, StateMismatchError
from tbl_loader.mix import mix_counts, mix_schedule

SIZES = (50, 37, 23)
WEIGHTS = (0.5, 0.3, 0.2)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    paths = []
    for s, n in enumerate(SIZES):
        samples = ({"src": s, "i": i, "vec": np.full(3, s * 1000 + i, np.int32), "name": f"{s}-{i}"} for i in range(n))
        paths.append(tbl_format.write(samples, root / f"ds{s}", shard_rows=16))
    return paths


def _mix(paths, **kw):
    kw.setdefault("weights", WEIGHTS)
    kw.setdefault("epoch_size", 200)
    kw.setdefault("batch_size", 9)
    kw.setdefault("seed", 5)
    kw.setdefault("prefetch", 0)
    return Mix([PyTreeDataset(p) for p in paths], return_sources=True, **kw)


def _rows(batches):
    """Every element of every batch, as (src, i, vec, name, source index) arrays."""
    out = {k: [] for k in ("src", "i", "vec", "name", "sources")}
    for batch, sources in batches:
        for k in ("src", "i", "vec"):
            out[k].append(np.asarray(batch[k]))
        out["name"].append(np.asarray(batch["name"]))
        out["sources"].append(sources)
    return {k: np.concatenate(v) for k, v in out.items()}


def _equal(a, b):
    assert all(np.array_equal(a[k], b[k]) for k in a)


def _take(it, n):
    return [next(it) for _ in range(n)]


def test_counts_are_exact_and_largest_remainder():
    assert mix_counts(WEIGHTS, 1000).tolist() == [500, 300, 200]
    assert mix_counts((1, 1, 1), 10).tolist() == [4, 3, 3]
    assert mix_counts((0.5, 0.3, 0.2), 7).tolist() == [4, 2, 1]
    assert int(mix_counts((0.1, 0.7, 0.2), 12345).sum()) == 12345


def test_realized_proportions_and_whole_source_permutations(sources):
    mix = _mix(sources, epoch_size=1000, batch_size=64)
    seen = {s: [] for s in range(3)}
    for _ in range(3):
        rows = _rows(mix)
        assert np.array_equal(rows["src"], rows["sources"])
        counts = np.bincount(rows["src"], minlength=3)
        assert counts.tolist() == [500, 300, 200]
        for s in range(3):
            seen[s].extend(rows["i"][rows["src"] == s].tolist())
    for s, n in enumerate(SIZES):
        # every source is walked through whole permutations: each block of n draws is 0..n-1 once
        draws = seen[s]
        for a in range(0, len(draws) - n + 1, n):
            assert sorted(draws[a : a + n]) == list(range(n))
    mix.close()


def test_schedule_is_a_pure_function_of_seed_and_epoch(sources):
    counts = mix_counts(WEIGHTS, 200)
    a = mix_schedule(5, 3, counts, SIZES)
    b = mix_schedule(5, 3, counts, SIZES)
    c = mix_schedule(6, 3, counts, SIZES)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    one = _mix(sources)
    for _ in range(3):  # the third epoch, reached by iterating ...
        last = _rows(one)
    jumped = _mix(sources)
    jumped.set_epoch(2)  # ... equals the third epoch reached by a jump
    _equal(_rows(jumped), last)


@pytest.mark.parametrize("stop", [0, 1, 7, 22])
def test_resume_yields_exactly_the_rest(sources, stop):
    straight = _mix(sources, prefetch=2)
    epochs = [_rows(straight) for _ in range(2)]
    first = _mix(sources)
    it = iter(first)
    head = _take(it, stop)  # 200 / 9 -> 23 batches; 22 stops before the last
    state = first.state_dict()
    resumed = _mix(sources, batch_size=16, prefetch=2)  # another batch size and prefetch
    resumed.load_state_dict(state)
    assert resumed.batches_left == -(-(200 - 9 * stop) // 16)
    tail = list(resumed)
    _equal(_rows(head + tail) if head else _rows(tail), epochs[0])
    _equal(_rows(resumed), epochs[1])


def test_resume_after_several_epochs_and_at_the_end_of_an_epoch(sources):
    """The failures reported for other mixers: resuming past the first epoch, and at an epoch's last sample."""
    straight = _mix(sources, epoch_size=120)
    epochs = [_rows(straight) for _ in range(4)]
    run = _mix(sources, epoch_size=120)
    for _ in range(2):
        _rows(run)
    it = iter(run)
    head = _take(it, 5)
    state = run.state_dict()
    assert state["epoch"] == 2
    resumed = _mix(sources, epoch_size=120)
    resumed.load_state_dict(state)
    _equal(_rows(head + list(resumed)), epochs[2])
    end = _mix(sources, epoch_size=120)
    end.load_state_dict({**state, "consumed": 120})  # saved after the last batch of epoch 2
    assert list(end) == []
    _equal(_rows(end), epochs[3])


def test_two_ranks_interleave_to_one_and_elastic_two_to_three(sources):
    kw = dict(padding="drop", batch_size=4)
    whole = _rows(_mix(sources, **kw))
    ranks = [_rows(_mix(sources, rank=r, world_size=2, **kw)) for r in range(2)]
    for k in whole:
        both = np.empty((2 * len(ranks[0][k]), *ranks[0][k].shape[1:]), ranks[0][k].dtype)
        both[0::2], both[1::2] = ranks[0][k], ranks[1][k]
        assert np.array_equal(both, whole[k][: len(both)])
    # elastic: 2 ranks take 5 steps, 3 ranks finish the epoch
    two = [_mix(sources, rank=r, world_size=2, **kw) for r in range(2)]
    its = [iter(m) for m in two]
    heads = [_rows(_take(it, 5)) for it in its]
    state = two[0].state_dict()
    assert state == two[1].state_dict() and state["consumed"] == 40
    three = [_mix(sources, rank=r, world_size=3, **kw) for r in range(3)]
    for m in three:
        m.load_state_dict(state)
    tails = [_rows(m) for m in three]
    for k in whole:
        head = np.empty((40, *heads[0][k].shape[1:]), heads[0][k].dtype)
        head[0::2], head[1::2] = heads[0][k], heads[1][k]
        m = len(tails[0][k])
        tail = np.empty((3 * m, *tails[0][k].shape[1:]), tails[0][k].dtype)
        for r in range(3):
            tail[r::3] = tails[r][k]
        assert np.array_equal(np.concatenate([head, tail]), whole[k][: 40 + 3 * m])
        assert 40 + 3 * m == 200 - (200 - 40) % 3


def test_mix_of_image_loaders_joins_batches(tmp_path):
    images = [make_images(n, seed=s) for s, n in enumerate((30, 20))]
    paths = [write_dataset(tmp_path / f"im{s}.tbl", im, np.arange(len(im)) + 100 * s) for s, im in enumerate(images)]
    loaders = [ImageLoader(p, 4, backend="numpy", hflip=0.5, seed=1) for p in paths]
    mix = Mix(loaders, weights=(0.6, 0.4), epoch_size=40, batch_size=8, seed=3, return_sources=True, prefetch=1)
    twins = [ImageDataset.from_loader(x) for x in loaders]
    src_all, pos_all, ep_all = mix.schedule(0)
    for k, (batch, src) in enumerate(mix):
        ids = np.arange(8 * k, 8 * (k + 1))
        assert np.array_equal(src, src_all[ids])
        for j, (s, p, e) in enumerate(zip(src, pos_all[ids], ep_all[ids], strict=True)):
            want = twins[s].get_batch([p], epoch=e)
            assert np.array_equal(batch.images[j], want.images[0]) and batch.labels[j] == want.labels[0]
            assert batch.keys[j] == want.keys[0]
    for x in (*loaders, mix, *twins):
        x.close()


def test_errors(sources, tmp_path):
    ds = [PyTreeDataset(p) for p in sources]
    with pytest.raises(MixError, match="weights"):
        Mix(ds, weights=(1, 2), batch_size=4)
    with pytest.raises(MixError, match="weights"):
        Mix(ds, weights=(1, -1, 1), batch_size=4)
    with pytest.raises(MixError, match="epoch_size"):
        Mix(ds, epoch_size=0, batch_size=4)
    with pytest.raises(MixError, match="map-style"):
        Mix([object()], batch_size=4)
    a = _mix(sources)
    next(iter(a))
    other = _mix(sources, weights=(0.4, 0.4, 0.2))
    with pytest.raises(StateMismatchError):
        other.load_state_dict(a.state_dict())
    seqs = [tbl_format.write(({"seq": np.arange(i % 4 + k)} for i in range(10)), tmp_path / f"s{k}",
                             variable=["seq"], shard_rows=5) for k in (1, 2)]
    padded = Mix([PyTreeDataset(p, var="pad") for p in seqs], batch_size=8, prefetch=0)
    with pytest.raises(MixError, match="Padded"):
        list(padded)


def test_a_source_without_a_fingerprint_is_refused_by_name():
    from tbl_loader.errors import MixError

    class Rows:  # map-style, but nothing identifies its data: a state of another Mix would load silently
        def __len__(self):
            return 4

        def get_batch(self, positions):
            return list(positions)

    with pytest.raises(MixError, match="fingerprint"):
        Mix([Rows()], batch_size=2)
