"""Same-run ratios: a result against the baseline and ceiling results of its suite.

Ratios are only ever taken between results of the same document (the same
run, the same machine), between results that share the suite's comparison
keys (`compare_on`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["matching", "ratios"]


def matching(result: dict[str, Any], others: list[dict[str, Any]], role: str, keys: list[str]) -> dict | None:
    """The ok result of `role` whose params agree with `result` on every key it has among `keys`."""
    for other in others:
        if other is result or other.get("role") != role or other.get("status") != "ok":
            continue
        params = other.get("params") or {}
        mine = result.get("params") or {}
        if all(k not in params or params[k] is None or params[k] == mine.get(k) for k in keys):
            return other
    return None


def ratios(result: dict[str, Any], suite: dict[str, Any]) -> dict[str, Any]:
    """{"baseline": (name, x, tool), "ceiling": (name, x, tool)}: throughput / reference throughput, same run."""
    out: dict[str, Any] = {}
    if result.get("status") != "ok" or not result.get("throughput"):
        return out
    # Subjects are compared with baselines and ceilings, baselines with ceilings; ceilings with nothing.
    refs = {"subject": ("baseline", "ceiling"), "baseline": ("ceiling",)}.get(result.get("role"), ())
    for role in refs:
        ref = matching(result, suite["results"], role, suite.get("compare_on", []))
        if ref is not None and ref.get("throughput"):
            out[role] = (ref["name"], result["throughput"] / ref["throughput"], ref.get("tool"))
    return out
