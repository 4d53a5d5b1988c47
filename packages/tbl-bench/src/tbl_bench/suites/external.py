"""Suites whose measurements are standalone scripts written with the package they measure.

`python -m tbl_bench.suites.kernels` (tbl-kernels), `format_open` and
`format_read` (tbl-format), `pytree_read` and `pytree_dataloader` (tbl-loader) time their own
operations, each configuration in its own subprocess, and print their results
as JSON on the last line. They run here as one subprocess per script; the JSON
is kept whole in the result and tabulated by the report. With --peers, the
scripts that compare against TurboLoader or litdata get this interpreter as
their peer interpreter (the `[peers]` extra installs both into it).
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field

from tbl_bench.context import BenchContext
from tbl_bench.harness import Config

__all__ = ["FORMAT", "KERNELS", "PYTREE_LOADER", "Script", "ScriptSuite"]


@dataclass(frozen=True)
class Script:
    module: str  # under tbl_bench.suites
    quick_args: tuple[str, ...] = ("--quick",)
    full_args: tuple[str, ...] = ()  # arguments of a full (not --quick) run
    peer_flag: str | None = None  # the option naming the interpreter that has the peer tools


@dataclass(frozen=True)
class ScriptSuite:
    NAME: str
    TITLE: str
    scripts: tuple[Script, ...]
    UNIT: str = ""
    COMPARE_ON: tuple[str, ...] = field(default=())

    def configurations(self, ctx: BenchContext) -> list[Config]:
        configs = []
        for script in self.scripts:
            module = f"tbl_bench.suites.{script.module}"
            skip = None if importlib.util.find_spec(module) is not None else f"{module} does not exist"
            args = list(script.quick_args if ctx.quick else script.full_args)
            if ctx.peers and script.peer_flag:
                args += [script.peer_flag, sys.executable]
            configs.append(Config(self.NAME, script.module, self.NAME, f"{module}:", {}, kind="script",
                                  args=args, skip=skip, timeout_s=3600))
        return configs


KERNELS = ScriptSuite("kernels", "C++ kernels", (Script("kernels", full_args=("--rounds", "3"), peer_flag="--peer-python"),))
FORMAT = ScriptSuite("format", "Format open and pytree reads", (
    Script("format_open"),
    Script("format_read", peer_flag="--litdata-python"),
))
PYTREE_LOADER = ScriptSuite("pytree_loader", "PyTreeDataset: reads, batches, torch DataLoader", (
    Script("pytree_read", quick_args=("--rows", "20000", "--epochs", "2"), peer_flag="--peer-python"),
    Script("pytree_dataloader", quick_args=("--rows", "100000", "--epochs", "2"), peer_flag="--peer-python"),
))
