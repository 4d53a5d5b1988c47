"""Markdown tables and PNG charts from a results document.

Ratios are only ever taken between results of the same document (the same
run, the same machine): a subject against the baseline and ceiling results of its
suite that share the suite's comparison keys (`compare_on`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tbl_bench.charts import round_loads, write_charts
from tbl_bench.compare import matching, ratios

__all__ = ["matching", "ratios", "render_markdown", "write_charts", "write_report"]

_KIB_PER_MIB = 1024


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
        f"| configuration | role | {unit} | median s | min s | max s | vs baseline | vs ceiling "
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
        ceiling = rat.get("ceiling")
        rss = r.get("rss") or {}
        lines.append(
            f"| `{r['name']}`{' (peer)' if r.get('peer') else ''} | {r['role']} | {_fmt(r['throughput'])} "
            f"| {_seconds(r['median_s'])} | {_seconds(r['min_s'])} | {_seconds(r['max_s'])} "
            f"| {_ratio_cell(base) + (f' ({base[0]})' if base else '')} "
            f"| {_ratio_cell(ceiling) + (f' ({ceiling[0]})' if ceiling else '')} "
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
    loads = round_loads(doc)
    physical = f" ({m['physical_cores']} physical)" if m.get("physical_cores") else ""
    return [
        f"- Machine: {m['cpu_model']}, {m['usable_cores']} usable cores of {m['cpu_count']}{physical}, "
        f"{(mem or 0) / 2**20:.1f} GiB RAM, {m['platform']} (host `{m['hostname']}`)",
        f"- Load average (1, 5, 15 min) at start {m.get('loadavg_start')}, at end {m.get('loadavg_end')}: "
        "other work on the machine competes for the same cores"
        + (f"; 1-minute load before / after each round: {min(loads):.2f} to {max(loads):.2f}" if loads else ""),
        f"- Memory copy bandwidth, same run (numpy copy of {m['memcpy_bytes'] >> 20} MiB): "
        f"{m['memcpy_gbps']:.1f} GB/s: a ceiling for any loader that copies bytes, not a floor",
        f"- Python {m['python']}; {pk}",
        f"- Not installed: {absent or 'none'}",
        *([f"- Peer interpreter ({doc['options'].get('peer_python')}): "
           + ", ".join(f"{k} {v}" for k, v in m["peer_packages"].items() if v is not None)]
          if m.get("peer_packages") else []),
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
