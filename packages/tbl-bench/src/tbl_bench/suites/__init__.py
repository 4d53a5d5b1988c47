"""Benchmark suites. Each suite defines NAME, TITLE, UNIT, COMPARE_ON and configurations(ctx).

COMPARE_ON names the parameters a result must share with a baseline or floor
result for a ratio between them to be meaningful (e.g. same level, same
augmentation); a baseline that lacks one of those parameters matches any value.

kernels.py, format_open.py, format_read.py, pytree_read.py and pytree_dataloader.py are standalone
scripts owned by the authors of the packages they measure; `external.py` runs
them as subprocesses.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["SUITES", "load_suite"]

# Suite name -> module, in the order a full run executes them.
SUITES = {
    "kernels": "tbl_bench.suites.external:KERNELS",
    "format": "tbl_bench.suites.external:FORMAT",
    "convert": "tbl_bench.suites.convert",
    "images": "tbl_bench.suites.images",
    "pytree": "tbl_bench.suites.pytree",
    "pytree_loader": "tbl_bench.suites.external:PYTREE_LOADER",
    "torch": "tbl_bench.suites.torch_dataloader",
    "resident": "tbl_bench.suites.resident",
    "train": "tbl_bench.suites.train",
}


def load_suite(name: str) -> ModuleType | object:
    """The suite module (or suite object, for "module:attribute" entries) registered as `name`."""
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    module, _, attr = SUITES[name].partition(":")
    mod = importlib.import_module(module)
    return getattr(mod, attr) if attr else mod
