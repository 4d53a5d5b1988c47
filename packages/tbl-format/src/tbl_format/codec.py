"""Compression codecs of heap blocks (SPEC.md, "Columns"). lz4 and zstandard are optional: files
without compression never need them, and a file that uses one names it when it is missing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import CompressionUnavailableError, CorruptDataError

try:
    import lz4.block as _lz4_block
except ImportError:  # reading or writing an LZ4 column then raises CompressionUnavailableError
    _lz4_block = None

try:
    import zstandard as _zstd
except ImportError:  # reading or writing a zstd column then raises CompressionUnavailableError
    _zstd = None

__all__ = ["CODECS", "ZSTD_DEFAULT_LEVEL", "Compression", "block_compressor", "block_decoder", "check_compression",
           "load_lz4_block", "load_zstd"]

#: The codecs a heap may be compressed with (SPEC.md, "Columns").
CODECS = ("lz4", "zstd")
#: A writer's choice of codec: (codec, level); the level is None for the codec's default (and for lz4).
Compression = tuple[str, int | None]
ZSTD_DEFAULT_LEVEL = 3
# Smallest window a zstd frame declares (ZSTD_WINDOWLOG_MIN = 10).
_ZSTD_MIN_WINDOW = 1 << 10


def load_lz4_block() -> Any:
    """The lz4.block module, or CompressionUnavailableError naming the pip command."""
    if _lz4_block is None:
        raise CompressionUnavailableError("LZ4 compression needs the lz4 package: pip install lz4")
    return _lz4_block


def load_zstd() -> Any:
    """The zstandard module, or CompressionUnavailableError naming the pip command."""
    if _zstd is None:
        raise CompressionUnavailableError(
            "zstd compression needs the zstandard package: pip install 'tbl-format[zstd]'")
    return _zstd


def check_compression(compression: str | None, level: int | None) -> None:
    """ValueError for an unknown codec or a level it does not take; CompressionUnavailableError when the
    codec's package is missing (so a writer fails before it creates anything)."""
    if compression not in (None, *CODECS):
        raise ValueError(f"compression must be None, 'lz4' or 'zstd', got {compression!r}")
    if level is not None:
        if compression != "zstd":
            raise ValueError(f"compression_level applies to compression='zstd' only, not {compression!r}")
        if type(level) is not int:
            raise TypeError(f"compression_level must be an int, got {type(level).__name__}")
    if compression == "lz4":
        load_lz4_block()
    elif compression == "zstd":
        zstd = load_zstd()
        lo, hi = -(1 << 17), zstd.MAX_COMPRESSION_LEVEL  # ZSTD_minCLevel() is -131072
        if level is not None and not lo <= level <= hi:
            raise ValueError(f"compression_level must be in [{lo}, {hi}], got {level}")


def block_compressor(compression: str, level: int | None) -> Callable[[bytes], bytes]:
    """bytes -> one compressed block, in the codec's block format (SPEC.md, "Columns")."""
    if compression == "lz4":
        lz4 = load_lz4_block()
        return lambda raw: lz4.compress(raw, store_size=False)
    if compression == "zstd":
        # One frame per block with its content size and checksum, so a reader can check the size before it
        # allocates anything and a damaged frame fails to decode instead of yielding other bytes.
        cctx = load_zstd().ZstdCompressor(level=ZSTD_DEFAULT_LEVEL if level is None else level,
                                          write_content_size=True, write_checksum=True, write_dict_id=False)
        return cctx.compress
    raise ValueError(f"unknown compression codec {compression!r}")


def block_decoder(codec: str, block: int, where: str) -> Callable[[Any, int, int], bytes]:
    """(stored bytes, block number k, raw length) -> the block's raw bytes, or CorruptDataError naming
    ``where`` and k. The result always has exactly the raw length. The returned function may be called from
    several threads at once."""
    if codec == "lz4":
        lz4 = load_lz4_block()

        def lz4_block(stored: Any, k: int, raw_len: int) -> bytes:
            try:
                data = lz4.decompress(stored, uncompressed_size=raw_len)
            except Exception as exc:  # lz4.block.LZ4BlockError and friends
                raise CorruptDataError(f"{where}: LZ4 block {k} does not decompress: {exc}") from None
            if len(data) != raw_len:
                raise CorruptDataError(f"{where}: LZ4 block {k} has {len(data)} bytes, expected {raw_len}")
            return data

        return lz4_block
    if codec == "zstd":
        return _zstd_decoder(block, where)
    raise ValueError(f"unknown compression codec {codec!r}")


def _zstd_decoder(block: int, where: str) -> Callable[[Any, int, int], bytes]:
    zstd = load_zstd()
    # A frame of at most `block` bytes never needs a larger window (the reference encoder sizes the window to
    # the content). The one-shot decode below writes into a buffer of the raw length whatever the window, so
    # this is SPEC.md's rule, checked, more than a memory bound.
    window = max(_ZSTD_MIN_WINDOW, 1 << (block - 1).bit_length())
    # A ZstdDecompressor is not safe to share between threads; creating one costs a few microseconds.
    new = zstd.ZstdDecompressor
    error = zstd.ZstdError

    def zstd_block(stored: Any, k: int, raw_len: int) -> bytes:
        stored = bytes(stored)
        try:
            params = zstd.get_frame_parameters(stored)
            if params.content_size != raw_len:
                size = "no content size" if params.content_size < 0 or params.content_size >= 1 << 63 \
                    else f"content size {params.content_size}"
                raise CorruptDataError(f"{where}: zstd block {k} declares {size}, expected {raw_len}")
            if params.window_size > window:
                raise CorruptDataError(f"{where}: zstd block {k} declares a window of {params.window_size} bytes, "
                                       f"over {window}")
            if params.dict_id:
                raise CorruptDataError(f"{where}: zstd block {k} needs dictionary {params.dict_id}")
            if not params.has_checksum:
                raise CorruptDataError(f"{where}: zstd block {k} has no content checksum")
            data = new().decompress(stored, max_output_size=raw_len, allow_extra_data=False)
        except error as exc:
            raise CorruptDataError(f"{where}: zstd block {k} does not decompress: {exc}") from None
        if len(data) != raw_len:
            raise CorruptDataError(f"{where}: zstd block {k} has {len(data)} bytes, expected {raw_len}")
        return data

    return zstd_block
