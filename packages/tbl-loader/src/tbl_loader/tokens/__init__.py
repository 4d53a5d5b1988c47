"""Token streams for language-model training: ``write_tokens`` stores them, ``TokenLoader`` serves windows."""

from __future__ import annotations

from .batch import TokenBatch
from .loader import TOKEN_DTYPES, TokenLoader, window_offset, write_tokens

__all__ = [
    "TOKEN_DTYPES",
    "TokenBatch",
    "TokenLoader",
    "window_offset",
    "write_tokens",
]
