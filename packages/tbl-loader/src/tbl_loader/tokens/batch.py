"""The token batch: the windows (or packed rows) and, when asked for, their document boundary fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TokenBatch"]


@dataclass
class TokenBatch:
    """One batch of ``B`` rows of ``T + 1`` tokens (``x = tokens[:, :-1]``, ``y = tokens[:, 1:]``).

    ``indices``: the window (or packed row) number of every row (int64, host). The boundary fields are
    ``None`` unless the loader was built with ``boundaries=True`` (always present when packing); each is
    ``(B, T)``, aligned with ``x``:

    - ``position_ids`` (int64): position within the row's segment, 0 where a document (or a row, or the
      padding after the last document of a packed row) starts;
    - ``document_ids`` (int64): the stream's document number of each input token, -1 on padding;
    - ``cu_seqlens`` (int32, ``(B, T + 1)``): each row's segment starts then ``T``, padded with ``T``
      (row b's segments: ``cu_seqlens[b, :k + 1]`` with ``k = (cu_seqlens[b] < T).sum()``);
    - ``loss_mask`` (bool): ``y`` is a target of ``x``: same document, not padding, and stored mask 1.

    ``sources``: the source of every row in a :class:`~tbl_loader.Mix` batch (int64, like ``indices``), else None.
    """

    tokens: Any
    indices: Any
    position_ids: Any = None
    document_ids: Any = None
    cu_seqlens: Any = None
    loss_mask: Any = None
    sources: Any = None
