"""Documents, boundary fields and packing, checked against a plain reference over the flat stream.

The reference below is written for the test: per-token Python loops over the flat tokens, the flat loss
mask and the document start offsets (from the documents' lengths), and a list-based packer.
"""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import pytest

import tbl_format
from tbl_loader import TokenLoader, write_tokens
from tbl_loader.errors import StateMismatchError, TokenError
from tbl_loader.stream import order
from tbl_loader.tokens.loader import window_offset
from tbl_loader.tokens.packing import TAG_PACK_ORDER

T = 16
EOS = 3


def _documents(masked: bool):
    rng = np.random.default_rng(11)
    lengths = np.concatenate([rng.integers(0, 40, 90), [0, 16, 17, 33, 70]])  # + eos: 1 .. 71 tokens
    rng.shuffle(lengths)
    docs = [rng.integers(4, 60_000, n) for n in lengths]
    if masked:
        return [(d, rng.integers(0, 2, d.shape[0])) for d in docs]
    return docs


@pytest.fixture(scope="module", params=["plain", "masked"])
def corpus(request, tmp_path_factory):
    """(path, flat tokens, flat stored mask or None, document starts): shards of 3 rows of 50 tokens."""
    masked = request.param == "masked"
    docs = _documents(masked)
    path = write_tokens(iter(docs), tmp_path_factory.mktemp("docs") / "ds", eos=EOS, chunk=50, shard_tokens=150)
    tokens = [np.append(d[0] if masked else d, EOS) for d in docs]
    flat = np.concatenate(tokens).astype(np.uint16)
    starts = np.concatenate([[0], np.cumsum([len(t) for t in tokens])[:-1]]).tolist()
    mask = np.concatenate([np.append(d[1] != 0, True) for d in docs]) if masked else None
    return path, flat, mask, starts


def _reference(positions, flat, mask, starts):
    """Every field of one row whose slots hold stream ``positions`` (-1: padding), token by token."""
    t = len(positions) - 1
    doc = [bisect_right(starts, p) - 1 if p >= 0 else -1 for p in positions]
    seg = [s == 0 or doc[s] != doc[s - 1] for s in range(t + 1)]
    pos_ids, at = [], 0
    for s in range(t):
        at = 0 if seg[s] else at + 1
        pos_ids.append(at)
    cu = [s for s in range(t) if seg[s]] + [t]
    cu += [t] * (t + 1 - len(cu))
    loss = [not seg[s + 1] and doc[s + 1] >= 0 and (mask is None or bool(mask[positions[s + 1]])) for s in range(t)]
    tokens = [int(flat[p]) if p >= 0 else 0 for p in positions]
    return {"tokens": tokens, "position_ids": pos_ids, "document_ids": doc[:t], "cu_seqlens": cu, "loss_mask": loss}


def _check(batch, positions_of, corpus):
    """Every row of ``batch`` equals the reference of the slots ``positions_of(index)``."""
    _, flat, mask, starts = corpus
    for b, j in enumerate(np.asarray(batch.indices).tolist()):
        want = _reference(positions_of(j), flat, mask, starts)
        for name, value in want.items():
            assert np.array_equal(np.asarray(getattr(batch, name)[b]), value), (name, j)


def _window_slots(seed, epoch):
    o = window_offset(seed, epoch, T)
    return lambda j: list(range(o + j * T, o + j * T + T + 1))


def _collect(loader, limit=None):
    out = []
    for batch in loader:
        out.append(batch)
        if limit is not None and len(out) == limit:
            break
    return out


def _indices(batches):
    return np.concatenate([np.asarray(b.indices) for b in batches]) if batches else np.zeros(0, np.int64)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_windows_carry_their_documents(corpus, prefetch):
    path = corpus[0]
    with TokenLoader(path, 5, T, seed=2, boundaries=True, backend="numpy", prefetch=prefetch) as loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            perm = loader.epoch_order().permutation
            batches = _collect(loader)
            assert np.array_equal(_indices(batches), perm)
            for batch in batches:
                assert batch.position_ids.dtype == np.int64 and batch.cu_seqlens.dtype == np.int32
                assert batch.loss_mask.dtype == np.bool_ and batch.cu_seqlens.shape[1] == T + 1
                _check(batch, _window_slots(2, epoch), corpus)


def test_plain_windows_have_no_fields_and_torch_fields(corpus):
    path = corpus[0]
    with TokenLoader(path, 4, T, seed=2, backend="numpy") as plain:
        batch = next(iter(plain))
        assert batch.position_ids is None and batch.loss_mask is None and batch.cu_seqlens is None
        assert np.array_equal(batch.indices, plain.epoch_order().permutation[:4])
    torch = pytest.importorskip("torch")
    with TokenLoader(path, 4, T, seed=2, boundaries=True, dtype="int64") as loader:
        batch = next(iter(loader))
        assert batch.tokens.dtype == torch.int64 and batch.loss_mask.dtype == torch.bool
        assert batch.cu_seqlens.dtype == torch.int32 and isinstance(batch.indices, torch.Tensor)
        _check(batch, _window_slots(2, 0), corpus)


