"""One round of one configuration, inside the child interpreter: build, warm up, time.

The round record holds every timed epoch's wall and CPU seconds (CPU: all
threads of the process; beside the wall time it tells compute cost apart from
waiting for a core on a shared machine). Aggregation over rounds is done by
the parent (`tbl_bench.results`).
"""

from __future__ import annotations

import importlib
import time
from typing import Any

from tbl_bench.config import Config, SkipConfig
from tbl_bench.rss import RssSampler

__all__ = ["measure", "resolve_target"]


def resolve_target(target: str):
    """The callable a "module:function" string names."""
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)


class _NoSampler:
    def sample_now(self) -> None:
        pass


def measure(config: Config) -> dict[str, Any]:
    """Build the workload, run its warm-up and timed epochs; return the round record.

    The memory baseline is taken before the factory runs (after the child's
    pre-imports), so it includes the interpreter and numpy, not the workload.
    """
    factory = resolve_target(config.target)
    sampler = RssSampler() if config.rss else None
    if sampler is not None:
        sampler.start()
    probe = sampler or _NoSampler()
    try:
        t0 = time.perf_counter()
        try:
            workload = factory(**config.params)
        except SkipConfig as e:
            return {"status": "skipped", "reason": str(e)}
        setup_s = time.perf_counter() - t0
        prepare = getattr(workload, "prepare_epoch", None)
        try:
            probe.sample_now()
            warmup_s = []
            for e in range(config.warmup):
                if prepare is not None:
                    prepare(e)
                t = time.perf_counter()
                workload.run_epoch(e)
                warmup_s.append(time.perf_counter() - t)
                probe.sample_now()
            wall: list[float] = []
            cpu: list[float] = []
            max_epochs = config.max_epochs or config.epochs
            e = config.warmup
            while len(wall) < config.epochs or (sum(wall) < config.min_time_s and len(wall) < max_epochs):
                if prepare is not None:
                    prepare(e)
                t, c = time.perf_counter(), time.process_time()
                n = workload.run_epoch(e)
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                probe.sample_now()  # a short epoch can end between two samples of the thread
                if n != workload.items_per_epoch:
                    raise RuntimeError(f"{config.name}: epoch {e} processed {n} items, "
                                       f"expected {workload.items_per_epoch}")
                e += 1
            info = dict(getattr(workload, "info", {}) or {})
        finally:
            workload.close()
    finally:
        if sampler is not None:
            sampler.stop()
    return {
        "status": "ok",
        "reason": None,
        "items_per_epoch": workload.items_per_epoch,
        "setup_s": setup_s,
        "warmup_s": warmup_s,
        "epochs_s": wall,
        "cpu_s": cpu,
        "rss": sampler.result() if sampler is not None else None,
        "info": info,
    }
