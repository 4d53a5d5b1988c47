"""`tbl bench` (entry point group `tbl.commands`) and `python -m tbl_bench`.

    tbl bench [SUITE ...] [--peers] [--quick] [--out DIR] [--data-dir DIR]
    tbl bench --report-only RESULTS.json [--out DIR] [--docs docs/benchmarks.md]
    tbl bench --list
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tbl_bench.suites import SUITES

__all__ = ["add_arguments", "main", "register_bench", "run"]

DEFAULT_OUT = "bench-results"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suites", nargs="*", metavar="SUITE",
                   help=f"suites to run (default: all): {', '.join(SUITES)}")
    p.add_argument("--peers", action="store_true",
                   help="also measure TurboLoader, litdata and FFCV (pip install 'tbl-bench[peers]')")
    p.add_argument("--quick", action="store_true", help="small data and few epochs: proves the pipeline, not for quoting")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"results.json, report.md and charts go here (default: {DEFAULT_OUT})")
    p.add_argument("--data-dir", default=None, help="generated and converted data, reused across runs (default: OUT/data)")
    p.add_argument("--report-only", metavar="RESULTS_JSON", default=None,
                   help="measure nothing: regenerate report.md and charts from a results file")
    p.add_argument("--docs", metavar="PATH", default=None,
                   help="also write the report (tables only) to PATH, e.g. docs/benchmarks.md")
    p.add_argument("--only", action="append", default=[], metavar="GLOB",
                   help="run only configurations whose name matches (repeatable), e.g. 'turboloader/*'")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data (default: 0)")
    p.add_argument("--list", action="store_true", help="list the suites and exit")


def _print_result(r: dict) -> None:
    if r["status"] != "ok":
        print(f"    {r['status']}: {(r.get('reason') or '').splitlines()[-1] if r.get('reason') else ''}", flush=True)
        return
    if r.get("kind") == "script":
        print("    ok (script results recorded)", flush=True)
        return
    rss = r["rss"]
    print(f"    {r['throughput']:,.0f} {r['unit']}  median {r['median_s']:.3f} s  "
          f"[{r['min_s']:.3f}, {r['max_s']:.3f}]  anon +{rss['growth_anon_kb'] / 1024:.0f} MiB  "
          f"file +{rss['growth_file_kb'] / 1024:.0f} MiB", flush=True)


def run(args: argparse.Namespace) -> int:
    from tbl_bench.bench import load_results, run_bench
    from tbl_bench.context import BenchContext
    from tbl_bench.report import write_report

    if args.list:
        for name in SUITES:
            print(name)
        return 0
    out = Path(args.out)
    if args.report_only is not None:
        if args.suites or args.peers or args.quick or args.only:
            print("tbl bench: --report-only measures nothing; drop SUITE, --peers, --quick and --only",
                  file=sys.stderr)
            return 2
        doc = load_results(args.report_only)
    else:
        unknown = [s for s in args.suites if s not in SUITES]
        if unknown:
            print(f"tbl bench: unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}", file=sys.stderr)
            return 2
        suites = args.suites or list(SUITES)
        ctx = BenchContext(args.data_dir or out / "data", quick=args.quick, peers=args.peers, seed=args.seed)
        doc = run_bench(
            suites, ctx, out / "results.json", only=args.only,
            on_config=lambda c: print(f"[{c.suite}] {c.name}", flush=True),
            on_result=_print_result,
        )
    md = write_report(doc, out, docs_path=args.docs)
    print(f"report: {md}" + (f", {args.docs}" if args.docs else ""))
    failed = [r["name"] for s in doc["suites"].values() for r in s["results"] if r["status"] == "failed"]
    if failed:
        print(f"tbl bench: {len(failed)} configuration(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def register_bench(subparsers) -> None:
    """Entry point of the `tbl.commands` group: adds `tbl bench`."""
    p = subparsers.add_parser("bench", help="run the benchmark suites; JSON, markdown and charts",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))
