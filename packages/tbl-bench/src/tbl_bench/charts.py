"""PNG charts of a results document, each carrying what its numbers need to be read.

Every chart shows, on the image itself:

- the median throughput of each configuration as a bar, and the min-max spread
  over every timed epoch of every round as an error bar;
- the machine (CPU model, usable / logical / physical cores) and its load
  (1, 5, 15 minute load average at the start and at the end of the run, and
  the highest 1-minute load seen before or after any round), so a figure
  measured on a busy machine says so;
- "quick run: do not quote" across the plot when the run was a quick one;
- roles by colour: a *ceiling* (a memory copy of the same bytes, data already
  in RAM) is the most any loader can reach on this machine in this run, so
  subjects are read as a fraction of it.

The demo chart adds the one-time conversion cost and the epoch from which
converting once and serving beats the baseline (`break_even_epoch`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tbl_bench.compare import ratios

__all__ = [
    "QUICK_STAMP",
    "break_even_epoch",
    "decorate_figure",
    "error_bar_spans",
    "machine_caption",
    "round_loads",
    "write_charts",
    "write_demo_chart",
]

QUICK_STAMP = "quick run: do not quote"

ROLE_COLORS = {"subject": "#dd8452", "baseline": "#999999", "ceiling": "#4c72b0"}
ROLE_LABELS = {
    "subject": "subject",
    "baseline": "baseline (what users run today)",
    "ceiling": "ceiling (same-run upper bound, e.g. memory copy)",
}
SPREAD_LABEL = "error bar: min-max over every timed epoch"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def round_loads(doc: dict[str, Any]) -> list[float]:
    """The 1-minute load averages recorded before and after every round of the run."""
    out = []
    for suite in doc.get("suites", {}).values():
        for r in suite.get("results", []):
            for rec in r.get("rounds") or []:
                for key in ("loadavg_before", "loadavg_after"):
                    if rec.get(key):
                        out.append(rec[key][0])
    return out


def _fmt_load(load: list[float] | None) -> str:
    return "n/a" if not load else " / ".join(f"{x:.2f}" for x in load)


def machine_caption(doc: dict[str, Any]) -> str:
    """Two lines naming the machine and how loaded it was while this document was measured."""
    m = doc["machine"]
    physical = m.get("physical_cores")
    cores = f"{m['usable_cores']} usable of {m['cpu_count']} logical cores"
    if physical:
        cores += f" ({physical} physical)"
    line1 = f"{m['cpu_model']}, {cores}; memory copy {m['memcpy_gbps']:.1f} GB/s (same run)"
    loads = round_loads(doc)
    line2 = (f"load average 1/5/15 min: start {_fmt_load(m.get('loadavg_start'))}, "
             f"end {_fmt_load(m.get('loadavg_end'))}")
    if loads:
        line2 += f"; 1-min load around rounds {min(loads):.2f} to {max(loads):.2f}"
    return f"{line1}\n{line2}; run {doc.get('started', '?')}"


def _is_quick(doc: dict[str, Any]) -> bool:
    return bool((doc.get("options") or {}).get("quick"))


def decorate_figure(fig, doc: dict[str, Any], *, bottom: float) -> None:
    """Machine and load at the foot of the figure; the quick-run stamp across it."""
    fig.text(0.01, 0.01, machine_caption(doc), fontsize=7.5, va="bottom", ha="left", color="#333333")
    if _is_quick(doc):
        fig.text(0.5, 0.5 + bottom / 2, QUICK_STAMP.upper(), fontsize=30, color="#cc0000", alpha=0.22,
                 ha="center", va="center", rotation=18, weight="bold", zorder=100)
        fig.text(0.99, 0.995, QUICK_STAMP, fontsize=10, color="#cc0000", ha="right", va="top", weight="bold")


def error_bar_spans(ok: list[dict[str, Any]]) -> list[list[float]]:
    """[below, above] the median rate: the rate of the slowest and of the fastest timed epoch."""
    below = [r["throughput"] - r["items_per_epoch"] / r["max_s"] for r in ok]
    above = [r["items_per_epoch"] / r["min_s"] - r["throughput"] for r in ok]
    return [below, above]


def _bar_text(r: dict[str, Any], suite: dict[str, Any]) -> str:
    rat = ratios(r, suite)
    parts = [f" {r['throughput']:,.0f}"]
    if "baseline" in rat:
        parts.append(f"{rat['baseline'][1]:.1f}x {rat['baseline'][2]}")
    if "ceiling" in rat:
        parts.append(f"{rat['ceiling'][1]:.0%} of {rat['ceiling'][0]}")  # named: a suite may have several
    return parts[0] + (f"  ({', '.join(parts[1:])})" if len(parts) > 1 else "")


def _bars(ax, ok: list[dict[str, Any]], suite: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    values = [r["throughput"] for r in ok]
    bars = ax.barh(range(len(ok)), values, xerr=error_bar_spans(ok),
                   error_kw={"elinewidth": 1.0, "capsize": 3, "ecolor": "#222222"},
                   color=[ROLE_COLORS.get(r["role"], ROLE_COLORS["subject"]) for r in ok])
    for bar, r in zip(bars, ok, strict=True):
        if r.get("peer"):
            bar.set_hatch("///")
            bar.set_edgecolor("white")
    ax.set_yticks(range(len(ok)), [r["name"] + (" (peer)" if r.get("peer") else "") for r in ok], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(suite.get("unit") or "items/s")
    for bar, r, up in zip(bars, ok, error_bar_spans(ok)[1], strict=True):
        ax.text(bar.get_width() + up, bar.get_y() + bar.get_height() / 2, _bar_text(r, suite), va="center",
                fontsize=7)
    ax.set_xlim(0, max(v + u for v, u in zip(values, error_bar_spans(ok)[1], strict=True)) * 1.45)
    roles = [role for role in ROLE_COLORS if any(r["role"] == role for r in ok)]
    handles = [Patch(color=ROLE_COLORS[role], label=ROLE_LABELS[role]) for role in roles]
    if any(r.get("peer") for r in ok):
        handles.append(Patch(facecolor=ROLE_COLORS["subject"], edgecolor="white", hatch="///",
                             label="peer: another tool, run under the peer interpreter"))
    handles.append(Line2D([], [], color="#222222", marker="|", markersize=8, linestyle="-", label=SPREAD_LABEL))
    # Beside the axes, not on them: inside, it covered the value labels of the longest bars.
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), framealpha=0.9)


def _suite_title(suite: dict[str, Any]) -> str:
    rounds = suite.get("rounds", 1)
    how = f"median of {rounds} rounds' median epochs" if rounds > 1 else "median timed epoch"
    return f"{suite['title']}  ({how}, each configuration in its own process)"


_FOOT_IN = 0.55  # inches kept free under the axes for the machine caption


def write_charts(doc: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """One horizontal bar chart of throughput per suite with measured results; returns suite -> PNG path."""
    plt = _pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for name, suite in doc["suites"].items():
        ok = [r for r in suite["results"] if r.get("status") == "ok" and r.get("throughput")]
        if not ok:
            continue
        height = max(3.2, 0.32 * len(ok) + 2.0)
        fig, ax = plt.subplots(figsize=(13, height))
        _bars(ax, ok, suite)
        ax.set_title(_suite_title(suite), fontsize=10)
        fig.tight_layout(rect=(0, _FOOT_IN / height, 1, 0.97))
        decorate_figure(fig, doc, bottom=_FOOT_IN / height)
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths[name] = path
    return paths


def break_even_epoch(convert_s: float, subject_epoch_s: float, baseline_epoch_s: float) -> int | None:
    """The first whole epoch after which convert-once-then-serve has cost no more time than the baseline.

    After k epochs the subject has spent `convert_s + k * subject_epoch_s` and
    the baseline `k * baseline_epoch_s`. None when the subject's epoch is not
    faster (it never catches up).
    """
    if convert_s < 0 or subject_epoch_s <= 0 or baseline_epoch_s <= 0:
        raise ValueError(f"need convert_s >= 0 and positive epoch times, got {convert_s}, {subject_epoch_s}, "
                         f"{baseline_epoch_s}")
    saved = baseline_epoch_s - subject_epoch_s
    if saved <= 0:
        return None
    k = max(1, math.ceil(convert_s / saved))
    # ceil on a float quotient can land one short when the division rounds down.
    while convert_s + k * subject_epoch_s > k * baseline_epoch_s:
        k += 1
    return k


def write_demo_chart(doc: dict[str, Any], path: Path, *, subject: dict[str, Any], baseline: dict[str, Any],
                     convert: dict[str, Any]) -> Path:
    """The demo's chart: serving throughput with its spread, and total time over epochs with the conversion paid.

    `convert` is the conversion's result (its median time is the one-time cost).
    """
    plt = _pyplot()
    suite = doc["suites"][subject["suite"]]
    convert_s = convert["median_s"]
    t_sub, t_base = subject["median_s"], baseline["median_s"]
    k = break_even_epoch(convert_s, t_sub, t_base)

    height = 4.6
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, height), gridspec_kw={"width_ratios": [1.15, 1]})
    _bars(ax1, [subject, baseline], suite)
    ax1.set_title("Serving throughput (median epoch)", fontsize=10)

    horizon = max(10, 2 * (k or 5))
    epochs = list(range(horizon + 1))
    ax2.plot(epochs, [convert_s + e * t_sub for e in epochs], color=ROLE_COLORS["subject"], lw=2,
             label=f"{subject['name']}: convert once {convert_s:.1f} s, then {t_sub:.2f} s / epoch")
    ax2.plot(epochs, [e * t_base for e in epochs], color=ROLE_COLORS["baseline"], lw=2,
             label=f"{baseline['name']}: {t_base:.2f} s / epoch")
    ax2.axhline(convert_s, color=ROLE_COLORS["subject"], lw=0.8, ls=":")
    ax2.text(0.1, convert_s, f" one-time conversion {convert_s:.1f} s", fontsize=8, va="bottom",
             color="#7a3d10")
    ax2.set_ylim(0, max(convert_s + horizon * t_sub, horizon * t_base) * 1.08)
    if k is not None:
        ax2.axvline(k, color="#2a7f2a", lw=1, ls="--")
        ax2.annotate(f"break-even: epoch {k}", xy=(k, convert_s + k * t_sub),
                     xytext=(k + 0.12 * horizon, ax2.get_ylim()[1] * 0.45), color="#2a7f2a", fontsize=9,
                     weight="bold", arrowprops={"arrowstyle": "->", "color": "#2a7f2a"})
        verdict = f"converting once pays for itself from epoch {k}"
    else:
        verdict = "the served epoch is not faster: converting never pays back here"
    ax2.set_xlabel("epochs")
    ax2.set_ylabel("total wall time, s")
    ax2.set_xlim(0, horizon)
    ax2.legend(fontsize=7.5, loc="upper left")
    ax2.set_title(f"Total time, one-time conversion included:\n{verdict}", fontsize=9.5)
    fig.suptitle(f"Demo: {subject['items_per_epoch']:,} images, same data, batch size and consumer", fontsize=11)
    fig.tight_layout(rect=(0, _FOOT_IN / height, 1, 0.95))
    decorate_figure(fig, doc, bottom=_FOOT_IN / height)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
