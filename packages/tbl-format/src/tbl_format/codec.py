"""Compression codecs. lz4 is optional: files without compression never need it."""

from __future__ import annotations

from typing import Any

from .errors import CompressionUnavailableError

try:
    import lz4.block as _lz4_block
except ImportError:  # reading or writing an LZ4 column then raises CompressionUnavailableError
    _lz4_block = None

__all__ = ["load_lz4_block"]


def load_lz4_block() -> Any:
    """The lz4.block module, or CompressionUnavailableError naming the pip command."""
    if _lz4_block is None:
        raise CompressionUnavailableError("LZ4 compression needs the lz4 package: pip install lz4")
    return _lz4_block
