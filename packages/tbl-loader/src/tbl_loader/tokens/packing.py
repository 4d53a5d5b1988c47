"""Sequence packing: whole documents placed into rows of ``T + 1`` token slots, once per loader.

A document of ``L`` tokens is cut like the windows are: piece ``k`` holds its tokens
``[k * T, min(k * T + T + 1, L))``, so a document of at most ``T + 1`` tokens is one piece, a longer one
fills rows of ``T + 1`` and consecutive pieces share one token (every next-token pair of the document is
a target exactly once, as with windows). Pieces are taken in document order (a permutation hashed from
``seed`` when shuffling) and placed by ``first_fit`` (the oldest open row with room) or ``best_fit``
(the open row with the least room that fits) among at most ``buffer`` open rows; when a piece fits
none, a new row opens, and when ``buffer`` rows are open the oldest is closed first. A row closes
when full. Rows are numbered in the order they close.

The plan is a pure function of the document index, ``T``, the mode, ``buffer`` and ``seed``: rows are
the loader's samples, so the epoch order, rank split, and exact and elastic resume are the stream
cursor's, as for every loader. Every epoch serves the same rows in another order.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

import numpy as np

from ..errors import TokenError
from ..stream import order

__all__ = ["PACK_MODES", "PackPlan", "TAG_PACK_ORDER", "pack_documents"]

PACK_MODES = ("first_fit", "best_fit")
TAG_PACK_ORDER = 69
"""Stream tag of the document order that packing takes (epoch 0 of ``seed``)."""


@dataclass(frozen=True)
class PackPlan:
    """Pieces sorted by row: row r holds pieces ``row_ptr[r] : row_ptr[r + 1]``, each ``length`` stream tokens
    from ``start`` placed at slot ``slot`` of the row, from document ``document``."""

    row_ptr: np.ndarray  # (rows + 1,) int64
    start: np.ndarray  # (pieces,) int64 stream offset
    length: np.ndarray  # (pieces,) int64
    slot: np.ndarray  # (pieces,) int64 first slot in the row
    document: np.ndarray  # (pieces,) int64
    width: int  # T + 1 slots a row

    @property
    def rows(self) -> int:
        return self.row_ptr.shape[0] - 1

    @property
    def padding_fraction(self) -> float:
        """Slots holding padding, over all slots of all rows."""
        return 1.0 - float(self.length.sum()) / (self.rows * self.width) if self.rows else 0.0


def pack_documents(starts: np.ndarray, count: int, seq_len: int, mode: str, buffer: int, seed: int,
                   shuffle: bool) -> PackPlan:
    """The packing plan of the documents at ``starts`` in a stream of ``count`` tokens (module docstring).

    Args:
        starts: document start offsets (int64, increasing, first 0).
        count: tokens in the stream.
        seq_len: ``T``; rows hold ``T + 1`` slots.
        mode: ``"first_fit"`` or ``"best_fit"``.
        buffer: open rows at most (the look-ahead), >= 1.
        seed: seed of the document order.
        shuffle: take documents in a hashed order (else in stream order).
    """
    if mode not in PACK_MODES:
        raise TokenError(f"pack must be one of {PACK_MODES} or None, got {mode!r}")
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 1:
        raise TokenError(f"pack_buffer must be an int >= 1, got {buffer!r}")
    width = seq_len + 1
    lengths = np.diff(np.append(starts, count))
    docs = np.arange(starts.shape[0], dtype=np.int64)
    if shuffle:  # the document order has its own tag, apart from the epochs' row order
        keys = order.hash_u64(seed, 0, TAG_PACK_ORDER, np.arange(starts.shape[0], dtype=np.uint64))
        docs = np.argsort(keys, kind="stable").astype(np.int64)
    n_pieces = np.maximum(1, -(-(lengths[docs] - 1) // seq_len))
    doc_of = np.repeat(docs, n_pieces)
    k = np.arange(doc_of.shape[0], dtype=np.int64) - np.repeat(np.cumsum(n_pieces) - n_pieces, n_pieces)
    piece_start = starts[doc_of] + k * seq_len
    piece_len = np.minimum(width, lengths[doc_of] - k * seq_len)
    place = _best_fit if mode == "best_fit" else _first_fit
    row, slot = place(piece_len.tolist(), width, buffer)
    by_row = np.argsort(row, kind="stable")
    row_ptr = np.searchsorted(row[by_row], np.arange(int(row.max()) + 2))
    return PackPlan(row_ptr.astype(np.int64), piece_start[by_row], piece_len[by_row], slot[by_row],
                    doc_of[by_row], width)


def _first_fit(lengths: list[int], width: int, buffer: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and slot of each piece: the oldest open row with room, among at most ``buffer`` open rows.

    Open rows sit in ``room[head:tail]`` in opening order (-1 marks a row closed since), so the oldest row
    that fits is one vectorized search of at most a few ``buffer`` entries, not a Python scan.
    """
    row = np.empty(len(lengths), np.int64)
    slot = np.empty(len(lengths), np.int64)
    room = np.full(4 * buffer, -1, np.int64)
    members: dict[int, list[int]] = {}  # position in ``room`` -> pieces of that open row
    head = tail = closed = 0

    def close(at: int) -> None:
        nonlocal closed
        for q in members.pop(at):
            row[q] = closed
        closed += 1
        room[at] = -1

    for p, n in enumerate(lengths):
        if n == width:  # a full piece is a row of its own
            row[p], slot[p] = closed, 0
            closed += 1
            continue
        open_rooms = room[head:tail]
        i = int(np.argmax(open_rooms >= n)) if tail > head else 0
        if tail > head and open_rooms[i] >= n:
            at = head + i
        else:
            if len(members) == buffer:  # close the oldest row
                close(head)
            if tail == room.shape[0]:  # move the open rows to the front, in order
                live = np.flatnonzero(room[:tail] >= 0)
                room[: live.shape[0]] = room[live]
                room[live.shape[0] :] = -1
                members = {k: members[int(old)] for k, old in enumerate(live.tolist())}
                head, tail = 0, live.shape[0]
            at = tail
            tail += 1
            room[at] = width
            members[at] = []
        slot[p] = width - room[at]
        members[at].append(p)
        room[at] -= n
        if room[at] == 0:  # a full row closes at once
            close(at)
        while head < tail and room[head] < 0:
            head += 1
    for at in sorted(members):
        close(at)
    return row, slot


