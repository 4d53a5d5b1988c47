"""state_dict / load_state_dict: exact resume, elastic world sizes, fingerprint checks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import N_IMAGES, collect, make_images, write_dataset

from tbl_loader import ImageLoader, RandomResizedCrop
from tbl_loader.errors import StateMismatchError
from tbl_loader.stream import order

AUG = {"seed": 5, "hflip": 0.5, "random_resized_crop": RandomResizedCrop(6, scale=(0.25, 1.0))}


def _loader(path, batch_size=8, **kwargs):
    return ImageLoader(path, batch_size, backend="numpy", **{**AUG, **kwargs})


@pytest.fixture(scope="module")
def straight(dataset_path):
    with _loader(dataset_path) as loader:
        loader.set_epoch(2)
        return collect(loader)


def test_state_dict_is_small_and_json(dataset_path):
    loader = _loader(dataset_path)
    sd = loader.state_dict()
    assert set(sd) == {"version", "seed", "epoch", "consumed", "dataset", "settings", "stream_settings"}
    assert json.loads(json.dumps(sd)) == sd  # JSON values only: it survives any checkpoint format
    assert len(json.dumps(sd)) < 600
    loader.close()


@pytest.mark.parametrize("k", [0, 1, 5, 12])
@pytest.mark.parametrize("new_batch", [8, 3, 50])
def test_resume_yields_exactly_the_rest_of_the_epoch(dataset_path, straight, k, new_batch):
    first = _loader(dataset_path)
    first.set_epoch(2)
    head = collect(first, limit=k)
    state = first.state_dict()
    assert state["epoch"] == 2 and state["consumed"] == min(8 * k, N_IMAGES) % N_IMAGES
    first.close()
    resumed = _loader(dataset_path, batch_size=new_batch, prefetch=0)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    resumed.set_epoch(2)  # the usual call at the top of a resumed loop keeps the position
    tail = collect(resumed)
    for field in range(3):
        parts = [p for p in (head[field], tail[field]) if p is not None and len(p)]
        assert np.array_equal(np.concatenate(parts), straight[field])
    assert resumed.epoch == 3 and resumed.consumed == 0
    resumed.close()


def test_state_after_the_last_batch_is_the_next_epoch(dataset_path):
    loader = _loader(dataset_path, batch_size=50)
    it = iter(loader)
    next(it)
    next(it)
    assert loader.state_dict()["consumed"] == 100
    next(it)
    assert (loader.state_dict()["epoch"], loader.state_dict()["consumed"]) == (1, 0)
    loader.close()


def test_break_then_iterate_again_continues_the_epoch(dataset_path, straight):
    loader = _loader(dataset_path)
    loader.set_epoch(2)
    head = collect(loader, limit=4)
    tail = collect(loader)
    assert np.array_equal(np.concatenate([head[2], tail[2]]), straight[2])
    loader.close()


def test_set_epoch_to_another_epoch_starts_it_from_the_beginning(dataset_path):
    loader = _loader(dataset_path)
    collect(loader, limit=3)
    loader.set_epoch(4)
    assert loader.consumed == 0
    assert np.array_equal(collect(loader)[2], order.epoch_permutation(N_IMAGES, 5, 4))
    with pytest.raises(ValueError, match="epoch"):
        loader.set_epoch(-1)
    loader.close()


@pytest.mark.parametrize("new_world", [1, 3])
def test_elastic_resume_loses_and_repeats_nothing(dataset_path, new_world):
    perm = order.epoch_permutation(N_IMAGES, 5, 1)
    k = 3
    seen, images, states = [], {}, []
    for r in range(2):
        loader = _loader(dataset_path, world_size=2, rank=r)
        loader.set_epoch(1)
        imgs, _, idx = collect(loader, limit=k)
        seen.append(idx)
        images.update(zip(idx.tolist(), imgs, strict=True))
        states.append(loader.state_dict())
        loader.close()
    assert states[0] == states[1]  # lockstep ranks agree on the global position
    assert states[0]["consumed"] == 2 * k * 8
    after = []
    for r in range(new_world):
        loader = _loader(dataset_path, batch_size=5, world_size=new_world, rank=r)
        loader.load_state_dict(states[r % 2])
        imgs, _, idx = collect(loader)
        after.append(idx)
        for i, img in zip(idx.tolist(), imgs, strict=True):
            if i in images:
                assert np.array_equal(images[i], img)  # a padded repeat carries the same augmentation
            images[i] = img
        assert loader.epoch == 2
        loader.close()
    done = np.concatenate(seen)
    rest = np.stack(after, axis=1).reshape(-1) if new_world > 1 else after[0]
    remaining = perm[len(done):]
    assert np.array_equal(np.sort(done), np.sort(perm[: len(done)]))
    # Everything after the saved position exactly once, plus only the wrap padding the new world needs.
    pad = (-len(remaining)) % new_world
    assert np.array_equal(rest, np.concatenate([remaining, perm[:pad]]))
    assert np.array_equal(np.sort(np.concatenate([done, rest[: len(remaining)]])), np.arange(N_IMAGES))
    # Every sample's augmentation equals the straight single-rank stream's.
    with _loader(dataset_path) as single:
        single.set_epoch(1)
        s_imgs, _, s_idx = collect(single)
    for i, img in zip(s_idx.tolist(), s_imgs, strict=True):
        assert np.array_equal(images[i], img)


def test_drop_padding_resume_covers_a_multiple_of_the_world(dataset_path):
    perm = order.epoch_permutation(N_IMAGES, 5, 0)
    loader = _loader(dataset_path, world_size=2, rank=0, padding="drop")
    collect(loader, limit=2)
    state = loader.state_dict()
    loader.close()
    got = []
    for r in range(3):
        with _loader(dataset_path, world_size=3, rank=r, padding="drop") as part:
            part.load_state_dict(state)
            got.append(collect(part)[2])
    rest = np.stack(got, axis=1).reshape(-1)
    assert np.array_equal(rest, perm[32 : 32 + (N_IMAGES - 32) // 3 * 3])


@pytest.mark.parametrize(
    "change,named",
    [
        ({"hflip": 0.25}, "state was saved with hflip=0.5, this loader has hflip=0.25"),
        ({"random_resized_crop": RandomResizedCrop(6, scale=(0.5, 1.0))},
         "state was saved with crop.random_resized.scale=[0.25, 1.0], this loader has "
         "crop.random_resized.scale=[0.5, 1.0]"),
        ({"random_resized_crop": None}, "state was saved with crop={'random_resized': "),
        ({"random_resized_crop": None, "center_crop": 6}, "state was saved without crop.center, this loader has crop.center=[6, 6]"),
        ({"shuffle": False}, "state was saved with shuffle=True, this loader has shuffle=False"),
        ({"drop_last": True}, "state was saved with drop_last=False, this loader has drop_last=True"),
        ({"padding": "drop"}, "state was saved with padding='wrap', this loader has padding='drop'"),
        ({"rows": range(0, 40)}, "state was saved without subset, this loader has subset="),
        ({"subsample": 0.5}, "state was saved without subset, this loader has subset="),
    ],
)
def test_settings_that_change_the_stream_are_checked(dataset_path, change, named):
    state = _loader(dataset_path).state_dict()
    other = _loader(dataset_path, **change)
    with pytest.raises(StateMismatchError, match="stream settings differ") as refused:
        other.load_state_dict(state)
    assert named in str(refused.value)
    assert "seed" not in str(refused.value)  # only the setting that differs is named
    other.close()


def test_a_mismatch_names_every_differing_setting_and_nothing_else(dataset_path):
    state = _loader(dataset_path).state_dict()
    with _loader(dataset_path, hflip=0.25, drop_last=True) as other:
        with pytest.raises(StateMismatchError) as refused:
            other.load_state_dict(state)
    message = str(refused.value)
    assert message == ("stream settings differ: state was saved with drop_last=False, this loader has drop_last=True; "
                       "state was saved with hflip=0.5, this loader has hflip=0.25")


def test_the_fingerprint_stays_the_authority_over_the_recorded_settings(dataset_path):
    with _loader(dataset_path) as loader:
        state = loader.state_dict()
        # Settings recorded as equal, fingerprint different (a state of another order version, or edited): refused.
        with pytest.raises(StateMismatchError, match="other stream settings"):
            loader.load_state_dict({**state, "settings": "0" * 32})
        # Settings recorded as different, fingerprint equal: the fingerprint decides, the state loads.
        loader.load_state_dict({**state, "stream_settings": {**state["stream_settings"], "hflip": 0.25}})
        with pytest.raises(StateMismatchError, match="stream_settings"):
            loader.load_state_dict({**state, "stream_settings": [1, 2]})


def test_a_state_without_recorded_settings_falls_back_to_the_fingerprint_message(dataset_path):
    state = {k: v for k, v in _loader(dataset_path).state_dict().items() if k != "stream_settings"}
    with _loader(dataset_path, hflip=0.25) as other:
        with pytest.raises(StateMismatchError, match="other stream settings .*fingerprint"):
            other.load_state_dict(state)
    with _loader(dataset_path) as same:
        same.load_state_dict(state)  # an old state of the same stream still resumes


def test_seed_and_dataset_are_checked(dataset_path, tmp_path):
    state = _loader(dataset_path).state_dict()
    with pytest.raises(StateMismatchError, match="seed"):
        _loader(dataset_path, seed=6).load_state_dict(state)
    path = write_dataset(tmp_path / "other", make_images(N_IMAGES, seed=1), np.zeros(N_IMAGES), shard_rows=40)
    with pytest.raises(StateMismatchError, match="another dataset"):
        _loader(path).load_state_dict(state)


def test_settings_that_do_not_change_the_stream_are_free(dataset_path):
    import tbl_kernels

    state = _loader(dataset_path).state_dict()
    before = tbl_kernels.get_num_threads()
    try:
        for change in ({"batch_size": 3}, {"prefetch": 0}, {"dtype": "bfloat16"}, {"layout": "HWC"},
                       {"world_size": 4, "rank": 3}, {"num_threads": 1}, {"mean": (0, 0, 0), "std": (1, 1, 1)}):
            with _loader(dataset_path, **change) as other:
                other.load_state_dict(state)
    finally:
        tbl_kernels.set_num_threads(before)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda s: [], "dict"),
        (lambda s: {**s, "version": 99}, "version"),
        (lambda s: {k: v for k, v in s.items() if k != "epoch"}, "missing"),
        (lambda s: {**s, "consumed": -1}, "consumed"),
        (lambda s: {**s, "consumed": N_IMAGES + 1}, "consumed"),
        (lambda s: {**s, "epoch": 2**70}, "epoch"),
        (lambda s: {**s, "seed": 2**64}, "seed"),
    ],
)
def test_malformed_states_raise(dataset_path, mutate, match):
    loader = _loader(dataset_path)
    with pytest.raises(StateMismatchError, match=match):
        loader.load_state_dict(mutate(loader.state_dict()))
    loader.close()


def test_the_last_epoch_runs_and_saves_a_state_that_reloads_but_runs_no_further(dataset_path):
    from tbl_loader.stream.state import MAX_EPOCH

    loader = _loader(dataset_path)
    loader.load_state_dict({**loader.state_dict(), "epoch": MAX_EPOCH})
    assert len(list(loader)) > 0  # the last epoch runs
    state = loader.state_dict()
    assert (state["epoch"], state["consumed"]) == (MAX_EPOCH + 1, 0)
    again = _loader(dataset_path)
    again.load_state_dict(state)  # what the loader saved always reloads
    with pytest.raises(ValueError, match="past the last epoch"):
        next(iter(again))
    again.close()
    loader.close()
