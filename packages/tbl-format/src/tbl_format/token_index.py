"""The token-dataset convention's document index check (SPEC.md section 9), run by ``Dataset.verify``.

Pure Python (no numpy): ``tbl verify`` runs on a data-prep box with nothing else installed. The work is one
pass over the ``starts`` values, row by row, so it costs far less than the block checksums beside it.
"""

from __future__ import annotations

from typing import Any

from .errors import DocumentIndexError

TOKENS_KEY = "tokens"  # the metadata key that marks a token dataset
STARTS_LEAF = "starts"
LENGTH_LEAF = "length"


def check_document_index(dataset: Any) -> None:
    """Raise :class:`DocumentIndexError` unless every row's document starts are increasing offsets inside the
    row's tokens and the stream's first token starts a document. A token dataset written before the index
    existed (no ``starts`` leaf) and any other dataset pass unchecked.

    Args:
        dataset: an open ``tbl_format.Dataset``.
    """
    info = dataset.metadata.get(TOKENS_KEY)
    if not isinstance(info, dict) or STARTS_LEAF not in dataset.leaf_paths:
        return
    chunk = info.get("chunk")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise DocumentIndexError(f"{dataset.path}: metadata tokens.chunk must be an int >= 1, got {chunk!r}")
    row0 = 0  # global row number of the shard's first row
    for k, rows in enumerate(dataset.segment_rows):
        if not rows:
            continue
        shard = dataset.shard(k)
        every = list(range(rows))
        lengths = shard.values(LENGTH_LEAF, every)
        for i, (starts, length) in enumerate(zip(shard.values(STARTS_LEAF, every), lengths, strict=True)):
            where = f"{dataset.path}: row {row0 + i}"
            if not 0 < length <= chunk:
                raise DocumentIndexError(f"{where}: length {length} is not in [1, {chunk}]")
            if row0 + i == 0 and starts[:1] != [0]:
                raise DocumentIndexError(f"{where}: the stream's first token must start a document")
            last = -1
            for s in starts:
                if not last < s < length:
                    raise DocumentIndexError(f"{where}: document start {s} must be in ({last}, {length})"
                                             " (increasing, inside the row's tokens)")
                last = s
        row0 += rows
