"""What one benchmark configuration is, and the protocol of the workload it measures.

A `Config` names a workload factory (`"module:function"`) and its keyword
parameters. The factory runs in a fresh subprocess (`tbl_bench.child`) and
returns a `Workload`; `tbl_bench.measure` runs its warm-up epochs, then its
timed epochs. An *epoch* is the unit of work a suite times: one pass over a
dataset for the loaders, one batch for the kernels, one `open` for the format.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

__all__ = ["ROLES", "Config", "SkipConfig", "Workload"]

# subject: what is measured; baseline: the same-run reference ratios are taken
# against; ceiling: the hardware or compute bound no subject can beat.
ROLES = ("subject", "baseline", "ceiling")


class SkipConfig(Exception):
    """Raised by a workload factory when the configuration cannot run here (with the reason)."""


@dataclass
class Config:
    """One measured configuration.

    Timing: `warmup` untimed epochs, then at least `epochs` timed ones, and more
    (up to `max_epochs` in all) until the timed epochs cover `min_time_s`: on a
    shared machine a median of a handful of 3 ms epochs is one burst of someone
    else's load. `peer`: the workload is a peer tool, run under the peer
    interpreter (`--peer-python`). `rss`: sample memory while it runs (off where
    the sampling thread would disturb a millisecond-scale figure). `env` is added
    to the child's environment. `skip`: the configuration cannot run here (its
    input could not be prepared), with the reason.
    """

    suite: str
    name: str
    tool: str
    target: str
    params: dict[str, Any] = field(default_factory=dict)
    role: str = "subject"
    warmup: int = 1
    epochs: int = 3
    min_time_s: float = 0.0
    max_epochs: int | None = None
    unit: str = "items/s"
    timeout_s: float = 900.0
    peer: bool = False
    rss: bool = True
    env: dict[str, str] = field(default_factory=dict)
    skip: str | None = None
    # Imported in the child before the memory baseline, so RSS growth measures the
    # workload's data and not the framework's code (every image loader imports torch).
    preimport: list[str] = field(default_factory=lambda: ["numpy", "torch"])

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Config {self.name!r}: role must be one of {ROLES}, got {self.role!r}")
        if self.warmup < 0 or self.epochs < 1:
            raise ValueError(f"Config {self.name!r}: need warmup >= 0 and epochs >= 1")
        if self.max_epochs is not None and self.max_epochs < self.epochs:
            raise ValueError(f"Config {self.name!r}: max_epochs {self.max_epochs} < epochs {self.epochs}")
        if ":" not in self.target:
            raise ValueError(f"Config {self.name!r}: target must be 'module:function', got {self.target!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Workload(Protocol):
    """What a factory returns.

    `run_epoch` (timed) returns the number of items it processed, which must be
    `items_per_epoch` every time. An optional `prepare_epoch(epoch)` runs untimed
    before each epoch (drawing that epoch's indices, releasing the previous
    epoch's objects). An optional `info` dict is recorded with the result.
    """

    items_per_epoch: int

    def run_epoch(self, epoch: int) -> int: ...

    def close(self) -> None: ...
