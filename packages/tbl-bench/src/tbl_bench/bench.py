"""A whole benchmark run: prepare inputs, run every round of every configuration of the chosen suites, save JSON.

Rounds run round-robin within a suite (round 1 of every configuration, then
round 2 of every configuration, ...): on a shared machine a burst of someone
else's load then lands on one round of many configurations instead of on every
round of one, and ratios compare like with like.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tbl_bench.config import Config
from tbl_bench.context import BenchContext
from tbl_bench.results import config_result, finish_document, new_document, save_results
from tbl_bench.runner import call_in, run_round
from tbl_bench.suites import SUITES, load_suite, suite_rounds
from tbl_bench.suites.user_configs import user_configurations

__all__ = ["run_bench"]


def run_bench(
    suites: Sequence[str],
    ctx: BenchContext,
    results_path: str | Path,
    *,
    rounds: int | None = None,
    only: Sequence[str] = (),
    on_config: Callable[[Config, int], None] | None = None,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run `suites` (names from SUITES) and return the results document (also saved at `results_path`).

    `rounds`: rounds of every configuration (default: each suite's own, 1 in a quick run).
    `only`: shell patterns; when given, only configurations whose name matches one of them run.
    `on_config(config, round)` is called before each round, `on_result(result)` after it.
    """
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise KeyError(f"unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    if rounds is not None and rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    options = {"suites": list(suites), "quick": ctx.quick, "peers": ctx.peers, "peer_python": ctx.peer_python,
               "rounds": rounds, "only": list(only), "data_dir": str(ctx.data_dir), "seed": ctx.seed,
               "user_data": ctx.user.to_dict() if ctx.user is not None else None}
    doc = new_document(options, asdict(ctx.sizes))
    if ctx.peers and ctx.peer_python != sys.executable:
        # The peers' versions are those of the peer interpreter, not of this one.
        try:
            doc["machine"]["peer_packages"] = call_in(ctx.peer_python, "tbl_bench.fingerprint:package_versions", {})
        except RuntimeError as e:
            doc["machine"]["peer_packages"] = {"error": str(e)[-500:]}
    for name in suites:
        suite = load_suite(name)
        n_rounds = rounds if rounds is not None else suite_rounds(suite, ctx.quick)
        # The user's own dataset (--data) replaces the generated inputs of the suites that take one.
        all_configs = suite.configurations(ctx) if ctx.user is None else user_configurations(name, ctx)
        configs = [c for c in all_configs
                   if not only or any(fnmatch.fnmatchcase(c.name, pat) for pat in only)]
        names = [c.name for c in configs]
        if len(set(names)) != len(names):
            raise RuntimeError(f"suite {name}: configuration names are not unique: {names}")
        entry = {"title": suite.TITLE, "unit": suite.UNIT, "compare_on": list(suite.COMPARE_ON),
                 "rounds": n_rounds, "ratios": {}, "results": []}
        doc["suites"][name] = entry
        records: dict[str, list[dict[str, Any]]] = {c.name: [] for c in configs}
        for k in range(n_rounds):
            for config in configs:
                if records[config.name] and records[config.name][-1]["status"] == "skipped":
                    continue  # what cannot run here in round 1 cannot in round 2
                if on_config is not None:
                    on_config(config, k)
                records[config.name].append(run_round(config, peer_python=ctx.peer_python))
                entry["results"] = [config_result(c, records[c.name]) for c in configs if records[c.name]]
                save_results(doc, results_path)
                if on_result is not None:
                    on_result(config_result(config, records[config.name]))
        named = getattr(suite, "ratios", None)
        if named is not None:
            entry["ratios"] = named({r["name"]: r for r in entry["results"] if r["status"] == "ok"})
    finish_document(doc, results_path)
    return doc
