"""Markdown tables and PNG charts from a results document.

Ratios are only ever taken between results of the same document (the same
run, the same machine): a subject against the baseline and floor results of its
suite that share the suite's comparison keys (`compare_on`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["matching", "ratios", "render_markdown", "write_charts", "write_report"]

_KIB_PER_MIB = 1024


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
    """{"baseline": (name, x, tool), "floor": (name, x, tool)}: throughput / reference throughput, same run."""
    out: dict[str, Any] = {}
    if result.get("status") != "ok" or not result.get("throughput"):
        return out
    # Subjects are compared with baselines and floors, baselines with floors; floors with nothing.
    refs = {"subject": ("baseline", "floor"), "baseline": ("floor",)}.get(result.get("role"), ())
    for role in refs:
        ref = matching(result, suite["results"], role, suite.get("compare_on", []))
        if ref is not None and ref.get("throughput"):
            out[role] = (ref["name"], result["throughput"] / ref["throughput"], ref.get("tool"))
    return out


def _mib(kb: int | None) -> str:
    return "" if kb is None else f"{kb / _KIB_PER_MIB:.0f}"


def _peak_growth(rss: dict[str, int], kind: str) -> str:
    """"peak (+growth)" in MiB; empty where memory was not sampled."""
    if not rss:
        return ""
    return f"{_mib(rss.get(f'peak_{kind}_kb'))} (+{_mib(rss.get(f'growth_{kind}_kb'))})"


def _fmt(x: float | None, digits: int = 0) -> str:
    if x is None:
        return ""
    return f"{x:,.{digits}f}"


def _seconds(x: float | None) -> str:
    """Three significant digits: a kernel batch takes milliseconds, an epoch of PIL decoding a minute."""
    return "" if x is None else f"{x:.3g}"


def _ratio_cell(r: tuple | None) -> str:
    return "" if r is None else f"{r[1]:.2f}x"


def _last_line(reason: str | None) -> str:
    """A failure's reason ends with the exception line; the whole traceback stays in the JSON."""
    lines = [ln.strip() for ln in (reason or "").splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    return f"{lines[0].split(':')[0]}: {lines[-1]}"


def _suite_table(name: str, suite: dict[str, Any]) -> list[str]:
    unit = suite.get("unit") or "items/s"
    lines = [
        f"| configuration | role | {unit} | median s | min s | max s | vs baseline | vs floor "
        "| peak anon MiB (+growth) | peak file MiB (+growth) | tree anon +MiB | setup s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    notes = []
    for r in suite["results"]:
        if r.get("status") != "ok" or r.get("reason"):
            notes.append(f"- `{r['name']}`: {r['status']}: {_last_line(r.get('reason'))}".rstrip())
        if r.get("status") != "ok":
            continue
        rat = ratios(r, suite)
        base = rat.get("baseline")
        floor = rat.get("floor")
        rss = r.get("rss") or {}
        lines.append(
            f"| `{r['name']}`{' (peer)' if r.get('peer') else ''} | {r['role']} | {_fmt(r['throughput'])} "
            f"| {_seconds(r['median_s'])} | {_seconds(r['min_s'])} | {_seconds(r['max_s'])} "
            f"| {_ratio_cell(base) + (f' ({base[0]})' if base else '')} "
            f"| {_ratio_cell(floor) + (f' ({floor[0]})' if floor else '')} "
            f"| {_peak_growth(rss, 'anon')} | {_peak_growth(rss, 'file')} "
            f"| {_mib(rss.get('tree_growth_anon_kb'))} | {_fmt(r.get('setup_s'), 2)} |"
        )
    if len(lines) == 2:
        lines = []
    if notes:
        lines += ["", "Not measured, or not every round:", "", *notes]
    return lines


def _ratio_table(suite: dict[str, Any]) -> list[str]:
    named = suite.get("ratios") or {}
    if not named:
        return []
    return ["", "| ratio (same run) | x |", "|---|---:|", *(f"| {k} | {v:.2f} |" for k, v in named.items())]


def machine_lines(doc: dict[str, Any]) -> list[str]:
    m = doc["machine"]
    mem = m.get("mem_total_kb")
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v is not None)
    absent = ", ".join(k for k, v in m["packages"].items() if v is None)
    return [
        f"- Machine: {m['cpu_model']}, {m['usable_cores']} usable cores of {m['cpu_count']}, "
        f"{(mem or 0) / 2**20:.1f} GiB RAM, {m['platform']} (host `{m['hostname']}`)",
        f"- Load average (1, 5, 15 min) at start {m.get('loadavg_start')}, at end {m.get('loadavg_end')}: "
        "other work on the machine competes for the same cores",
        f"- Memory copy bandwidth, same run (numpy copy of {m['memcpy_bytes'] >> 20} MiB): "
        f"{m['memcpy_gbps']:.1f} GB/s",
        f"- Python {m['python']}; {pk}",
        f"- Not installed: {absent or 'none'}",
        f"- Run: {doc['started']} to {doc.get('finished') or '(interrupted)'}; options {json.dumps(doc['options'])}",
        f"- Sizes: {json.dumps(doc['sizes'])}",
    ]


def render_markdown(doc: dict[str, Any], *, charts: dict[str, str] | None = None, title: str = "TBL benchmarks") -> str:
    """The whole report as markdown. `charts` maps suite name -> image path to embed."""
    lines = [
        f"# {title}",
        "",
        "Generated by `tbl bench` from one results file; every ratio is between two results of that same run.",
        "Regenerate with `tbl bench [--peers] [--peer-python PATH] --docs docs/benchmarks.md` (measures) or",
        "`tbl bench --report-only RESULTS.json --docs docs/benchmarks.md` (from a saved run).",
        "Every configuration runs in its own process per round; *(peer)* marks those run under the peer interpreter.",
        "Levels: *produce* touches one element per batch, *consume* sums every batch. Memory: peak RSS of the",
        "measuring process split into anonymous and file-backed pages, with the growth over its baseline",
        "taken before the workload was built; *tree* adds the worker processes (an upper bound: pages shared",
        "with forked workers are counted once per process).",
        "",
        *machine_lines(doc),
        "",
    ]
    if doc.get("options", {}).get("quick"):
        lines[2:2] = ["**Quick run**: small data and few epochs. It proves the pipeline; do not quote its figures.", ""]
    for name, suite in doc["suites"].items():
        lines += [f"## {suite['title']} (`{name}`)", ""]
        rounds = suite.get("rounds", 1)
        if rounds > 1:
            lines += [f"{rounds} rounds, each a fresh process: the median of the rounds' median epochs; "
                      "min and max over every timed epoch.", ""]
        lines += _suite_table(name, suite) or ["(no results)"]
        lines += _ratio_table(suite)
        lines.append("")
        if charts and name in charts:
            lines += [f"![{suite['title']}]({charts[name]})", ""]
    return "\n".join(lines).rstrip() + "\n"


def write_charts(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """One horizontal bar chart of throughput per suite with measured results; returns suite -> PNG path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    colors = {"baseline": "#999999", "floor": "#4c72b0", "subject": "#dd8452"}
    for name, suite in doc["suites"].items():
        ok = [r for r in suite["results"] if r.get("status") == "ok" and r.get("throughput")]
        if not ok:
            continue
        fig, ax = plt.subplots(figsize=(10, max(2.8, 0.35 * len(ok) + 1.5)))
        labels = [r["name"] for r in ok]
        values = [r["throughput"] for r in ok]
        # min-max spread: the rate of the slowest and of the fastest timed epoch.
        spread = [[v - r["items_per_epoch"] / r["max_s"] for v, r in zip(values, ok, strict=True)],
                  [r["items_per_epoch"] / r["min_s"] - v for v, r in zip(values, ok, strict=True)]]
        bars = ax.barh(range(len(ok)), values, xerr=spread, error_kw={"elinewidth": 0.8, "capsize": 2},
                       color=[colors.get(r["role"], "#dd8452") for r in ok])
        ax.set_yticks(range(len(ok)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(suite.get("unit") or "items/s")
        ax.set_title(f"{suite['title']} - {doc['machine']['cpu_model']}, {doc['machine']['usable_cores']} cores",
                     fontsize=10)
        for bar, r in zip(bars, ok, strict=True):
            rat = ratios(r, suite).get("baseline")
            text = f" {r['throughput']:,.0f}" + (f"  ({rat[1]:.1f}x {rat[2]})" if rat else "")
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=7)
        ax.margins(x=0.3)
        from matplotlib.patches import Patch

        roles = [role for role in ("subject", "baseline", "floor") if any(r["role"] == role for r in ok)]
        ax.legend(handles=[Patch(color=colors[role], label=role) for role in roles], fontsize=7, loc="lower right")
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths[name] = path
    return paths


def write_report(doc: dict[str, Any], out_dir: str | Path, *, docs_path: str | Path | None = None) -> Path:
    """Write report.md and one PNG per suite into `out_dir`; optionally a chart-free copy at `docs_path`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    charts = write_charts(doc, out_dir)
    md = out_dir / "report.md"
    md.write_text(render_markdown(doc, charts={k: v.name for k, v in charts.items()}))
    if docs_path is not None:
        Path(docs_path).parent.mkdir(parents=True, exist_ok=True)
        Path(docs_path).write_text(render_markdown(doc))
    return md
