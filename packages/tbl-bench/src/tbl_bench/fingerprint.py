"""What machine and software a set of figures was measured on.

Numbers are meaningless without the machine: the fingerprint names the CPU,
the cores this process may use, the memory, a memory-copy bandwidth measured in
the same run (the ceiling any loader that copies bytes is held against), and the
version of every package involved.
"""

from __future__ import annotations

import platform
import subprocess
import sys
import time
from importlib import metadata

import psutil

__all__ = [
    "PACKAGES",
    "cpu_model",
    "load_average",
    "machine_fingerprint",
    "memory_copy_bandwidth",
    "package_versions",
    "usable_cores",
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
    "mosaicml-streaming",
    "webdataset",
    "psutil",
)


def cpu_model() -> str:
    """The CPU model name. psutil does not report it: Linux names it in /proc/cpuinfo, macOS in sysctl."""
    if sys.platform.startswith("linux"):
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
    elif sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown"


def usable_cores() -> int:
    """Logical cores this process may run on (its CPU affinity where the platform has one, e.g. a cgroup)."""
    try:
        return len(psutil.Process().cpu_affinity())
    except (AttributeError, psutil.Error, OSError):  # macOS has no affinity
        return psutil.cpu_count(logical=True) or 1


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
        return [round(x, 2) for x in psutil.getloadavg()]
    except (OSError, psutil.Error):
        return None


def machine_fingerprint(*, bandwidth_bytes: int = 256 << 20) -> dict:
    """A JSON-ready description of this machine and its software."""
    return {
        "hostname": platform.node(),
        "cpu_model": cpu_model(),
        "cpu_count": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": usable_cores(),
        "mem_total_kb": psutil.virtual_memory().total >> 10,
        "loadavg_start": load_average(),
        "memcpy_gbps": round(memory_copy_bandwidth(bandwidth_bytes), 3),
        "memcpy_bytes": bandwidth_bytes,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "packages": package_versions(),
    }
