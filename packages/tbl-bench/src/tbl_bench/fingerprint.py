"""What machine and software a set of figures was measured on.

Numbers are meaningless without the machine: the fingerprint names the CPU,
the cores this process may use, the memory, a memory-copy bandwidth measured in
the same run (the ceiling any loader that copies bytes is held against), and the
version of every package involved.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from importlib import metadata

__all__ = [
    "PACKAGES",
    "cpu_model",
    "load_average",
    "machine_fingerprint",
    "memory_copy_bandwidth",
    "package_versions",
]

# Every distribution whose version can change a figure in this report.
PACKAGES = (
    "tbl-format",
    "tbl-kernels",
    "tbl-loader",
    "tbl-resident",
    "tbl-bench",
    "numpy",
    "torch",
    "pillow",
    "turboloader",
    "litdata",
    "ffcv",
    "matplotlib",
    "scikit-image",
    "scikit-learn",
)


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo, or platform.processor() elsewhere."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_kb() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution; None when it is not installed."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def memory_copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """Best-of-`repeats` single-thread copy bandwidth in GB/s (bytes copied / second).

    A buffer far larger than the caches is copied with numpy; the first copy
    also faults the destination pages in and is discarded.
    """
    import numpy as np

    if nbytes <= 0 or repeats < 1:
        raise ValueError(f"need nbytes > 0 and repeats >= 1, got {nbytes}, {repeats}")
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: other work on the machine shows up here."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_fingerprint(*, bandwidth_bytes: int = 256 << 20) -> dict:
    """A JSON-ready description of this machine and its software."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "usable_cores": cores,
        "mem_total_kb": _mem_total_kb(),
        "loadavg_start": load_average(),
        "memcpy_gbps": round(memory_copy_bandwidth(bandwidth_bytes), 3),
        "memcpy_bytes": bandwidth_bytes,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "packages": package_versions(),
    }
