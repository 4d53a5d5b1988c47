"""How long `tbl_format.open` takes on a 1,000,000-row file (target: under 50 ms).

Two files, built once in the data directory: a native .tbl of 1,000,000 rows
of {int, float, str, (16,) float32} and a TurboLoader TBL v2 file of 1,000,000
RAW_U8 2x2 samples (its index alone is 24 MB; v2 open validates every entry,
so it is O(N) where native open is O(1)). Every round is a fresh process (7 in
a full run) that imports numpy and tbl_format and opens a tiny file of the same
kind (not timed: tbl_format imports its reader modules on first use; that time
is recorded as `tiny_open_s` in the result's info), then times:

* ``KIND/first-open``: the first `open(path)` of the file in the process;
* ``KIND/open+item``: `open(path)` and `ds[0]`, after one such open;
* ``KIND/reopen``: 5 more opens after two, the median of them.

Closing a dataset is not timed (it happens before the next epoch). The files
are in the page cache (built or read just before): this measures open's own
work, not the disk.
"""

from __future__ import annotations

import struct
import time
import zlib
from pathlib import Path

import numpy as np

from tbl_bench.config import Config
from tbl_bench.context import BenchContext

NAME = "format_open"
TITLE = "tbl_format.open on 1,000,000 rows (target < 50 ms)"
UNIT = "opens/s"
COMPARE_ON = ()
ROUNDS = 7

TARGET_MS = 50.0
ROWS = 1_000_000
QUICK_ROWS = 100_000
KINDS = ("native", "v2")


def build_native(path: Path, rows: int) -> None:
    """The native file, written through the public Writer."""
    import tbl_format as tf

    schema = tf.Schema({"i": tf.Leaf("int"), "f": tf.Leaf("float"), "s": tf.Leaf("str"),
                        "v": tf.Leaf("array", dtype="float32", shape=(16,))})
    vec = np.arange(16, dtype=np.float32)
    with tf.Writer(path, schema) as w:
        for i in range(rows):
            w.write({"i": i, "f": i * 0.5, "s": f"row-{i}", "v": vec})


def build_v2(path: Path, rows: int) -> None:
    """A TBL v2 file of RAW_U8 2x2 samples in TurboLoader's layout (SPEC.md), vectorised with numpy."""
    h, w = 2, 2
    size = h * w * 3
    data_start = 64 + 24 * rows
    payload = (np.arange(rows * size, dtype=np.uint64) * 2654435761 >> 24).astype(np.uint8).reshape(rows, size)
    # CRC-16/MODBUS of every payload at once: one table step per byte position, across all samples.
    table = np.zeros(256, dtype=np.uint16)
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0xA001 if c & 1 else c >> 1
        table[n] = c
    crc = np.full(rows, 0xFFFF, dtype=np.uint16)
    for k in range(size):
        crc = table[(crc ^ payload[:, k]) & 0xFF] ^ (crc >> 8)
    entries = np.zeros(rows, dtype=[("offset", "<u8"), ("size", "<u4"), ("usize", "<u4"), ("width", "<u2"),
                                    ("height", "<u2"), ("format", "u1"), ("flags", "u1"), ("crc", "<u2")])
    entries["offset"] = data_start + np.arange(rows, dtype=np.uint64) * size
    entries["size"] = entries["usize"] = size
    entries["width"], entries["height"], entries["format"] = w, h, 8
    entries["crc"] = crc
    head = bytearray(struct.pack("<4sIQIIQQII16s", b"TBL\x02", 2, rows, data_start, 0, 0, 0, 4, 0, bytes(16)))
    head[44:48] = struct.pack("<I", zlib.crc32(head))
    with open(path, "wb") as f:
        f.write(head)
        f.write(entries.tobytes())
        f.write(payload.tobytes())


_BUILDERS = {"native": build_native, "v2": build_v2}


class _Open:
    def __init__(self, path: str, tiny: str, item: bool):
        import tbl_format

        self._open, self.path, self.item = tbl_format.open, path, item
        t = time.perf_counter()
        self._open(tiny).close()
        self.info = {"tiny_open_s": time.perf_counter() - t}
        self.items_per_epoch = 1
        self.ds = None

    def prepare_epoch(self, epoch: int) -> None:
        self.close()

    def run_epoch(self, epoch: int) -> int:
        self.ds = self._open(self.path)
        if self.item:
            self.ds[0]
        return 1

    def close(self) -> None:
        if self.ds is not None:
            self.ds.close()
            self.ds = None


def open_file(path: str, tiny: str, item: bool = False):
    """Workload factory: one `tbl_format.open(path)` per epoch (and `ds[0]` with `item`)."""
    return _Open(path, tiny, item)


def configurations(ctx: BenchContext) -> list[Config]:
    rows = QUICK_ROWS if ctx.quick else ROWS
    configs = []
    for kind in KINDS:
        build = _BUILDERS[kind]
        path = ctx.artifact(f"open-{kind}-{rows}.tbl", {"kind": f"open_{kind}", "rows": rows},
                            lambda p, build=build: build(p, rows))
        tiny = ctx.artifact(f"open-{kind}-1.tbl", {"kind": f"open_{kind}", "rows": 1},
                            lambda p, build=build: build(p, 1))
        params = {"path": str(path), "tiny": str(tiny)}
        common = {"unit": UNIT, "rss": False, "preimport": ["numpy", "tbl_format"]}
        configs += [
            Config(NAME, f"{kind}/first-open", "tbl_format", "tbl_bench.suites.format_open:open_file", params,
                   warmup=0, epochs=1, **common),
            Config(NAME, f"{kind}/open+item", "tbl_format", "tbl_bench.suites.format_open:open_file",
                   {**params, "item": True}, warmup=1, epochs=1, **common),
            Config(NAME, f"{kind}/reopen", "tbl_format", "tbl_bench.suites.format_open:open_file", params,
                   warmup=2, epochs=5, **common),
        ]
    return configs