def _reference_pack(corpus, mode, buffer, seed, shuffle):
    """Rows as lists of slot positions, by a list-based packer (first / best fit, oldest row closed)."""
    _, flat, _, starts = corpus
    width = T + 1
    bounds = starts + [flat.shape[0]]
    docs = list(range(len(starts)))
    if shuffle:
        keys = order.hash_u64(seed, 0, TAG_PACK_ORDER, np.arange(len(starts), dtype=np.uint64))
        docs = np.argsort(keys, kind="stable").tolist()
    pieces = []
    for d in docs:
        length, k = bounds[d + 1] - bounds[d], 0
        while True:
            pieces.append((bounds[d] + k * T, min(width, length - k * T)))
            if k * T + width >= length:
                break
            k += 1
    rows, open_rows = [], []  # open_rows: [room, [(start, n, slot)]], oldest first
    for start, n in pieces:
        if n == width:
            rows.append([(start, n, 0)])
            continue
        fits = [i for i, (room, _) in enumerate(open_rows) if room >= n]
        if fits:
            i = fits[0] if mode == "first_fit" else min(fits, key=lambda i: (open_rows[i][0], i))
        else:
            if len(open_rows) == buffer:
                rows.append(open_rows.pop(0)[1])
            open_rows.append([width, []])
            i = len(open_rows) - 1
        open_rows[i][1].append((start, n, width - open_rows[i][0]))
        open_rows[i][0] -= n
        if open_rows[i][0] == 0:
            rows.append(open_rows.pop(i)[1])
    rows += [r for _, r in open_rows]
    slots = []
    for row in rows:
        positions = [-1] * width
        for start, n, slot in row:
            positions[slot : slot + n] = range(start, start + n)
        slots.append(positions)
    return slots


