"""Token streams: the writer, and (B, T + 1) windows checked against the flat array; resume and sharding."""

from __future__ import annotations

import numpy as np
import pytest

from tbl_loader import TokenLoader, write_tokens
from tbl_loader.errors import StateMismatchError, TokenError
from tbl_loader.tokens.loader import window_offset

T = 16


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    """~10k tokens in documents of random lengths, eos 7, over shards of 3 chunks of 100 tokens."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 50_000, rng.integers(1, 300)) for _ in range(70)]
    flat = np.concatenate([np.append(d, 7) for d in docs]).astype(np.uint16)
    path = write_tokens(iter(docs), tmp_path_factory.mktemp("tok") / "ds", dtype="uint16", eos=7, chunk=100,
                        shard_tokens=300)
    return path, flat


def _windows(loader):
    return np.concatenate([np.array(b.tokens) for b in loader])


def test_every_window_is_the_flat_stream_at_its_offset(stream):
    path, flat = stream
    loader = TokenLoader(path, 8, T, seed=3, backend="numpy", prefetch=2)
    assert loader.num_tokens == flat.shape[0]
    n = (flat.shape[0] - T) // T
    assert loader.num_samples == n
    for epoch in range(3):
        order = loader.epoch_order().permutation
        got = _windows(loader)
        assert got.shape == (n, T + 1) and got.dtype == np.uint16
        o = window_offset(3, epoch, T)
        for k, j in enumerate(order.tolist()):
            start = o + j * T
            assert np.array_equal(got[k], flat[start : start + T + 1])
    loader.close()


@pytest.mark.parametrize("seq_len,dtype", [(T, "int64"), (450, "int32"), (299, None), (300, "int64")])
def test_windows_within_and_across_shards_and_longer_than_a_shard(stream, seq_len, dtype):
    """Shards hold 300 tokens: T=16 windows mostly lie in one shard (gathered per shard), 299 / 300 / 450
    cross one or two boundaries (copied piece by piece), widened to ``dtype`` in the same copy."""
    path, flat = stream
    with TokenLoader(path, 6, seq_len, seed=9, backend="numpy", dtype=dtype) as loader:
        order = loader.epoch_order().permutation
        got = _windows(loader)
    assert got.dtype == np.dtype(dtype or "uint16") and got.shape == (order.shape[0], seq_len + 1)
    o = window_offset(9, 0, seq_len)
    want = np.stack([flat[o + j * seq_len : o + j * seq_len + seq_len + 1] for j in order.tolist()])
    assert np.array_equal(got, want.astype(got.dtype))


def test_offsets_differ_between_epochs_and_shuffle_false_is_in_order(stream):
    path, flat = stream
    assert len({window_offset(3, e, T) for e in range(8)}) > 1
    plain = TokenLoader(path, 5, T, shuffle=False, backend="numpy", dtype="int64")
    got = _windows(plain)
    assert got.dtype == np.int64
    n = got.shape[0]
    assert np.array_equal(got[:, :-1].reshape(-1), flat[: n * T].astype(np.int64))
    assert np.array_equal(got[:, 1:].reshape(-1), flat[1 : n * T + 1].astype(np.int64))
    plain.close()


@pytest.mark.parametrize("stop", [1, 9])
def test_resume_and_ranks(stream, stop):
    path, _ = stream
    straight = _windows(TokenLoader(path, 7, T, seed=1, backend="numpy", prefetch=0))
    first = TokenLoader(path, 7, T, seed=1, backend="numpy")
    it = iter(first)
    head = [np.array(next(it).tokens) for _ in range(stop)]
    state = first.state_dict()
    first.close()
    resumed = TokenLoader(path, 32, T, seed=1, backend="numpy", prefetch=0)
    resumed.load_state_dict(state)
    assert np.array_equal(np.concatenate(head + [_windows(resumed)]), straight)
    ranks = [_windows(TokenLoader(path, 4, T, seed=1, backend="numpy", rank=r, world_size=2, padding="drop"))
             for r in range(2)]
    both = np.empty((2 * len(ranks[0]), T + 1), np.uint16)
    both[0::2], both[1::2] = ranks
    assert np.array_equal(both, straight[: len(both)])
    other = TokenLoader(path, 7, T + 1, seed=1, backend="numpy")
    with pytest.raises(StateMismatchError):
        other.load_state_dict(state)


def test_torch_batches(stream):
    torch = pytest.importorskip("torch")
    path, flat = stream
    loader = TokenLoader(path, 4, T, shuffle=False, dtype="int64")
    batch = next(iter(loader)).tokens
    assert isinstance(batch, torch.Tensor) and batch.dtype == torch.int64
    assert torch.equal(batch[0], torch.from_numpy(flat[: T + 1].astype(np.int64)))
    loader.close()


def test_writer_and_loader_errors(tmp_path, stream):
    with pytest.raises(TokenError, match="document 1: token id 70000 does not fit uint16"):
        write_tokens([[1, 2], [70000]], tmp_path / "a", dtype="uint16")
    with pytest.raises(TokenError, match="document 0: token id -1"):
        write_tokens([[-1]], tmp_path / "b")
    with pytest.raises(TokenError, match="1-D"):
        write_tokens([[[1]]], tmp_path / "c")
    with pytest.raises(TokenError, match="no tokens"):
        write_tokens([], tmp_path / "d")
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists()
    short = write_tokens([np.arange(10)], tmp_path / "e", dtype="uint32", chunk=4)
    with pytest.raises(TokenError, match="no window"):
        TokenLoader(short, 2, 16, backend="numpy")
    assert np.array_equal(_windows(TokenLoader(short, 2, 3, shuffle=False, backend="numpy")),
                          [[0, 1, 2, 3], [3, 4, 5, 6]])
    from conftest import make_images, write_dataset

    images = write_dataset(tmp_path / "im.tbl", make_images(3))
    with pytest.raises(TokenError, match="not a token dataset"):
        TokenLoader(images, 2, 3)


def test_window_subsets(stream):
    path, flat = stream
    n = (flat.shape[0] - T) // T
    held_out = range(n - 50, n)
    val = TokenLoader(path, 8, T, shuffle=False, rows=held_out, backend="numpy")
    got = _windows(val)
    assert got.shape == (50, T + 1)
    for k, j in enumerate(held_out):
        assert np.array_equal(got[k], flat[j * T : j * T + T + 1])
    part = TokenLoader(path, 8, T, seed=2, subsample=0.25, backend="numpy")
    first = part.epoch_order().permutation
    windows = _windows(part)
    chosen = part.cursor.rows[first]
    o = window_offset(2, 0, T)
    assert all(np.array_equal(w, flat[o + j * T : o + j * T + T + 1]) for w, j in zip(windows, chosen, strict=True))
    for x in (val, part):
        x.close()
