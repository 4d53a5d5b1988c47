"""`tbl bench` (entry point group `tbl.commands`) and `python -m tbl_bench`.

    tbl bench [--suite NAME ...] [--rounds N] [--quick] [--peers] [--peer-python PATH]
              [--only GLOB] [--json OUT.json] [--out DIR] [--data-dir DIR] [--docs PATH]
    tbl bench images --data PATH [--batch-size N] [--image-size PX] [--dtype D] [--threads T] [--json]
    tbl bench --report-only RESULTS.json [--out DIR] [--docs docs/benchmarks.md]
    tbl bench --list

--data measures your own dataset (a JPEG TAR or a converted .tbl; for pytree_read
any .tbl) with your settings; --json alone prints a JSON summary on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from tbl_bench.bench import run_bench
from tbl_bench.config import Config
from tbl_bench.context import BenchContext
from tbl_bench.report import write_report
from tbl_bench.results import load_results
from tbl_bench.suites import SUITES
from tbl_bench.user_data import DTYPES, USER_DATA_SUITES, UserData, UserDataError, data_kind, summary

__all__ = ["add_arguments", "main", "register_bench", "run"]

DEFAULT_OUT = "bench-results"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("suites", nargs="*", metavar="SUITE", help="same as --suite")
    p.add_argument("--suite", nargs="+", default=[], metavar="NAME", dest="suite_names",
                   help=f"suites to run (default: all): {', '.join(SUITES)}")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of every configuration, each a fresh process, round-robin; figures are medians "
                        "over rounds (default: the suite's own, 1 with --quick)")
    p.add_argument("--quick", action="store_true", help="small data and few epochs: proves the pipeline, not for quoting")
    p.add_argument("--peers", action="store_true",
                   help="also measure TurboLoader, litdata and FFCV (pip install './packages/tbl-bench[peers]')")
    p.add_argument("--peer-python", default=None, metavar="PATH",
                   help="interpreter of an environment holding the peer tools; runs their configurations and "
                        "prepares their data (implies --peers; default: this interpreter)")
    p.add_argument("--only", action="append", default=[], metavar="GLOB",
                   help="run only configurations whose name matches (repeatable), e.g. 'turboloader/*'")
    p.add_argument("--json", nargs="?", const="-", default=None, metavar="OUT",
                   help="write the results here (default: OUT_DIR/results.json); alone or '-': print a JSON summary "
                        "on stdout (progress goes to stderr) and keep the results in OUT_DIR/results.json")
    g = p.add_argument_group("your own data (suites: " + ", ".join(USER_DATA_SUITES) + ")")
    g.add_argument("--data", default=None, metavar="PATH",
                   help="measure this dataset instead of generated data: an ImageNet-layout JPEG TAR or a converted "
                        ".tbl (images), any .tbl (pytree_read); default suite: the one that fits it")
    g.add_argument("--batch-size", type=int, default=None, metavar="N", help="batch size (default: the suite's)")
    g.add_argument("--image-size", type=int, default=None, metavar="PX",
                   help="served size of a TAR (converted once to it) and output size of the crop (default: 160 / "
                        "the stored size)")
    g.add_argument("--dtype", default="float32", choices=DTYPES, help="output dtype of the loaders (default: float32)")
    g.add_argument("--threads", type=int, default=None, metavar="T",
                   help="TBL's loader threads and the PIL baseline's workers (default: all cores / 2 workers)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"report.md and charts go here (default: {DEFAULT_OUT})")
    p.add_argument("--data-dir", default=None, help="generated and converted data, reused across runs (default: OUT/data)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data (default: 0)")
    p.add_argument("--report-only", metavar="RESULTS_JSON", default=None,
                   help="measure nothing: regenerate report.md and charts from a results file")
    p.add_argument("--docs", metavar="PATH", default=None,
                   help="also write the report (tables only) to PATH, e.g. docs/benchmarks.md")
    p.add_argument("--list", action="store_true", help="list the suites and exit")


def _print_config(config: Config, k: int) -> None:
    print(f"[{config.suite}] {config.name}" + (f" (round {k + 1})" if k else ""), flush=True)


def _print_result(r: dict) -> None:
    if r["status"] != "ok":
        print(f"    {r['status']}: {(r.get('reason') or '').strip().splitlines()[-1:]}", flush=True)
        return
    line = (f"    {r['throughput']:,.0f} {r['unit']}  median {r['median_s']:.4g} s  "
            f"[{r['min_s']:.4g}, {r['max_s']:.4g}]  rounds {len(r['rounds'])}")
    rss = r["rss"] or {}
    if rss.get("growth_anon_kb") is not None:
        line += f"  anon +{rss['growth_anon_kb'] / 1024:.0f} MiB  file +{rss['growth_file_kb'] / 1024:.0f} MiB"
    elif rss.get("growth_rss_kb") is not None:  # platforms that do not split resident memory
        line += f"  rss +{rss['growth_rss_kb'] / 1024:.0f} MiB"
    print(line, flush=True)


def _suite_names(args: argparse.Namespace) -> list[str]:
    names = [*args.suites, *args.suite_names]
    return list(dict.fromkeys(names)) or list(SUITES)


def _user_data(args: argparse.Namespace) -> tuple[UserData | None, list[str]]:
    """The --data settings and the suites to run on them; UserDataError when they do not fit."""
    given = [name for name in ("batch_size", "image_size", "threads") if getattr(args, name) is not None]
    if args.data is None:
        if given or args.dtype != "float32":
            flags = ", ".join("--" + n.replace("_", "-") for n in given) or "--dtype"
            raise UserDataError(f"{flags} go with --data PATH (your own dataset)")
        return None, _suite_names(args)
    user = UserData(args.data, batch_size=args.batch_size, image_size=args.image_size, dtype=args.dtype,
                    threads=args.threads)
    names = list(dict.fromkeys([*args.suites, *args.suite_names]))
    if not names:
        names = ["pytree_read" if data_kind(args.data) == "pytree-tbl" else "images"]
    other = [n for n in names if n not in USER_DATA_SUITES]
    if other:
        raise UserDataError(f"--data works with the suites {', '.join(USER_DATA_SUITES)}, not {', '.join(other)}")
    return user, names


def run(args: argparse.Namespace) -> int:
    if args.list:
        for name in SUITES:
            print(name)
        return 0
    out = Path(args.out)
    if args.report_only is not None:
        if args.suites or args.suite_names or args.peers or args.peer_python or args.quick or args.only or args.rounds:
            print("tbl bench: --report-only measures nothing; drop the suites, --rounds, --peers, --peer-python, "
                  "--quick and --only", file=sys.stderr)
            return 2
        doc = load_results(args.report_only)
    else:
        try:
            user, suites = _user_data(args)
        except UserDataError as e:
            print(f"tbl bench: {e}", file=sys.stderr)
            return 2
        unknown = [s for s in suites if s not in SUITES]
        if unknown:
            print(f"tbl bench: unknown suite(s) {', '.join(unknown)}; known: {', '.join(SUITES)}", file=sys.stderr)
            return 2
        if args.rounds is not None and args.rounds < 1:
            print(f"tbl bench: --rounds must be >= 1, got {args.rounds}", file=sys.stderr)
            return 2
        if args.peer_python is not None and not Path(args.peer_python).exists():
            print(f"tbl bench: --peer-python {args.peer_python} does not exist", file=sys.stderr)
            return 2
        ctx = BenchContext(args.data_dir or out / "data", quick=args.quick,
                           peers=args.peers or args.peer_python is not None, peer_python=args.peer_python,
                           seed=args.seed, user=user)
        to_stdout = args.json == "-"
        results = Path(args.json) if args.json and not to_stdout else out / "results.json"
        progress = sys.stderr if to_stdout else sys.stdout
        try:
            with contextlib.redirect_stdout(progress):
                doc = run_bench(suites, ctx, results, rounds=args.rounds, only=args.only,
                                on_config=_print_config, on_result=_print_result)
        except UserDataError as e:
            print(f"tbl bench: {e}", file=sys.stderr)
            return 2
        print(f"results: {results}", file=progress)
        if to_stdout:
            print(json.dumps(summary(doc), indent=1))
    md = write_report(doc, out, docs_path=args.docs)
    print(f"report: {md}" + (f", {args.docs}" if args.docs else ""),
          file=sys.stderr if args.json == "-" else sys.stdout)
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
