"""Mixture schedules: Mix weights as a function of the step (tbl_loader.stream.schedule), served for real."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tbl_loader import Mix, Schedule
from tbl_loader.errors import MixError, ScheduleChangedError
from tbl_loader.mix import mix_counts

ID = 1_000_000  # a sample's value: source * ID + its position in the source


class Numbers:
    """A map-style source whose sample at position p is ``i * ID + p``: a batch names what was read."""

    def __init__(self, i: int, n: int) -> None:
        self.i, self.n, self.fingerprint = i, n, f"numbers-{i}-{n}"

    def __len__(self) -> int:
        return self.n

    def get_batch(self, positions):
        return np.asarray(list(positions), np.int64) + self.i * ID


def _sources(count: int, size: int = 50_000) -> list[Numbers]:
    return [Numbers(i, size + 7 * i) for i in range(count)]


def _ramp(count: int, seed: int = 0) -> Schedule:
    rng = np.random.default_rng(seed)
    w0, w1 = rng.uniform(0.5, 1.5, count), rng.uniform(0.5, 1.5, count)
    return Schedule.linear([(0, w0.tolist()), (3000, w1.tolist()), (5000, w0.tolist())])


def _run(mix: Mix, steps: int) -> list[np.ndarray]:
    out = []
    while len(out) < steps:
        for batch in mix:
            out.append(np.asarray(batch))
            if len(out) == steps:
                break
    return out


def test_realized_proportions_per_1000_steps_within_one_percent_for_100_sources():
    """100 sources, a linear schedule (ramps over 3000 and 2000 steps), 64 samples a step: every source's
    share of every 1000-step segment actually served is within 1% (relative) of the schedule's mean weight over
    the segment."""
    sources = _sources(100)
    schedule = _ramp(100)
    mix = Mix(sources, weights=schedule, batch_size=64, epoch_size=1_000_000, seed=3, prefetch=2)
    batches = _run(mix, 5000)
    served = np.concatenate(batches) // ID
    worst = 0.0
    for segment in range(5):
        a, b = segment * 1000 * 64, (segment + 1) * 1000 * 64
        observed = np.bincount(served[a:b], minlength=100) / (b - a)
        steps = np.linspace(segment * 1000, (segment + 1) * 1000, 2001)  # the mean weight, integrated numerically
        requested = np.mean([schedule.weights_at(s) for s in steps[:-1] + 0.25], axis=0)
        rel = np.abs(observed - requested) / requested
        worst = max(worst, float(rel.max()))
        assert rel.max() < 0.01, (segment, float(rel.max()))
    assert worst > 0  # a real measurement: served counts are integers, the requests are not
    # The same figures from the Mix itself, at any time.
    report = mix.proportions(last_steps=1000)
    assert (report["start"], report["stop"]) == (4000 * 64, 5000 * 64)
    assert np.abs(report["observed"] - report["requested"]).max() < 0.01 * report["requested"].min()
    mix.close()


def test_every_source_is_walked_through_its_permutation():
    """Draws never repeat a sample before the whole source was seen, whatever the ramp."""
    sources = [Numbers(i, 300 + i) for i in range(5)]
    mix = Mix(sources, weights=Schedule.linear([(0, [1, 0, 0, 1, 1]), (40, [0, 1, 1, 1, 0])]), batch_size=10,
              epoch_size=170, seed=1, prefetch=0)
    served = np.concatenate(_run(mix, 100))
    for i, source in enumerate(sources):
        mine = served[served // ID == i] % ID
        for start in range(0, mine.shape[0], len(source)):
            part = mine[start:start + len(source)]
            assert np.unique(part).shape[0] == part.shape[0], i
    mix.close()


@pytest.mark.parametrize("mode", ["smooth", "epoch"])
def test_resume_in_the_middle_of_a_ramp_is_the_straight_run(mode):
    sources = _sources(12, 400)
    schedule = Schedule.linear([(0, [1] * 6 + [0] * 6), (150, [0] * 6 + [1] * 6), (220, [1] * 12)])
    kw = dict(weights=schedule, batch_size=16, epoch_size=1000, seed=7, mode=mode)
    straight = _run(Mix(sources, **kw, prefetch=0), 300)
    first = Mix(sources, **kw, prefetch=2)
    head = _run(first, 77)  # step 77: mid-ramp, mid-epoch (1232 samples: epoch 1, position 232)
    state = first.state_dict()
    first.close()
    second = Mix(sources, **kw, prefetch=1)
    second.load_state_dict(json.loads(json.dumps(state)))  # a state survives JSON
    middle = _run(second, 123)
    state = second.state_dict()
    second.close()
    third = Mix(sources, **{**kw, "batch_size": 8}, step_samples=16, prefetch=0)  # another batch size
    third.load_state_dict(state)
    want = np.concatenate(straight)
    got = np.concatenate(head + middle)
    tail = []
    while got.shape[0] + sum(t.shape[0] for t in tail) < want.shape[0]:
        tail += _run(third, 1)
    got = np.concatenate([got, *tail])
    assert got.shape == want.shape
    assert np.array_equal(got, want)  # element for element, over epoch ends and the whole ramp


def test_one_rank_and_two_ranks_serve_the_same_steps():
    sources = _sources(20, 500)
    schedule = _ramp(20)
    one = _run(Mix(sources, weights=schedule, batch_size=32, epoch_size=3200, seed=2, prefetch=0), 150)
    ranks = [_run(Mix(sources, weights=schedule, batch_size=16, epoch_size=3200, seed=2, prefetch=0, rank=r,
                      world_size=2), 150) for r in range(2)]
    for k in range(150):
        both = np.empty(32, np.int64)
        both[0::2], both[1::2] = ranks[0][k], ranks[1][k]  # rank r takes positions r, r + 2, ...
        assert np.array_equal(both, one[k]), k


def test_a_changed_schedule_is_refused_by_name_or_taken_from_here():
    sources = _sources(4, 2000)
    old = Schedule.linear([(0, [1, 1, 0, 0]), (100, [0, 0, 1, 1])])
    new = Schedule.piecewise([(0, [1, 0, 0, 0]), (60, [0, 0, 0, 1])])
    mix = Mix(sources, weights=old, batch_size=10, epoch_size=5000, seed=4, prefetch=0)
    head = _run(mix, 50)
    state = mix.state_dict()
    assert state["mix_schedule"]["hash"] == old.hash != new.hash
    changed = Mix(sources, weights=new, batch_size=10, epoch_size=5000, seed=4, prefetch=0)
    with pytest.raises(ScheduleChangedError, match=old.hash):
        changed.load_state_dict(state)
    changed.load_state_dict(state, accept_schedule_change=True)
    tail = _run(changed, 30)
    served = np.concatenate(head + tail)
    # From step 50 the new schedule (source 0 until step 60, then source 3), and no source repeats a sample.
    assert set((np.concatenate(tail[:10]) // ID).tolist()) == {0}
    assert set((np.concatenate(tail[10:]) // ID).tolist()) == {3}
    for i in range(4):
        mine = served[served // ID == i]
        assert np.unique(mine).shape[0] == mine.shape[0], i
    report = changed.proportions()
    assert report["start"] == 500 and report["stop"] == 800
    assert np.allclose(report["observed"], report["requested"], atol=0.01)
    # The switched run resumes exactly too: its state carries the new origin.
    again = changed.state_dict()
    straight = _run(changed, 20)
    resumed = Mix(sources, weights=new, batch_size=10, epoch_size=5000, seed=4, prefetch=0)
    resumed.load_state_dict(again)
    assert all(np.array_equal(a, b) for a, b in zip(_run(resumed, 20), straight, strict=True))
    # In epoch mode, only at an epoch's start.
    epochs = Mix(sources, weights=new, batch_size=10, epoch_size=5000, seed=4, prefetch=0, mode="epoch")
    with pytest.raises(ScheduleChangedError, match="epoch's start"):
        epochs.load_state_dict(state, accept_schedule_change=True)


def test_epoch_mode_counts_exactly_and_plain_weights_are_unchanged():
    sources = _sources(3, 100)
    plain = Mix(sources, weights=(0.5, 0.3, 0.2), batch_size=7, epoch_size=200, seed=5, prefetch=0)
    same = Mix(sources, weights=Schedule.constant((0.5, 0.3, 0.2)), mode="epoch", batch_size=7, epoch_size=200,
               seed=5, prefetch=0)
    for epoch in range(3):
        for a, b in zip(plain.schedule(epoch), same.schedule(epoch), strict=True):
            assert np.array_equal(a, b)
    assert "mix_schedule" not in plain.state_dict()  # the state of a plain-weights Mix is as before
    ramp = Schedule.linear([(0, [1, 0, 0]), (50, [0, 0, 1])])
    mix = Mix(sources, weights=ramp, mode="epoch", batch_size=10, epoch_size=200, seed=5, prefetch=0)
    for epoch in range(4):
        src = mix.schedule(epoch)[0]
        a, b = epoch * 200, (epoch + 1) * 200
        mean = mix.timeline.cumulative(b) - mix.timeline.cumulative(a)
        assert np.bincount(src, minlength=3).tolist() == mix_counts(mean, 200).tolist()
    assert np.bincount(mix.schedule(0)[0], minlength=3).tolist() == [160, 0, 40]  # steps 0..20 of 50: mean (0.8, 0, 0.2)


def test_schedules_are_deterministic_per_seed():
    sources = _sources(6, 300)
    schedule = _ramp(6, seed=1)
    a = Mix(sources, weights=schedule, batch_size=8, epoch_size=900, seed=1, prefetch=0)
    b = Mix(sources, weights=schedule, batch_size=8, epoch_size=900, seed=1, prefetch=0)
    c = Mix(sources, weights=schedule, batch_size=8, epoch_size=900, seed=2, prefetch=0)
    for epoch in range(2):
        assert np.array_equal(a.schedule(epoch)[0], b.schedule(epoch)[0])
        assert np.array_equal(a.schedule(epoch)[1], b.schedule(epoch)[1])
        assert not np.array_equal(a.schedule(epoch)[0], c.schedule(epoch)[0])


def test_schedule_json_hash_and_refusals(tmp_path):
    s = Schedule.linear([(0, [3, 1]), (100, [1, 1])])
    assert s.weights == ((0.75, 0.25), (0.5, 0.5))
    assert Schedule.from_json(s.to_json()) == s and Schedule.from_json(s.to_json()).hash == s.hash
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps([[0, [1, 0]], [10, [0, 1]]]))
    loaded = Schedule.from_json(path)
    assert loaded.kind == "piecewise" and loaded.weights_at(9.9).tolist() == [1, 0]
    assert s.weights_at(50).tolist() == [0.625, 0.375]
    assert Schedule.linear([(0, [1, 0]), (100, [0, 1])]).hash != Schedule.piecewise([(0, [1, 0]), (100, [0, 1])]).hash
    for bad in ([(5, [1, 1])], [(0, [1, 1]), (0, [1, 1])], [(0, [1, 1]), (10, [1])], [(0, [0, 0])],
                [(0, [1, -1])], [], [(0.5, [1])]):
        with pytest.raises(MixError):
            Schedule.linear(bad)
    with pytest.raises(MixError, match="parse"):
        Schedule.from_json("{not json")
    with pytest.raises(MixError, match="2 sources"):
        Mix(_sources(3, 10), weights=Schedule.constant([1, 1]), batch_size=2)
    with pytest.raises(MixError, match="mode"):
        Mix(_sources(2, 10), weights=(1, 1), batch_size=2, mode="round_robin")


def test_smooth_mode_computes_only_the_positions_it_serves():
    """An epoch of 10**7 samples: the Mix makes only the chunks of positions its batches read (the stream
    cursor still holds the epoch's order), and a resume half way costs a step."""
    sources = _sources(5, 100)
    mix = Mix(sources, weights=_ramp(5), batch_size=8, epoch_size=10**7, seed=0, prefetch=0)
    head = np.concatenate(_run(mix, 3))
    assert np.array_equal(head // ID, mix.timeline.window(0, 24)[0])
    state = {**mix.state_dict(), "consumed": 5 * 10**6}
    mix.load_state_dict(state)
    far = np.concatenate(_run(mix, 2))
    assert len(mix._chunks) <= 2  # the first chunk, and the one at the resumed position
    src, draws, before = mix.timeline.window(5 * 10**6, 5 * 10**6 + 16)
    assert np.array_equal(far // ID, src)
    assert int(before.sum()) == 5 * 10**6 and np.all(draws >= before[src])
    mix.close()
