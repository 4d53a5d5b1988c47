"""Token streams: a 1-D token column over shards, served as ``(B, T + 1)`` windows for language-model pretraining.

Storage (written by :func:`write_tokens`). The stream of ``N`` tokens is cut
into rows of ``chunk`` tokens: leaf ``"tokens"``, a fixed-shape array
``(chunk,)`` of an unsigned integer dtype, so each shard's column
``(rows, chunk)`` is, read flat, a zero-copy slice of the stream; leaf
``"length"`` (int) the tokens used in the row (``chunk``, except in the last
row, whose rest is zeros); leaf ``"starts"`` (list of ints) the offsets in the
row of the tokens that start a document (the document index); optional leaf
``"loss_mask"`` (``(chunk,)`` uint8) 1 where a token is a training target.
Metadata::

    {"tokens": {"chunk": chunk, "dtype": "uint16", "eos": id or null, "loss_mask": bool}}

(tbl-format's SPEC.md section 9; a dataset written before the index has no
``starts`` and reads as one document per shard.) Any tokenizer's integer output
can be written (no tokenizer dependency): :func:`write_tokens` takes an iterable
of documents (sequences or arrays of ints, or ``(tokens, loss_mask)`` pairs),
appends ``eos`` after each when given, checks that every id fits the dtype, and
writes shards of ``shard_tokens`` tokens (rounded to whole chunks).

Windows (:class:`TokenLoader`). With ``T = seq_len``, window ``j`` of epoch
``e`` holds tokens ``[o_e + j * T, o_e + j * T + T + 1)``: consecutive windows
overlap by one token, so ``x = w[:, :-1]``, ``y = w[:, 1:]`` cover every
next-token pair once. The offset ``o_e`` is
``hash_u64(seed, e, TAG_TOKEN_OFFSET, 0) % T`` (0 with ``shuffle=False``),
so every epoch cuts the stream at other places; the number of windows is
``W = (N - T) // T`` in every epoch (whatever the offset, each window fits).
Window order, rank split, ``drop_last``, ``state_dict`` / resume (also with
another world size or batch size) and prefetch are those of every loader: a
:class:`~tbl_loader.stream.StreamCursor` over the ``W`` windows, shuffled by the
epoch permutation, and a :class:`~tbl_loader.host.HostPipeline` whose producer thread
copies each window from the mapped shards into the batch buffer (a window
that crosses a shard boundary is copied in two parts).

Documents (``boundaries=True``, :mod:`tbl_loader.tokens.documents`) and packed
rows (``pack=...``, :mod:`tbl_loader.tokens.packing`) are described there.
"""

from __future__ import annotations

import itertools
import os
import sys
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

import tbl_format

from ..errors import TokenError
from ..host.output import HostArray, OutputSpec, allocate_host
from ..host.pipeline import HostLoader, HostPipeline
from ..host.stats import StageStats
from ..source.fetcher import warn_if_shuffle_thrashes
from ..source.storage import is_url, redact
from ..source.verify import verify_mode
from ..stream import order
from ..stream.cursor import StreamCursor, StreamOptions
from ..stream.order import BatchPlan
from ..stream.subset import resolve_rows
from .batch import TokenBatch
from .documents import BOUNDARY_FIELDS, STARTS, boundary_fields, document_starts, slot_documents
from .packing import PackPlan, pack_documents

__all__ = ["TAG_TOKEN_OFFSET", "TOKEN_DTYPES", "TokenLoader", "TokenStream", "open_token_dataset", "window_offset",
           "write_tokens"]

TAG_TOKEN_OFFSET = 68
"""Stream tag of the per-epoch window offset (tags below 64 are :mod:`tbl_loader.stream.order`'s)."""

TOKEN_DTYPES = ("uint8", "uint16", "uint32", "uint64")
_LEAF = "tokens"
_LENGTH = "length"  # tokens used in the row: chunk, except in the last row
_MASK = "loss_mask"  # optional: 1 where a token is a training target


