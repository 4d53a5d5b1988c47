"""CRC-32 as zlib computes it: the function of every checksum in the format (SPEC.md, "Integrity").

``crc32`` is ISA-L's (python-isal, the ``isal`` extra) when it is installed,
else the standard library's ``zlib.crc32``: the same function, with the same
signature (``crc32(data, value=0)``), releasing the GIL on large buffers. ISA-L's
folds with carry-less multiplication, about three times zlib's speed on x86-64
(9.7 against 3.3 GB/s on the 2-core VM of docs/benchmarks.md), and a
conversion's writer and a full verify spend most of their own CPU time
checksumming.
"""

from __future__ import annotations

__all__ = ["IMPLEMENTATION", "crc32"]

try:
    from isal.isal_zlib import crc32
except ImportError:  # the extra is not installed: the standard library computes the same values
    from zlib import crc32

    IMPLEMENTATION = "zlib"
else:
    IMPLEMENTATION = "isal"
