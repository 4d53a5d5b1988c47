"""Benchmarks on the user's own dataset: `tbl bench images --data PATH` (and `pytree_read`, `convert`).

The generated photos say how TBL compares on one machine; a user wants to know
what their data, with their batch size, image size, dtype and thread count,
costs on their machine. `UserData` carries those choices into the suites that
can take a user's dataset (`USER_DATA_SUITES`); each then measures the same
configurations it measures on generated data, against the same-run ceiling
and, where the input allows it, the PIL baseline.

What PATH may be:

- an ImageNet-layout TAR of JPEGs (`nXXXXXXXX/NAME.JPEG`): converted once to
  an `image_size` .tbl in the data directory (not timed), served by TBL, and
  decoded every epoch by the PyTorch DataLoader + PIL baseline;
- a converted image `.tbl` (file or shard directory with an `image` leaf):
  served at its stored size (crop to `image_size`); there are no JPEGs, so the
  PIL baseline is reported as skipped, with that reason;
- for `pytree_read`, any `.tbl`: iterated, read by index and by batches;
- for `convert`, an ImageNet-layout TAR of JPEGs: converted at `image_size`
  by TBL and the peers, against the decode limit on the same images.
"""

from __future__ import annotations

import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DTYPES",
    "USER_DATA_SUITES",
    "UserData",
    "UserDataError",
    "data_kind",
    "summary",
]

USER_DATA_SUITES = ("convert", "images", "pytree_read")
DTYPES = ("float32", "float16", "bfloat16", "uint8")
KINDS = ("image-tar", "image-tbl", "pytree-tbl")


class UserDataError(ValueError):
    """--data names no dataset a suite can measure, or the options that go with it are out of range."""


@dataclass(frozen=True)
class UserData:
    """The user's dataset and the settings they train with. None: the suite's own default."""

    path: str
    batch_size: int | None = None
    image_size: int | None = None
    dtype: str = "float32"
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise UserDataError(f"batch size must be >= 1, got {self.batch_size}")
        if self.image_size is not None and self.image_size < 1:
            raise UserDataError(f"image size must be >= 1, got {self.image_size}")
        if self.threads is not None and self.threads < 1:
            raise UserDataError(f"threads must be >= 1, got {self.threads}")
        if self.dtype not in DTYPES:
            raise UserDataError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not Path(self.path).exists():
            raise UserDataError(f"--data {self.path}: no such file or directory")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def data_kind(path: str | Path) -> str:
    """"image-tar", "image-tbl" or "pytree-tbl"; UserDataError when PATH is none of them."""
    path = Path(path)
    if path.is_file() and tarfile.is_tarfile(path):
        return "image-tar"
    try:
        import tbl_format

        ds = tbl_format.open(path)
    except ImportError as e:
        raise UserDataError(f"--data {path}: reading a .tbl needs tbl-format ({e})") from e
    except Exception as e:  # any of tbl_format's named errors: not a dataset
        raise UserDataError(f"--data {path} is neither a JPEG TAR nor a .tbl dataset: "
                            f"{type(e).__name__}: {e}") from e
    try:
        leaf = ds.schema.leaves.get("image")
    finally:
        ds.close()
    return "image-tbl" if leaf is not None and leaf.kind == "image" else "pytree-tbl"


def _ratio(r: dict[str, Any], suite: dict[str, Any], role: str) -> float | None:
    from tbl_bench.compare import ratios

    found = ratios(r, suite).get(role)
    return None if found is None else round(found[1], 4)


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The short, JSON-ready account of a run that `--json` prints: machine, load, data, one line per configuration."""
    m = doc["machine"]
    out: dict[str, Any] = {
        "schema": doc["schema"],
        "quick": bool(doc["options"].get("quick")),
        "data": doc["options"].get("user_data"),
        "machine": {"cpu_model": m["cpu_model"], "usable_cores": m["usable_cores"], "cpu_count": m["cpu_count"],
                    "physical_cores": m.get("physical_cores"), "memcpy_gbps": m["memcpy_gbps"],
                    "loadavg_start": m.get("loadavg_start"), "loadavg_end": m.get("loadavg_end")},
        "suites": {},
    }
    for name, suite in doc["suites"].items():
        rows = []
        for r in suite["results"]:
            reason = (r.get("reason") or "").strip().splitlines()
            rows.append({
                "name": r["name"], "tool": r["tool"], "role": r["role"], "status": r["status"],
                "reason": reason[-1] if reason else None,
                "unit": r["unit"], "throughput": r.get("throughput"), "median_s": r.get("median_s"),
                "min_s": r.get("min_s"), "max_s": r.get("max_s"),
                "vs_baseline": _ratio(r, suite, "baseline"), "vs_ceiling": _ratio(r, suite, "ceiling"),
                "params": r.get("params"),
            })
        out["suites"][name] = rows
    return out