@pytest.mark.parametrize("mode", ["first_fit", "best_fit"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_packed_rows_equal_the_reference_packer(corpus, mode, shuffle):
    path, flat = corpus[0], corpus[1]
    rows = _reference_pack(corpus, mode, 4, 7, shuffle)
    with TokenLoader(path, 6, T, seed=7, shuffle=shuffle, pack=mode, pack_buffer=4, backend="numpy") as loader:
        assert loader.num_samples == len(rows)
        padding = sum(r.count(-1) for r in rows) / (len(rows) * (T + 1))
        assert loader.padding_fraction == pytest.approx(padding, abs=1e-12)
        batches = _collect(loader)
        assert np.array_equal(np.sort(_indices(batches)), np.arange(len(rows)))
        for batch in batches:
            _check(batch, rows.__getitem__, corpus)
    # Every token of the stream is in some row, and every next-token pair is a target exactly once.
    covered = sorted(p for r in rows for p in r if p >= 0)
    assert set(covered) == set(range(flat.shape[0]))


def test_best_fit_pads_no_more_than_first_fit_here(corpus):
    path = corpus[0]
    fractions = {}
    for mode in ("first_fit", "best_fit"):
        with TokenLoader(path, 4, T, seed=1, pack=mode, pack_buffer=8, backend="numpy") as loader:
            fractions[mode] = loader.padding_fraction
    assert 0 < fractions["best_fit"] <= fractions["first_fit"] < 0.5


def _make(corpus, pack, **kw):
    opts = dict(seed=5, backend="numpy", boundaries=True)
    if pack is not None:
        opts.update(pack=pack, pack_buffer=4)
    return TokenLoader(corpus[0], seq_len=T, **opts, **kw)


def _slots(corpus, pack, epoch):
    return _window_slots(5, epoch) if pack is None else _reference_pack(corpus, pack, 4, 5, True).__getitem__


@pytest.mark.parametrize("pack", [None, "first_fit", "best_fit"])
@pytest.mark.parametrize("stops", [(1,), (3,), (2, 4)])
def test_resume_at_any_step_and_twice(corpus, pack, stops):
    with _make(corpus, pack, batch_size=5, prefetch=0) as straight:
        straight.set_epoch(1)
        want = _indices(_collect(straight))
    seen, state = [], None
    for stop in stops:  # run, save, resume from the saved state (then again from the resumed loader's)
        with _make(corpus, pack, batch_size=5 if state is None else 3) as part:
            if state is None:
                part.set_epoch(1)
            else:
                part.load_state_dict(state)
            got = _collect(part, limit=stop)
            state = part.state_dict()
        seen += got
    with _make(corpus, pack, batch_size=7, prefetch=2) as rest:
        rest.load_state_dict(state)
        seen += _collect(rest)
        assert rest.epoch == 2
    assert np.array_equal(_indices(seen), want)
    for batch in seen:
        _check(batch, _slots(corpus, pack, 1), corpus)


@pytest.mark.parametrize("pack", [None, "best_fit"])
def test_three_ranks_and_elastic_two_to_three(corpus, pack):
    with _make(corpus, pack, batch_size=6) as single:
        want = _indices(_collect(single))
    ranks = []
    for r in range(3):
        with _make(corpus, pack, batch_size=2, rank=r, world_size=3, padding="drop") as part:
            batches = _collect(part)
            ranks.append(_indices(batches))
            for batch in batches:
                _check(batch, _slots(corpus, pack, 0), corpus)
    assert np.array_equal(np.stack(ranks, axis=1).reshape(-1), want[: len(ranks[0]) * 3])
    states, done = [], []
    for r in range(2):
        with _make(corpus, pack, batch_size=4, rank=r, world_size=2, padding="drop") as part:
            done.append(_indices(_collect(part, limit=3)))
            states.append(part.state_dict())
    assert states[0] == states[1]
    after = []
    for r in range(3):
        with _make(corpus, pack, batch_size=5, rank=r, world_size=3, padding="drop") as part:
            part.load_state_dict(states[0])
            batches = _collect(part)
            after.append(_indices(batches))
            for batch in batches:
                _check(batch, _slots(corpus, pack, 0), corpus)
    first = np.stack(done, axis=1).reshape(-1)
    rest = np.stack(after, axis=1).reshape(-1)
    assert np.array_equal(first, want[:24])
    assert np.array_equal(rest, want[24 : 24 + (len(want) - 24) // 3 * 3])


def test_index_is_stored_and_verified(corpus, tmp_path):
    path, flat, _, starts = corpus
    ds = tbl_format.open(path)
    ds.verify()
    got = [r * 50 + s for r in range(len(ds)) for s in ds[r]["starts"]]
    assert got == starts
    ds.close()
    # A file whose index breaks the rules: named at verify.
    schema = tbl_format.Schema({"tokens": tbl_format.Leaf("array", dtype="uint16", shape=(4,)),
                                "length": tbl_format.Leaf("int"), "starts": tbl_format.Leaf("var_list", item="int")})
    meta = {"tokens": {"chunk": 4, "dtype": "uint16", "eos": None, "loss_mask": False}}
    for bad, rule in (([[0, 2], [3, 1]], "increasing"), ([[1], [0]], "first token"), ([[0], [4]], r"in \(-1, 4\)")):
        rows = [{"tokens": np.arange(4, dtype=np.uint16), "length": 4, "starts": s} for s in bad]
        dst = tbl_format.write(iter(rows), tmp_path / f"bad{len(list(tmp_path.iterdir()))}", schema=schema,
                               metadata=meta, shard_rows=1)
        with pytest.raises(tbl_format.DocumentIndexError, match=rule):
            tbl_format.open(dst).verify()
        from tbl_format.cli import main

        assert main(["verify", str(dst)]) == 1


def test_flat_datasets_read_as_one_document_per_shard(tmp_path):
    """A token dataset written before the index (no ``starts`` leaf): each shard is one document."""
    schema = tbl_format.Schema({"tokens": tbl_format.Leaf("array", dtype="uint16", shape=(10,)),
                                "length": tbl_format.Leaf("int")})
    flat = np.arange(100, dtype=np.uint16)
    rows = [{"tokens": flat[i : i + 10], "length": 10} for i in range(0, 100, 10)]
    path = tbl_format.write(iter(rows), tmp_path / "old", schema=schema, shard_rows=4,
                            metadata={"tokens": {"chunk": 10, "dtype": "uint16", "eos": None}})
    with TokenLoader(path, 2, 8, shuffle=False, boundaries=True, backend="numpy") as loader:
        batches = _collect(loader)
    for batch in batches:
        for b, j in enumerate(batch.indices.tolist()):
            want = _reference(list(range(j * 8, j * 8 + 9)), flat, None, [0, 40, 80])
            for name, value in want.items():
                assert np.array_equal(getattr(batch, name)[b], value)


def test_document_errors(tmp_path):
    with pytest.raises(TokenError, match="document 1 is empty"):
        write_tokens([[1], []], tmp_path / "a")
    with pytest.raises(TokenError, match="document 1: every document must be a"):
        write_tokens([([1, 2], [0, 1]), [3]], tmp_path / "b")
    with pytest.raises(TokenError, match="document 0: loss_mask shape"):
        write_tokens([([1, 2], [0, 1, 1])], tmp_path / "c")
    assert not any(tmp_path.iterdir())
    path = write_tokens([[1, 2, 3]] * 10, tmp_path / "ok", chunk=4)
    with pytest.raises(TokenError, match="pack must be one of"):
        TokenLoader(path, 2, 4, pack="next_fit")
    with pytest.raises(TokenError, match="pack_buffer must be an int >= 1"):
        TokenLoader(path, 2, 4, pack="best_fit", pack_buffer=0)
    # Packing changes the samples: a state saved with windows, or another packing, is refused by name.
    with TokenLoader(path, 2, 4, backend="numpy") as windows, TokenLoader(path, 2, 4, pack="best_fit") as packed:
        with pytest.raises(StateMismatchError, match="tokens.pack"):
            packed.load_state_dict(windows.state_dict())
    with TokenLoader(path, 2, 4, pack="first_fit", pack_buffer=2) as a, TokenLoader(path, 2, 4, pack="first_fit") as b:
        with pytest.raises(StateMismatchError, match="tokens.pack_buffer"):
            b.load_state_dict(a.state_dict())
