"""Compression codecs, imported lazily so that files without compression never need them."""

from __future__ import annotations

from typing import Any

from .errors import CompressionUnavailableError

__all__ = ["load_lz4_block"]


def load_lz4_block() -> Any:
    """The lz4.block module, or CompressionUnavailableError naming the pip command."""
    try:
        import lz4.block
    except ImportError:
        raise CompressionUnavailableError("LZ4 compression needs the lz4 package: pip install lz4") from None
    return lz4.block
