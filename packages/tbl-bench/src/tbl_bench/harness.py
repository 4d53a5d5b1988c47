"""What one benchmark configuration is, and how its workload is measured.

A `Config` names a workload factory (`"module:function"`) and its parameters.
The factory runs in a fresh subprocess (see `runner`), builds a `Workload`,
and `measure()` runs its warm-up epochs, then its timed epochs, while an
`RssSampler` watches memory. The result is a plain JSON-ready dict whose keys
are listed in `RESULT_KEYS`.
"""

from __future__ import annotations

import importlib
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from tbl_bench.rss import RssSampler

__all__ = [
    "RESULT_KEYS",
    "Config",
    "SkipConfig",
    "Workload",
    "failed_result",
    "measure",
    "resolve_target",
    "script_result",
    "skipped_result",
]

STATUS_OK, STATUS_SKIPPED, STATUS_FAILED = "ok", "skipped", "failed"

RESULT_KEYS = (
    "suite",
    "name",
    "kind",
    "tool",
    "role",
    "params",
    "status",
    "reason",
    "items_per_epoch",
    "unit",
    "warmup",
    "epochs_s",
    "setup_s",
    "median_s",
    "min_s",
    "max_s",
    "throughput",
    "rss",
    "info",
)


class SkipConfig(Exception):
    """Raised by a workload factory when the configuration cannot run here (with the reason)."""


@dataclass
class Config:
    """One measured configuration.

    role: "subject" (what is being measured), "baseline" (a same-run reference
    ratios are taken against) or "floor" (the hardware / compute lower bound).
    params are passed to the target as keyword arguments; the suite's
    comparison keys (e.g. level, aug) are read from them too.
    """

    suite: str
    name: str
    tool: str
    target: str
    params: dict[str, Any] = field(default_factory=dict)
    role: str = "subject"
    warmup: int = 1
    epochs: int = 3
    unit: str = "items/s"
    timeout_s: float = 900.0
    # Set when the configuration is known not to run here (its input could not be prepared).
    skip: str | None = None
    # "workload": target is a factory measured by `measure`. "script": target is "module:"
    # naming a standalone script (`python -m module *args`) that prints its own JSON results.
    kind: str = "workload"
    args: list[str] = field(default_factory=list)
    # Imported in the child before the memory baseline, so RSS growth measures the
    # workload's data and not the framework's code (every image loader imports torch).
    preimport: list[str] = field(default_factory=lambda: ["numpy", "torch"])

    def __post_init__(self) -> None:
        if self.role not in ("subject", "baseline", "floor"):
            raise ValueError(f"Config {self.name!r}: role must be subject, baseline or floor, got {self.role!r}")
        if self.warmup < 0 or self.epochs < 1:
            raise ValueError(f"Config {self.name!r}: need warmup >= 0 and epochs >= 1")
        if self.kind not in ("workload", "script"):
            raise ValueError(f"Config {self.name!r}: kind must be workload or script, got {self.kind!r}")
        if ":" not in self.target:
            raise ValueError(f"Config {self.name!r}: target must be 'module:function', got {self.target!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Workload(Protocol):
    """What a factory returns. `run_epoch` returns the number of items it processed."""

    items_per_epoch: int

    def run_epoch(self, epoch: int) -> int: ...

    def close(self) -> None: ...


def resolve_target(target: str):
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


def _base(config: Config) -> dict[str, Any]:
    return {
        "suite": config.suite,
        "name": config.name,
        "kind": config.kind,
        "tool": config.tool,
        "role": config.role,
        "params": config.params,
        "unit": config.unit,
        "warmup": config.warmup,
    }


def _empty(config: Config, status: str, reason: str) -> dict[str, Any]:
    out = dict.fromkeys(RESULT_KEYS)
    out.update(_base(config))
    out.update(status=status, reason=reason, epochs_s=[], info={})
    return out


def skipped_result(config: Config, reason: str) -> dict[str, Any]:
    return _empty(config, STATUS_SKIPPED, reason)


def failed_result(config: Config, reason: str) -> dict[str, Any]:
    return _empty(config, STATUS_FAILED, reason)


def script_result(config: Config, payload: Any) -> dict[str, Any]:
    """Result of a standalone script: its own JSON, kept whole under `info["script"]`."""
    out = _empty(config, STATUS_OK, None)
    out["info"] = {"script": payload}
    return out


def measure(config: Config) -> dict[str, Any]:
    """Build the workload, run warm-up and timed epochs, return the result dict.

    Memory baseline is taken after imports of this harness but before the
    factory runs, so it includes the interpreter and numpy, not the workload.
    """
    factory = resolve_target(config.target)
    sampler = RssSampler()
    sampler.start()
    try:
        t0 = time.perf_counter()
        try:
            workload = factory(**config.params)
        except SkipConfig as e:
            return skipped_result(config, str(e))
        setup_s = time.perf_counter() - t0
        try:
            sampler.sample_now()
            for e in range(config.warmup):
                workload.run_epoch(e)
                sampler.sample_now()
            times = []
            items = None
            for e in range(config.warmup, config.warmup + config.epochs):
                t = time.perf_counter()
                n = workload.run_epoch(e)
                times.append(time.perf_counter() - t)
                sampler.sample_now()  # a short epoch can end between two samples of the thread
                if items is None:
                    items = n
                elif n != items:
                    raise RuntimeError(f"{config.name}: epoch {e} processed {n} items, earlier epochs {items}")
            info = dict(getattr(workload, "info", {}) or {})
        finally:
            workload.close()
    finally:
        sampler.stop()
    if items != workload.items_per_epoch:
        raise RuntimeError(f"{config.name}: processed {items} items per epoch, expected {workload.items_per_epoch}")
    med = statistics.median(times)
    out = _empty(config, STATUS_OK, None)
    out.update(
        items_per_epoch=items,
        epochs_s=times,
        setup_s=setup_s,
        median_s=med,
        min_s=min(times),
        max_s=max(times),
        throughput=items / med if med > 0 else None,
        rss=sampler.result(),
        info=info,
    )
    return out
