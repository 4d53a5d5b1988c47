"""Benchmark suites: one module each, all run by the same runner into the same schema.

A suite module defines:

- NAME, TITLE, UNIT (what `throughput` counts), COMPARE_ON: the parameters a
  result must share with a baseline or ceiling result for a ratio between them to
  be meaningful (a reference that lacks one of those parameters matches any value);
- `configurations(ctx) -> list[Config]`;
- optionally ROUNDS: rounds of every configuration in a full run (default 1; a
  quick run does 1; `--rounds` overrides both);
- optionally `ratios(results_by_name) -> dict[str, float]`: named same-run ratios
  beyond the baseline / ceiling columns, computed once the suite has run.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["SUITES", "load_suite", "suite_rounds"]

# Suite name -> module, in the order a full run executes them.
SUITES = {
    "kernels": "tbl_bench.suites.kernels",
    "format_open": "tbl_bench.suites.format_open",
    "format_read": "tbl_bench.suites.format_read",
    "convert": "tbl_bench.suites.convert",
    "images": "tbl_bench.suites.images",
    "variable_images": "tbl_bench.suites.variable_images",
    "pytree": "tbl_bench.suites.pytree",
    "pytree_read": "tbl_bench.suites.pytree_read",
    "pytree_dataloader": "tbl_bench.suites.pytree_dataloader",
    "columnar": "tbl_bench.suites.columnar",
    "torch": "tbl_bench.suites.torch_dataloader",
    "resident": "tbl_bench.suites.resident",
    "train": "tbl_bench.suites.train",
    "tokens": "tbl_bench.suites.tokens",
}


def load_suite(name: str) -> ModuleType:
    """The suite module registered as `name`."""
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    return importlib.import_module(SUITES[name])


def suite_rounds(suite: ModuleType, quick: bool) -> int:
    """Rounds of the suite's configurations when the run does not say."""
    return 1 if quick else getattr(suite, "ROUNDS", 1)