def _best_fit(lengths: list[int], width: int, buffer: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and slot of each piece: the open row with the least room that fits, ties to the oldest."""
    row = np.empty(len(lengths), np.int64)
    slot = np.empty(len(lengths), np.int64)
    by_room: list[tuple[int, int]] = []  # (room, opened) of each open row, sorted
    members: dict[int, list[int]] = {}  # opened -> pieces (dicts keep opening order: oldest first)
    rooms: dict[int, int] = {}
    opened = closed = 0

    def close(key: int) -> None:
        nonlocal closed
        for q in members.pop(key):
            row[q] = closed
        closed += 1
        del rooms[key]

    for p, n in enumerate(lengths):
        if n == width:
            row[p], slot[p] = closed, 0
            closed += 1
            continue
        at = bisect_left(by_room, (n, -1))
        if at < len(by_room):
            have, key = by_room.pop(at)
        else:
            if len(members) == buffer:
                oldest = next(iter(members))
                by_room.remove((rooms[oldest], oldest))
                close(oldest)
            key, have = opened, width
            opened += 1
            members[key], rooms[key] = [], width
        slot[p] = width - have
        members[key].append(p)
        rooms[key] = have - n
        if have == n:
            close(key)
        else:
            insort(by_room, (have - n, key))
    for key in list(members):
        close(key)
    return row, slot
