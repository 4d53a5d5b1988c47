"""CRC-32 as zlib computes it: the function of every checksum in the format (SPEC.md, "Integrity").

``crc32`` is ISA-L's (python-isal, the ``isal`` extra) when it is installed,
else the standard library's ``zlib.crc32``: the same function, with the same
signature (``crc32(data, value=0)``), releasing the GIL on large buffers. ISA-L's
folds with carry-less multiplication, about three times zlib's speed on x86-64
(9.7 against 3.3 GB/s on the 2-core VM of docs/benchmarks.md), and a
conversion's writer and a full verify spend most of their own CPU time
checksumming.

``crc32_combine(crc1, crc2, length2)`` is the CRC-32 of ``a + b`` from
``crc1 = crc32(a)``, ``crc2 = crc32(b)`` and ``len(b)``: ISA-L's (about 0.5 us),
else computed here from two CRCs over ``length2`` zero bytes (CRC-32 is affine
in its start value: ``crc32(b, c) == crc32(zeros, c) ^ crc32(zeros) ^ crc32(b)``
for ``zeros`` as long as ``b``), which costs as much as checksumming ``b``
twice. It lets whoever writes a row checksum it while it is in cache, and
the writer fold that into its block checksums without reading the row back.
"""

from __future__ import annotations

__all__ = ["IMPLEMENTATION", "crc32", "crc32_combine"]


def _combine_through_zeros(crc1: int, crc2: int, length2: int) -> int:
    """CRC-32 of ``a + b`` from ``crc32(a)``, ``crc32(b)`` and ``len(b)`` (see the module docstring)."""
    zeros = bytes(length2)
    return crc32(zeros, crc1) ^ crc32(zeros) ^ crc2


try:
    from isal import isal_zlib
except ImportError:  # the extra is not installed: the standard library computes the same values
    from zlib import crc32

    IMPLEMENTATION = "zlib"
    crc32_combine = _combine_through_zeros
else:
    crc32 = isal_zlib.crc32
    IMPLEMENTATION = "isal"
    crc32_combine = getattr(isal_zlib, "crc32_combine", _combine_through_zeros)  # not in every isal release
