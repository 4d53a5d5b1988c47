"""Token streams for language-model training: ``write_tokens`` stores them, ``TokenLoader`` serves windows, ``TokenDataset``
the same windows by number (map-style)."""

from __future__ import annotations

from .batch import TokenBatch
from .dataset import TokenDataset
from .loader import TOKEN_DTYPES, TokenLoader, window_offset, write_tokens

__all__ = [
    "TOKEN_DTYPES",
    "TokenBatch",
    "TokenDataset",
    "TokenLoader",
    "window_offset",
    "write_tokens",
]
