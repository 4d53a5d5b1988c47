"""How long `tbl_format.open` takes on a 1,000,000-row file (target: under 50 ms).

    python -m tbl_bench.suites.format_open [--quick] [--runs 7] [--keep DIR]

Builds, once, in a temp dir: a native .tbl of 1,000,000 rows of
{int, float, str, (16,) float32} and a TBL v2 file of 1,000,000 RAW_U8 2x2
samples (its index alone is 24 MB; v2 open validates every entry, so it is
O(N) where native open is O(1)). Then, for each file, `--runs` fresh
subprocesses each import numpy and tbl_format (not timed), time one
`open(path)` (the first in the process), then `open + ds[0]` and a few more opens. Before that each process opens a
tiny file of the same kind, so the reader modules tbl_format imports on first
use are not in the figure (reported apart: with PYTHONDONTWRITEBYTECODE set
they are compiled from source in every process). Reported:
the median over processes of the first open, of open + first item, and of the
repeated in-process opens. The files are in the page cache (built just
before); this measures open's own work, not the disk.

Prints a table, then the whole result as JSON on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_MS = 50.0
ROWS = 1_000_000
QUICK_ROWS = 100_000

_CHILD = r"""
import json, sys, time
import numpy  # imported up front as in any training process: its import (~0.1-1 s) is not open's cost
import tbl_format as tf
path, warm, repeats = sys.argv[1], sys.argv[2], int(sys.argv[3])
# tbl_format imports its reader modules on the first open; a tiny file of the same kind pays that first.
t = time.perf_counter(); tf.open(warm).close(); warm_s = time.perf_counter() - t
t = time.perf_counter(); ds = tf.open(path); first = time.perf_counter() - t
n = len(ds); ds.close()
t = time.perf_counter(); ds = tf.open(path); row = ds[0]; with_item = time.perf_counter() - t
ds.close()
again = []
for _ in range(repeats):
    t = time.perf_counter(); ds = tf.open(path); again.append(time.perf_counter() - t); ds.close()
print(json.dumps({"warm_open_s": warm_s, "first_open_s": first, "open_first_item_s": with_item,
                  "repeat_open_s": again, "rows": n}))
"""


def build_native(path: Path, rows: int) -> float:
    """The 1M-row native file, written through the public Writer; returns seconds taken."""
    import numpy as np

    import tbl_format as tf

    schema = tf.Schema({"i": tf.Leaf("int"), "f": tf.Leaf("float"), "s": tf.Leaf("str"),
                        "v": tf.Leaf("array", dtype="float32", shape=(16,))})
    vec = np.arange(16, dtype=np.float32)
    t = time.perf_counter()
    with tf.Writer(path, schema) as w:
        for i in range(rows):
            w.write({"i": i, "f": i * 0.5, "s": f"row-{i}", "v": vec})
    return time.perf_counter() - t


def build_v2(path: Path, rows: int) -> float:
    """A TBL v2 file of RAW_U8 2x2 samples in TurboLoader's layout (SPEC.md section 8), vectorised with numpy."""
    import zlib

    import numpy as np

    t = time.perf_counter()
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
    import struct

    head = bytearray(struct.pack("<4sIQIIQQII16s", b"TBL\x02", 2, rows, data_start, 0, 0, 0, 4, 0, bytes(16)))
    head[44:48] = struct.pack("<I", zlib.crc32(head))
    with open(path, "wb") as f:
        f.write(head)
        f.write(entries.tobytes())
        f.write(payload.tobytes())
    return time.perf_counter() - t


def run_child(path: Path, warm: Path, repeats: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(warm), str(repeats)], capture_output=True, text=True,
                         check=False, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"child failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(path: Path, warm: Path, runs: int, repeats: int) -> dict:
    results = [run_child(path, warm, repeats) for _ in range(runs)]
    warm_ms = [r["warm_open_s"] * 1e3 for r in results]
    first = [r["first_open_s"] * 1e3 for r in results]
    item = [r["open_first_item_s"] * 1e3 for r in results]
    again = [statistics.median(r["repeat_open_s"]) * 1e3 for r in results if r["repeat_open_s"]]
    return {
        "rows": results[0]["rows"],
        "file_bytes": path.stat().st_size,
        "processes": runs,
        "first_open_ms": {"median": statistics.median(first), "min": min(first), "max": max(first)},
        "import_and_tiny_open_ms_median": statistics.median(warm_ms),
        "open_first_item_ms": {"median": statistics.median(item), "min": min(item), "max": max(item)},
        "repeat_open_ms_median": statistics.median(again) if again else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows instead of {ROWS:,}")
    ap.add_argument("--runs", type=int, default=7, help="fresh processes per file (default 7)")
    ap.add_argument("--repeats", type=int, default=5, help="extra opens per process (default 5)")
    ap.add_argument("--keep", type=Path, default=None, help="build (or reuse) the files in this directory")
    args = ap.parse_args(argv)
    rows = QUICK_ROWS if args.quick else ROWS

    with tempfile.TemporaryDirectory(prefix="tbl-format-open-") as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        native, v2 = root / f"native-{rows}.tbl", root / f"v2-{rows}.tbl"
        build = {}
        if not native.exists():
            build["native_s"] = build_native(native, rows)
        if not v2.exists():
            build["v2_s"] = build_v2(v2, rows)
        warm_native, warm_v2 = root / "warm-native.tbl", root / "warm-v2.tbl"
        build_native(warm_native, 1)
        build_v2(warm_v2, 1)
        configs = {"native": measure(native, warm_native, args.runs, args.repeats),
                   "v2": measure(v2, warm_v2, args.runs, args.repeats)}

    result = {
        "suite": "format_open",
        "target_ms": TARGET_MS,
        "rows": rows,
        "build_s": build,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "configs": configs,
        "meets_target": {k: v["first_open_ms"]["median"] < TARGET_MS for k, v in configs.items()},
    }
    print(f"tbl_format.open on {rows:,} rows ({args.runs} fresh processes each; medians, ms; target < {TARGET_MS:g} ms)")
    print(f"{'file':8} {'MB':>8} {'first open':>11} {'open+item':>10} {'re-open':>8} {'lazy imports':>13}  target")
    for name, c in configs.items():
        print(f"{name:8} {c['file_bytes'] / 1e6:8.1f} {c['first_open_ms']['median']:11.2f} "
              f"{c['open_first_item_ms']['median']:10.2f} {c['repeat_open_ms_median']:8.2f} "
              f"{c['import_and_tiny_open_ms_median']:13.2f}  {'met' if result['meets_target'][name] else 'MISSED'}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
