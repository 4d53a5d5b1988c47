"""A refused state names each stream setting that differs, for every loader built on StreamCursor.

The image loader's settings are covered in test_resume.py; here PyTreeLoader,
TokenLoader and Mix: change one setting, save with one and load into the other,
and the message must name that setting with the saved and the current value.
"""

from __future__ import annotations

import numpy as np
import pytest

import tbl_format
from tbl_loader import Mix, PyTreeDataset, PyTreeLoader, TokenLoader, write_tokens
from tbl_loader.errors import StateMismatchError


@pytest.fixture(scope="module")
def rows_path(tmp_path_factory):
    samples = ({"i": i, "vec": np.full(2, i, np.int32)} for i in range(60))
    return tbl_format.write(samples, tmp_path_factory.mktemp("rows") / "ds", shard_rows=16)


@pytest.fixture(scope="module")
def token_path(tmp_path_factory):
    docs = [np.arange(k * 100, k * 100 + 90) % 60_000 for k in range(30)]
    return write_tokens(iter(docs), tmp_path_factory.mktemp("tok") / "ds", eos=1, chunk=64, shard_tokens=512)


def _refusal(saved, other) -> str:
    state = saved.state_dict()
    with pytest.raises(StateMismatchError, match="stream settings differ") as refused:
        other.load_state_dict(state)
    saved.close()
    other.close()
    return str(refused.value)


@pytest.mark.parametrize(
    "change,named",
    [
        ({"shuffle": False}, "state was saved with shuffle=True, this loader has shuffle=False"),
        ({"drop_last": True}, "state was saved with drop_last=False, this loader has drop_last=True"),
        ({"padding": "drop"}, "state was saved with padding='wrap', this loader has padding='drop'"),
        ({"rows": range(10, 50)}, "state was saved without subset, this loader has subset='"),
        ({"shuffle": "block"}, "state was saved with shuffle=True, this loader has shuffle='block'"),
    ],
)
def test_pytree_loader_names_the_setting(rows_path, change, named):
    message = _refusal(PyTreeLoader(rows_path, 8, seed=2, backend="numpy"),
                       PyTreeLoader(rows_path, 8, seed=2, backend="numpy", **change))
    assert named in message


def test_two_subsets_are_told_apart(rows_path):
    message = _refusal(PyTreeLoader(rows_path, 8, backend="numpy", rows=range(0, 30)),
                       PyTreeLoader(rows_path, 8, backend="numpy", rows=range(30, 60)))
    assert message.startswith("stream settings differ: state was saved with subset='")
    assert message.count(";") == 0  # the subset is the only difference


def test_seed_is_named_with_both_values(rows_path):
    with PyTreeLoader(rows_path, 8, seed=2, backend="numpy") as a, PyTreeLoader(rows_path, 8, seed=3,
                                                                                  backend="numpy") as b:
        with pytest.raises(StateMismatchError, match="state was saved with seed 2, this loader uses seed 3"):
            b.load_state_dict(a.state_dict())


@pytest.mark.parametrize(
    "kwargs,change,named",
    [
        ({}, {"seq_len": 32}, "state was saved with tokens.seq_len=16, this loader has tokens.seq_len=32"),
        ({}, {"shuffle": False}, "state was saved with shuffle=True, this loader has shuffle=False"),
        ({}, {"subsample": 0.5}, "state was saved without subset, this loader has subset='"),
    ],
)
def test_token_loader_names_the_setting(token_path, kwargs, change, named):
    base = {"seq_len": 16, "seed": 4, "backend": "numpy", **kwargs}
    message = _refusal(TokenLoader(token_path, 4, **base), TokenLoader(token_path, 4, **{**base, **change}))
    assert named in message


def test_token_loader_resumes_across_output_dtype_and_batch_size(token_path):
    """dtype and batch size do not change the windows, so they are not settings a state is checked on."""
    with TokenLoader(token_path, 4, 16, seed=4, backend="numpy") as a:
        it = iter(a)
        next(it)
        state = a.state_dict()
        rest = np.concatenate([np.asarray(b.tokens) for b in it]).astype(np.int64)
    with TokenLoader(token_path, 3, 16, seed=4, backend="numpy", dtype="int64") as b:
        b.load_state_dict(state)
        got = np.concatenate([np.asarray(x.tokens) for x in b])
    assert np.array_equal(got, rest)


@pytest.mark.parametrize(
    "change,named",
    [
        ({"weights": (0.5, 0.5)}, "state was saved with mix.weights=[0.75, 0.25], this loader has mix.weights=[0.5, 0.5]"),
        ({"epoch_size": 50}, "state was saved with mix.epoch_size=40, this loader has mix.epoch_size=50"),
        ({"drop_last": True}, "state was saved with drop_last=False, this loader has drop_last=True"),
    ],
)
def test_mix_names_the_setting(rows_path, change, named):
    def mix(**kw):
        return Mix([PyTreeDataset(rows_path), PyTreeDataset(rows_path, rows=range(0, 20))],
                   **{"weights": (0.75, 0.25), "epoch_size": 40, "batch_size": 4, "seed": 1, "prefetch": 0, **kw})

    assert named in _refusal(mix(), mix(**change))
