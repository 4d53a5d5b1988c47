"""A whole benchmark run: prepare inputs, run every configuration of the chosen suites, save JSON.

The results document (schema "tbl-bench/1") holds the machine fingerprint, the
options and sizes, and per suite its title, unit, comparison keys and the
result of every configuration. It is rewritten after every configuration, so
an interrupted run keeps what it measured.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tbl_bench.context import BenchContext
from tbl_bench.fingerprint import load_average, machine_fingerprint
from tbl_bench.harness import Config
from tbl_bench.runner import run_config
from tbl_bench.suites import SUITES, load_suite

__all__ = ["SCHEMA", "finish_document", "load_results", "new_document", "run_bench", "save_results"]

SCHEMA = "tbl-bench/1"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def save_results(doc: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    tmp.replace(path)


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a results document, checking its schema tag."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a tbl-bench results file (expected schema {SCHEMA!r})")
    return doc


def new_document(ctx: BenchContext, suites: list[str]) -> dict[str, Any]:
    """An empty results document: machine fingerprint (measured now), options and sizes."""
    return {
        "schema": SCHEMA,
        "started": _now(),
        "finished": None,
        "machine": machine_fingerprint(),
        "options": {"suites": suites, "quick": ctx.quick, "peers": ctx.peers,
                    "data_dir": str(ctx.data_dir), "seed": ctx.seed},
        "sizes": asdict(ctx.sizes),
        "suites": {},
    }


def finish_document(doc: dict[str, Any], path: Path) -> None:
    doc["finished"] = _now()
    doc["machine"]["loadavg_end"] = load_average()
    save_results(doc, path)


def run_bench(
    suites: Sequence[str],
    ctx: BenchContext,
    results_path: Path,
    *,
    only: Sequence[str] = (),
    on_config: Callable[[Config], None] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run `suites` (names from SUITES) and return the results document (also saved at `results_path`).

    `only`: shell patterns; when given, only configurations whose name matches one of them run.
    """
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise KeyError(f"unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    doc = new_document(ctx, list(suites))
    results_path.parent.mkdir(parents=True, exist_ok=True)
    for name in suites:
        suite = load_suite(name)
        entry = {"title": suite.TITLE, "unit": suite.UNIT, "compare_on": list(suite.COMPARE_ON), "results": []}
        doc["suites"][name] = entry
        for config in suite.configurations(ctx):
            if only and not any(fnmatch.fnmatchcase(config.name, pat) for pat in only):
                continue
            if on_config is not None:
                on_config(config)
            result = run_config(config)
            entry["results"].append(result)
            save_results(doc, results_path)
            if on_result is not None:
                on_result(result)
    finish_document(doc, results_path)
    return doc
