"""The one results schema ("tbl-bench/2") every suite writes and the report reads.

A document holds the machine fingerprint, the run's options and sizes, and per
suite its title, unit, comparison keys, named ratios and the result of every
configuration. A result (keys in `RESULT_KEYS`) aggregates the configuration's
rounds, each a fresh subprocess:

- `median_s`: the median over rounds of each round's median timed epoch;
- `min_s`, `max_s`: the fastest and slowest timed epoch of all rounds (the spread);
- `throughput`: `items_per_epoch / median_s`, in the suite's unit;
- `cpu_s`: the median over rounds of each round's median CPU seconds per epoch;
- `rss`: each memory figure the largest over the rounds (None where not sampled);
- `rounds`: every round record whole (`epochs_s`, `cpu_s`, `warmup_s`, `setup_s`, `rss`, `loadavg_before`, `loadavg_after`,
  `info`, or the reason it failed).
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from tbl_bench.config import Config
from tbl_bench.fingerprint import load_average, machine_fingerprint

__all__ = [
    "RESULT_KEYS",
    "SCHEMA",
    "config_result",
    "finish_document",
    "load_results",
    "new_document",
    "save_results",
]

SCHEMA = "tbl-bench/2"

RESULT_KEYS = (
    "suite",
    "name",
    "tool",
    "role",
    "peer",
    "params",
    "unit",
    "warmup",
    "status",
    "reason",
    "items_per_epoch",
    "median_s",
    "min_s",
    "max_s",
    "throughput",
    "cpu_s",
    "setup_s",
    "rss",
    "info",
    "rounds",
)


def _max_each(dicts: list[dict[str, int | None]]) -> dict[str, int | None] | None:
    """The largest of each figure over the rounds; None where no round has it (not measured on this platform)."""
    if not dicts:
        return None
    out: dict[str, int | None] = {}
    for k in dicts[0]:
        values = [d[k] for d in dicts if d.get(k) is not None]
        out[k] = max(values) if values else None
    return out


def config_result(config: Config, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The result of `config` from its round records (see the module docstring)."""
    out: dict[str, Any] = dict.fromkeys(RESULT_KEYS)
    out.update(suite=config.suite, name=config.name, tool=config.tool, role=config.role, peer=config.peer,
               params=config.params, unit=config.unit, warmup=config.warmup, info={}, rounds=rounds)
    ok = [r for r in rounds if r["status"] == "ok"]
    bad = [r for r in rounds if r["status"] != "ok"]
    if not ok:
        skipped = [r for r in bad if r["status"] == "skipped"]
        last = (skipped or bad or [{"reason": "no round ran"}])[-1]
        out.update(status="skipped" if skipped else "failed", reason=last["reason"])
        return out
    items = {r["items_per_epoch"] for r in ok}
    if len(items) != 1:
        raise RuntimeError(f"{config.name}: rounds processed different items per epoch: {sorted(items)}")
    epochs = [t for r in ok for t in r["epochs_s"]]
    median_s = statistics.median(statistics.median(r["epochs_s"]) for r in ok)
    out.update(
        status="ok",
        reason=f"{len(bad)} of {len(rounds)} rounds failed: {bad[-1]['reason']}" if bad else None,
        items_per_epoch=items.pop(),
        median_s=median_s,
        min_s=min(epochs),
        max_s=max(epochs),
        cpu_s=statistics.median(statistics.median(r["cpu_s"]) for r in ok),
        setup_s=statistics.median(r["setup_s"] for r in ok),
        rss=_max_each([r["rss"] for r in ok if r.get("rss")]),
        info=ok[-1]["info"],
    )
    out["throughput"] = out["items_per_epoch"] / median_s if median_s > 0 else None
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_document(options: dict[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    """An empty results document: machine fingerprint (measured now), options and sizes."""
    return {"schema": SCHEMA, "started": _now(), "finished": None, "machine": machine_fingerprint(),
            "options": options, "sizes": sizes, "suites": {}}


def save_results(doc: dict[str, Any], path: str | Path) -> None:
    """Write `doc` atomically (a run rewrites it after every round: an interrupted run keeps what it measured)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def finish_document(doc: dict[str, Any], path: str | Path) -> None:
    doc["finished"] = _now()
    doc["machine"]["loadavg_end"] = load_average()
    save_results(doc, path)


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a results document, checking its schema tag."""
    doc = json.loads(Path(path).read_text())
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema != SCHEMA:
        raise ValueError(f"{path} is not a {SCHEMA} results file (schema {schema!r}); "
                         "older runs are history: measure again to report them")
    # Files written before the role was named for what it is: a memory copy or data already in RAM
    # bounds throughput from above (a ceiling), it was called a floor.
    for suite in doc.get("suites", {}).values():
        for r in suite.get("results", []):
            if r.get("role") == "floor":
                r["role"] = "ceiling"
    return doc