def write_tokens(documents: Iterable[Any], dst: str | os.PathLike[str], *, dtype: str = "uint16",
                 eos: int | None = None, chunk: int = 65536, shard_tokens: int = 1 << 26,
                 overwrite: bool = False, metadata: dict[str, Any] | None = None) -> Any:
    """Write ``documents`` as a token dataset at ``dst``: their concatenation and the document index.

    Args:
        documents: each a 1-D sequence / array of token ids, or (fine-tuning data) a pair
            ``(tokens, loss_mask)`` of equal lengths, the mask nonzero where a token is a training target
            (0 on a prompt). Either every document is a pair or none is.
        dst: the dataset directory (a directory of shards is always written).
        dtype: stored token dtype, one of ``TOKEN_DTYPES``.
        eos: appended after every document (its loss mask 1: the model learns to end a document).
        chunk: tokens per row.
        shard_tokens: tokens per shard file (rounded to whole chunks).
        overwrite: replace an existing dataset at ``dst``.
        metadata: user metadata stored beside the ``tokens`` key.

    Returns ``dst``. Raises :class:`TokenError` naming the document that is empty, not 1-D integers,
    holds an id that does not fit ``dtype``, or (pairs) has a mask of another length.
    """
    if dtype not in TOKEN_DTYPES:
        raise TokenError(f"dtype must be one of {TOKEN_DTYPES}, got {dtype!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise TokenError(f"chunk must be an int >= 1, got {chunk!r}")
    if isinstance(shard_tokens, bool) or not isinstance(shard_tokens, int) or shard_tokens < 1:
        raise TokenError(f"shard_tokens must be an int >= 1, got {shard_tokens!r}")
    dt = np.dtype(dtype)
    top = int(np.iinfo(dt).max)
    if eos is not None and not (isinstance(eos, (int, np.integer)) and 0 <= int(eos) <= top):
        raise TokenError(f"eos must be an int in [0, {top}] for {dtype}, got {eos!r}")
    docs = iter(documents)
    first = next(docs, None)
    masked = first is not None and _is_pair(first)
    leaves = {_LEAF: tbl_format.Leaf("array", dtype=dtype, shape=(chunk,)), _LENGTH: tbl_format.Leaf("int"),
              STARTS: tbl_format.Leaf("var_list", item="int")}
    if masked:
        leaves[_MASK] = tbl_format.Leaf("array", dtype="uint8", shape=(chunk,))
    schema = tbl_format.Schema(leaves)
    info = {"chunk": chunk, "dtype": dtype, "eos": None if eos is None else int(eos), "loss_mask": masked}

    def checked(k: int, doc: Any) -> tuple[np.ndarray, np.ndarray | None]:
        if _is_pair(doc) != masked:
            raise TokenError(f"document {k}: every document must be a (tokens, loss_mask) pair or none;"
                             f" document 0 {'is' if masked else 'is not'} one")
        ids = np.asarray(doc[0] if masked else doc)
        if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
            raise TokenError(f"document {k}: token ids must be a 1-D sequence of ints, got {ids.dtype} {ids.shape}")
        if ids.size == 0 and eos is None:
            raise TokenError(f"document {k} is empty (and no eos is appended): a document needs a token")
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) > top):
            bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
            raise TokenError(f"document {k}: token id {bad} does not fit {dtype} (0..{top})")
        mask = None
        if masked:
            mask = np.asarray(doc[1])
            if mask.shape != ids.shape:
                raise TokenError(f"document {k}: loss_mask shape {mask.shape} differs from the tokens' {ids.shape}")
            mask = (mask != 0).astype(np.uint8)
        if eos is not None:
            ids = np.concatenate([ids.astype(dt, copy=False), np.array([eos], dt)])
            mask = None if mask is None else np.concatenate([mask, np.ones(1, np.uint8)])
        return ids.astype(dt, copy=False), mask

    def rows() -> Any:
        """Rows of ``chunk`` tokens, streamed (memory: one chunk); the last one padded with zeros."""
        pending = np.zeros(chunk, dt)
        pending_mask = np.zeros(chunk, np.uint8)
        starts: list[int] = []  # documents starting in the pending row, at these offsets
        filled, wrote_any = 0, False

        def row(length: int) -> dict[str, Any]:
            out = {_LEAF: pending.copy(), _LENGTH: length, STARTS: list(starts)}
            if masked:
                out[_MASK] = pending_mask.copy()
            return out

        for k, doc in enumerate(itertools.chain([first], docs) if first is not None else ()):
            ids, mask = checked(k, doc)
            starts.append(filled)
            at = 0
            while at < ids.shape[0]:
                take = min(chunk - filled, ids.shape[0] - at)
                pending[filled : filled + take] = ids[at : at + take]
                if mask is not None:
                    pending_mask[filled : filled + take] = mask[at : at + take]
                filled += take
                at += take
                if filled == chunk:
                    yield row(chunk)
                    filled, wrote_any = 0, True
                    starts.clear()
        if filled:
            pending[filled:] = 0
            pending_mask[filled:] = 0
            yield row(filled)
        elif not wrote_any:
            raise TokenError("no tokens to write")  # inside the write: nothing is published

    meta = {**(metadata or {}), "tokens": info}
    return tbl_format.write(rows(), dst, schema=schema, metadata=meta, shard_rows=max(1, shard_tokens // chunk),
                            overwrite=overwrite)


def _is_pair(doc: Any) -> bool:
    """A ``(tokens, loss_mask)`` pair: a 2-tuple of sequences (a tuple of two ints is a document of two tokens)."""
    return isinstance(doc, tuple) and len(doc) == 2 and all(np.ndim(part) == 1 for part in doc)


def window_offset(seed: int, epoch: int, seq_len: int, shuffle: bool = True) -> int:
    """The first window's start in epoch ``epoch`` (see the module docstring)."""
    if not shuffle:
        return 0
    return int(order.hash_u64(seed, epoch, TAG_TOKEN_OFFSET, np.zeros(1, np.uint64))[0] % np.uint64(seq_len))


def open_token_dataset(path: Any, *, cache_dir: Any = None, cache_limit: Any = None,
                       storage_options: dict[str, Any] | None = None, counters: Any = None,
                       manifest: bytes | None = None, verify: bool = False) -> Any:
    """The token dataset at ``path``: every shard kept open once read (windows in random order touch all of
    them every epoch), or, for a URL, streamed through the local shard cache (windows map the shards they read;
    ``manifest``: the bytes another process of the job read, so a copy does not ask the store again).
    ``verify``: every checksum of a shard checked when it is opened (``verify="open"``)."""
    if is_url(path):
        from ..source.remote import open_streaming

        return open_streaming(path, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options,
                              counters=counters, manifest=manifest, verify_data=verify)
    return tbl_format.open(path, max_open=sys.maxsize, verify=verify)


@dataclass(frozen=True)
class TokenStream:
    """What a token dataset serves under one set of window settings, shared by :class:`TokenLoader` and the
    map-style :class:`~tbl_loader.tokens.TokenDataset`: the stream's length, the document index (when the
    boundary fields or packing need it), the packing plan and the number of windows (or packed rows)."""

    chunk: int
    count: int
    seq_len: int
    seed: int
    shuffle: bool
    out_dtype: np.dtype
    boundaries: bool
    starts: np.ndarray | None
    plan: PackPlan | None
    windows: int
    settings: dict[str, Any]

    @classmethod
    def describe(cls, dataset: Any, path: Any, seq_len: int, *, boundaries: bool, pack: str | None,
                 pack_buffer: int, seed: int, shuffle: bool, dtype: str | None) -> TokenStream:
        """Read what the windows need from the open ``dataset``: its last row (the stream's length) and, with
        ``boundaries`` or ``pack``, the document index of every shard (a URL's shards are fetched for it)."""
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise TokenError(f"seq_len must be an int >= 1, got {seq_len!r}")
        info = dataset.metadata.get("tokens")
        if _LEAF not in dataset.leaf_paths or not isinstance(info, dict):
            raise TokenError(f"{path}: not a token dataset (write it with tbl_loader.write_tokens)")
        chunk = int(info["chunk"])
        nonempty = [k for k, rows in enumerate(dataset.segment_rows) if rows]
        # The stream's length from the manifest and the last row: only the last shard is read now.
        last = dataset.shard(nonempty[-1]).column(_LENGTH) if nonempty else np.zeros(1, np.int64)
        if not 0 < int(last[-1]) <= chunk:
            raise TokenError(f"{path}: rows must hold {chunk} tokens each, but for the last")
        count = (sum(dataset.segment_rows) - 1) * chunk + int(last[-1])
        starts = document_starts(dataset, nonempty, chunk) if boundaries or pack is not None else None
        plan, settings = None, {"seq_len": seq_len}
        if pack is not None:
            plan = pack_documents(starts, count, seq_len, pack, pack_buffer, seed, shuffle)
            windows = plan.rows  # the samples are the packed rows
            settings.update(pack=pack, pack_buffer=pack_buffer)
        else:
            windows = (count - seq_len) // seq_len
            if windows < 1:
                raise TokenError(f"{path}: {count} tokens make no window of seq_len={seq_len} (+1)")
        out_dtype = np.dtype(dtype) if dtype is not None else np.dtype(dataset.schema.leaves[_LEAF].dtype)
        if out_dtype.kind not in "iu":
            raise TokenError(f"dtype must be an integer dtype, got {dtype!r}")
        return cls(chunk, count, seq_len, seed, shuffle, out_dtype, bool(boundaries), starts, plan, windows,
                   settings)

    def source(self, dataset: Any, map_all: bool, verify_lazily: bool = False) -> _TokenSource:
        """The batch source filling windows (or packed rows) of ``dataset`` into buffers (``verify_lazily``: the
        data blocks a batch reads are checked first)."""
        return _TokenSource(dataset, self.chunk, self.count, self.seq_len, self.seed, self.shuffle,
                            self.out_dtype, map_all=map_all, starts=self.starts if self.boundaries else None,
                            plan=self.plan, verify_lazily=verify_lazily)


class _TokenSource:
    """Fills ring slots with windows; holds the dataset's shards as flat token columns, never the loader.

    Each window is one slice assignment from its shard into the batch buffer, widened to the
    output dtype by that same copy (no temporary); a window that crosses into the next shard
    is copied in parts. Shard bounds come from the manifest (``rows * chunk`` tokens a shard),
    so no shard is read before a window needs it: a dataset at a URL downloads only the shards
    its windows touch, and no more stay mapped than the dataset keeps open. Shard bounds are
    kept as Python ints and the epoch's offset is hashed once per epoch, so the per-window
    Python work is a few integer operations. With ``starts`` (the document index) the boundary
    fields are computed too, from the windows' stream positions and the stored loss mask.
    """

    def __init__(self, dataset: Any, chunk: int, count: int, seq_len: int, seed: int, shuffle: bool,
                 out_dtype: np.dtype, map_all: bool, starts: np.ndarray | None = None,
                 plan: PackPlan | None = None, verify_lazily: bool = False) -> None:
        self.dataset = dataset
        self.chunk = chunk
        self.shards = [k for k, rows in enumerate(dataset.segment_rows) if rows]  # the shard of each flat
        sizes = np.array([dataset.segment_rows[k] * chunk for k in self.shards], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.ends = np.minimum(self.starts + sizes, count)  # the last row's padding is not the stream's
        self._starts = self.starts.tolist()
        self._ends = self.ends.tolist()
        self._flats: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()  # (leaf, flat) -> flat column
        self._keep = max(1, dataset.max_open)
        # Bounded (a URL's cache holds fewer shards than the stream has): least recently used columns leave.
        # Unbounded (local): every column stays once read, and a window's lookup is one dict get.
        self._bounded = len(self.shards) > self._keep
        self._map_all = map_all and not self._bounded  # local: every column mapped at the first pass
        self._columns: Any = _LazyColumns(self, _LEAF)  # by flat index; a list once every column is mapped
        self.seq_len = seq_len
        self.seed = seed
        self.shuffle = shuffle
        self.out_dtype = out_dtype
        self._offset: tuple[int, int] | None = None  # (epoch, window_offset of that epoch)
        self.documents = starts  # the document index (stream offsets), or None: no boundary fields
        self.masked = _MASK in dataset.leaf_paths
        self.plan = plan  # packed rows instead of windows
        # verify="lazy": the data blocks of the rows a batch's windows span are checked before they are read
        self.verify_rows = dataset.verify_rows if verify_lazily else None

    def begin_pass(self, epoch_order: Any) -> None:
        """A local stream maps every shard's column now, once: a window is then a list index and a slice. A
        URL's stays lazy (only the shards its windows touch are downloaded) and tells the fetcher the shards
        the pass reads, in the order its windows first reach them, so they download ahead of the batches."""
        if self._map_all and not isinstance(self._columns, list):
            self._columns = [self.flat(i) for i in range(len(self.shards))]
        if not self._map_all:
            self.dataset.read_ahead(self.shards_read(epoch_order.epoch, epoch_order.dataset_rows))

    def shards_read(self, epoch: int, samples: np.ndarray) -> list[int]:
        """The shards the windows (or packed rows) ``samples`` of ``epoch`` read, in the order they first reach
        them."""
        first, last = self.spans(epoch, samples)
        flats = np.stack([np.searchsorted(self.starts, first, side="right") - 1,
                          np.searchsorted(self.starts, last, side="right") - 1], axis=1).reshape(-1)
        _, at = np.unique(flats, return_index=True)
        return [self.shards[i] for i in flats[np.sort(at)].tolist()]

    def spans(self, epoch: int, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first and last stream slot each sample (a window, or a packed row's pieces) reads, in order."""
        samples = np.asarray(samples, np.int64)
        if self.plan is None:
            first = self.offset(epoch) + samples * self.seq_len
            return first, first + self.seq_len
        pack = self.plan
        lo, hi = pack.row_ptr[samples], pack.row_ptr[samples + 1]
        counts = hi - lo
        piece = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        return pack.start[piece], pack.start[piece] + np.maximum(pack.length[piece], 1) - 1

    def check_rows(self, epoch: int, samples: np.ndarray) -> None:
        """verify="lazy": the CRC of every data block the samples read, before any of it is copied."""
        first, last = self.spans(epoch, samples)
        rows = [range(a, b + 1) for a, b in zip((first // self.chunk).tolist(), (last // self.chunk).tolist(),
                                                 strict=True)]
        self.verify_rows(sorted({r for span in rows for r in span}))

    def allocate(self, capacity: int, output: OutputSpec) -> dict[str, HostArray]:
        t = self.seq_len
        buffers = {"tokens": allocate_host((capacity, t + 1), self.out_dtype, output)}
        if self.documents is not None or self.plan is not None:
            buffers["position_ids"] = allocate_host((capacity, t), np.dtype(np.int64), output)
            buffers["document_ids"] = allocate_host((capacity, t), np.dtype(np.int64), output)
            buffers["cu_seqlens"] = allocate_host((capacity, t + 1), np.dtype(np.int32), output)
            buffers["loss_mask"] = allocate_host((capacity, t), np.dtype(np.bool_), output)
        return buffers

    def offset(self, epoch: int) -> int:
        if self._offset is None or self._offset[0] != epoch:
            self._offset = (epoch, window_offset(self.seed, epoch, self.seq_len, self.shuffle))
        return self._offset[1]

    def flat(self, i: int, leaf: str = _LEAF) -> np.ndarray:
        """Flat ``i``'s column of ``leaf`` (its shard mapped, fetched first for a URL); row lengths checked then."""
        key = (leaf, i)
        found = self._flats.get(key)
        if found is not None:
            if self._bounded:
                self._flats.move_to_end(key)
            return found
        shard = self.dataset.shard(self.shards[i])
        lengths = shard.column(_LENGTH)
        full = lengths[:-1] if i == len(self.shards) - 1 else lengths
        if np.any(full != self.chunk):  # only the stream's last row may be partial
            raise TokenError(f"{self.dataset.path}: rows must hold {self.chunk} tokens each, but for the last")
        flat = shard.column(leaf).reshape(-1)
        self._flats[key] = flat
        while len(self._flats) > self._keep:  # no more views (and so maps) than the dataset keeps open
            self._flats.popitem(last=False)
        return flat

    def copy(self, columns: Any, out: np.ndarray, begin: np.ndarray, width: int) -> None:
        """Row b of ``out`` = stream slots ``[begin[b], begin[b] + width)`` of ``columns`` (by flat index)."""
        shard = np.searchsorted(self.starts, begin, side="right") - 1
        starts, ends = self._starts, self._ends
        for b, (s, k) in enumerate(zip(begin.tolist(), shard.tolist(), strict=True)):
            if s + width <= ends[k]:
                local = s - starts[k]
                out[b] = columns[k][local : local + width]
            else:  # crosses into the next shard(s)
                at, pos, kk = 0, s, k
                while at < width:
                    take = min(ends[kk] - pos, width - at)
                    out[b, at : at + take] = columns[kk][pos - starts[kk] : pos - starts[kk] + take]
                    at += take
                    pos += take
                    kk += 1

    def copy_span(self, columns: Any, out: np.ndarray, begin: int) -> None:
        """``out`` (1-D) = the stream's ``columns`` from slot ``begin`` on, copied by slices (shards crossed)."""
        starts, ends = self._starts, self._ends
        k = bisect_right(starts, begin) - 1
        at, pos, width = 0, begin, out.shape[0]
        while at < width:
            take = min(ends[k] - pos, width - at)
            out[at : at + take] = columns[k][pos - starts[k] : pos - starts[k] + take]
            at += take
            pos += take
            k += 1

    def fill_packed(self, buffers: dict[str, np.ndarray], rows: np.ndarray) -> None:
        """Rows of the packing plan: every piece's tokens at its slots, padding elsewhere; then the fields.
        One slice copy per piece (a document, or a row-long part of one), never a Python step per token."""
        pack, n, width = self.plan, rows.shape[0], self.seq_len + 1
        lo, hi = pack.row_ptr[rows], pack.row_ptr[rows + 1]
        counts = hi - lo
        piece = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
        tokens = buffers["tokens"][:n]
        tokens[:] = 0  # padding
        doc = np.full((n, width), -1, np.int64)
        mask = np.zeros((n, width), np.uint8) if self.masked else None
        mask_columns = _LazyColumns(self, _MASK)
        columns = self._columns
        for b, start, length, slot, document in zip(np.repeat(np.arange(n), counts).tolist(),
                                                    pack.start[piece].tolist(), pack.length[piece].tolist(),
                                                    pack.slot[piece].tolist(), pack.document[piece].tolist(),
                                                    strict=True):
            self.copy_span(columns, tokens[b, slot : slot + length], start)
            doc[b, slot : slot + length] = document
            if mask is not None:
                self.copy_span(mask_columns, mask[b, slot : slot + length], start)
        boundary_fields(doc, mask, buffers)

    def fill(self, buffers: dict[str, np.ndarray], plan: BatchPlan) -> None:
        if self.verify_rows is not None:
            self.check_rows(plan.epoch, plan.sample_ids)
        if self.plan is not None:
            self.fill_packed(buffers, plan.sample_ids.astype(np.int64))
            return
        width = self.seq_len + 1
        begin = self.offset(plan.epoch) + plan.sample_ids.astype(np.int64) * self.seq_len
        self.copy(self._columns, buffers["tokens"], begin, width)
        if self.documents is None:
            return
        n = begin.shape[0]
        positions = begin[:, None] + np.arange(width, dtype=np.int64)
        mask = None
        if self.masked:
            mask = np.empty((n, width), np.uint8)
            self.copy(_LazyColumns(self, _MASK), mask, begin, width)
        boundary_fields(slot_documents(self.documents, positions), mask, buffers)


class _LazyColumns:
    """A source's columns of one leaf by flat index, each mapped (a URL's fetched) when a window first reads it."""

    def __init__(self, source: _TokenSource, leaf: str) -> None:
        self._flat = source.flat
        self._leaf = leaf

    def __getitem__(self, i: int) -> np.ndarray:
        return self._flat(i, self._leaf)


class TokenLoader(HostLoader):
    """Batches of ``(B, seq_len + 1)`` token windows from a token dataset (see the module docstring).

    ``dtype``: output dtype (default: the stored one; ``"int64"`` / ``"int32"`` convert while
    copying). ``shuffle`` (window order and per-epoch offset), ``seed``, ``drop_last``, ``rank`` /
    ``world_size``, ``padding``, ``prefetch``, ``backend``, ``device``, ``pin_memory``: as in
    ImageLoader. ``boundaries=True``: batches carry the document boundary fields (:class:`TokenBatch`;
    the document index of every shard is read at construction). ``pack="first_fit" | "best_fit"``:
    rows of whole documents instead of windows (:mod:`tbl_loader.tokens.packing`; ``pack_buffer``
    open rows at most; the fields always on; ``padding_fraction``). ``rows`` / ``subsample``: a subset of the window numbers ``0 .. W - 1``
    (:mod:`tbl_loader.stream.subset`; e.g. a held-out range of the stream). Batches are
    :class:`TokenBatch`: ``tokens`` ``(B, T + 1)`` and ``indices`` (window numbers), arrays or tensors. ``path`` may be a URL (``s3://...``; the remote
    extra): the windows read shards through the local shard cache (``cache_dir``, ``cache_limit``,
    ``storage_options``), downloading only the shards they touch, each pass's shards downloaded ahead
    of its batches in the order its windows reach them (``shuffle=True`` over a cache smaller than the
    dataset warns: `CacheThrashWarning`). ``verify`` (``"never"``, ``"open"``, ``"lazy"``): as on every
    loader (:mod:`tbl_loader.source.verify`); ``"lazy"`` checks the data blocks of the rows a batch's
    windows span before copying them.
    """

    def __init__(self, path: Any, batch_size: int, seq_len: int, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, dtype: str | None = None, rank: int | None = None,
                 world_size: int | None = None, padding: str = "wrap", prefetch: int = 2,
                 backend: str | None = None, device: Any = None, pin_memory: bool = False, rows: Any = None,
                 subsample: float | None = None, cache_dir: Any = None, cache_limit: Any = None,
                 storage_options: dict[str, Any] | None = None, boundaries: bool = False,
                 pack: str | None = None, pack_buffer: int = 64, verify: str | bool = "never") -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise TokenError(f"seq_len must be an int >= 1, got {seq_len!r}")
        options = StreamOptions(batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, rank=rank,
                                world_size=world_size, padding=padding)
        output = OutputSpec.create(backend, device, pin_memory)
        verify = verify_mode(verify)
        counters = None  # the shard cache's lookups (a URL's)
        if is_url(path):
            from ..source.cache import CacheCounters

            counters = CacheCounters()
        dataset = open_token_dataset(path, cache_dir=cache_dir, cache_limit=cache_limit,
                                     storage_options=storage_options, counters=counters, verify=verify == "open")
        if is_url(path):
            warn_if_shuffle_thrashes(shuffle, dataset.shard_entries, cache_limit, redact(path))
        try:
            stream = TokenStream.describe(dataset, path, seq_len, boundaries=boundaries, pack=pack,
                                          pack_buffer=pack_buffer, seed=options.seed, shuffle=options.shuffle,
                                          dtype=dtype)
            subset = resolve_rows(stream.windows, rows, subsample)  # a subset of the windows (same in every epoch)
            cursor = StreamCursor(stream.windows if subset is None else subset.shape[0], options,
                                  dataset_fingerprint=dataset.fingerprint,
                                  settings={"tokens": stream.settings}, rows=subset)
            source = stream.source(dataset, map_all=not is_url(path), verify_lazily=verify == "lazy")
            pipeline = HostPipeline(source, output, capacity=options.batch_size, prefetch=prefetch,
                                    closers=[dataset.close], stats=StageStats(prefetch=prefetch, cache=counters))
        except BaseException:
            dataset.close()
            raise
        self._compose(cursor, pipeline)
        self.dataset = dataset
        self.path = path
        self.stream = stream
        self.remote_options = {"cache_dir": cache_dir, "cache_limit": cache_limit,
                               "storage_options": storage_options}
        self.seq_len = seq_len
        self.num_tokens = stream.count
        self.pack_plan = stream.plan

    @property
    def padding_fraction(self) -> float | None:
        """Packing: the fraction of the packed rows' slots that hold padding (None for windows)."""
        return None if self.pack_plan is None else self.pack_plan.padding_fraction

    def _make_batch(self, outputs: dict[str, Any], payload: None, plan: BatchPlan) -> TokenBatch:
        fields = {name: outputs[name] for name in BOUNDARY_FIELDS if name in outputs}
        return TokenBatch(outputs["tokens"], self._indices(plan), **fields)
