"""The demo: `python -m tbl_bench.demo` (and `nox -s demo`).

Makes a small real-photo dataset (2,000 JPEGs of 250 to 500 px from the photos
shipped with scikit-image and scikit-learn), converts it to a 160 px .tbl,
serves epochs with ImageLoader, and compares with the on-the-fly PyTorch
DataLoader + PIL pipeline on the same data, same batch size, same consumer
(every batch summed). Each side runs in its own subprocess: one warm-up epoch,
then the median of 3 timed epochs. The conversion is timed too (its own
subprocess, all cores): the chart shows what it costs once and the epoch from
which converting pays for itself against the baseline. Writes results.json,
report.md and demo.png to ./demo-output/.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

from tbl_bench.charts import QUICK_STAMP, break_even_epoch, write_demo_chart
from tbl_bench.config import Config
from tbl_bench.context import BenchContext, DataUnavailable, Sizes
from tbl_bench.report import write_report
from tbl_bench.results import finish_document, new_document, save_results
from tbl_bench.runner import run_config

__all__ = ["main", "run_demo"]

SUITE = "demo"
QUICK_IMAGES = 300
QUICK_BELOW = 1000  # a demo on fewer images is a quick run, whatever its flags


def _configs(ctx: BenchContext, tbl_path: Path, tar: Path, epochs: int) -> list[Config]:
    s = ctx.sizes
    common = {"warmup": 1, "epochs": epochs, "unit": "images/s"}
    return [
        Config(SUITE, "tbl ImageLoader", "tbl", "tbl_bench.suites.images:tbl_serve",
               {"path": str(tbl_path), "batch_size": s.batch_size, "aug": "plain", "level": "consume",
                "size": s.image_size}, **common),
        Config(SUITE, "PyTorch DataLoader + PIL (2 workers)", "pil", "tbl_bench.peers.pil:pil_loader",
               {"tar": str(tar), "size": s.image_size, "batch_size": s.batch_size, "aug": "plain",
                "level": "consume"}, role="baseline", **common),
    ]


def _convert_config(tar: Path, sizes: Sizes) -> Config:
    """The one-time conversion, timed in its own subprocess like the serving (no warm-up: it is paid once)."""
    return Config(SUITE, "tbl convert", "tbl", "tbl_bench.suites.convert:tbl_convert",
                  {"tar": str(tar), "size": sizes.image_size, "count": sizes.images, "mode": "squash",
                   "workers": None}, warmup=0, epochs=1, unit="images/s")


def run_demo(out: Path, *, images: int = 2000, epochs: int = 3, seed: int = 0, quick: bool = False) -> int:
    """The whole demo into `out`; returns the exit status. `quick` (or fewer than QUICK_BELOW images) stamps
    every output "quick run: do not quote"."""
    t_start = time.perf_counter()
    quick = quick or images < QUICK_BELOW
    sizes = Sizes(images=images, classes=100, image_size=160, batch_size=128,
                  scalar_rows=0, array_rows=0, warmup=1, epochs=epochs)
    ctx = BenchContext(out / "data", seed=seed, sizes=sizes, quick=quick)

    print(f"1/5 generating {images} real-photo JPEGs (250-500 px) from the scikit-image / scikit-learn samples",
          flush=True)
    t = time.perf_counter()
    tar = ctx.image_tar()
    print(f"    {tar} ({tar.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t:.1f} s", flush=True)

    print(f"2/5 converting to a {sizes.image_size} px .tbl (decode + resize once)", flush=True)
    try:
        tbl_path = ctx.tbl_images(mode="squash")
    except DataUnavailable as e:
        print(f"tbl_bench.demo: cannot convert: {e}", file=sys.stderr)
        return 1
    print(f"    {tbl_path} ({tbl_path.stat().st_size / 2**20:.0f} MiB)", flush=True)

    doc = new_document({"suites": [SUITE], "quick": quick, "peers": False, "rounds": 1,
                        "data_dir": str(ctx.data_dir), "seed": seed}, asdict(sizes))
    doc["suites"][SUITE] = {"title": "Demo: serving 160 px images, consume level", "unit": "images/s",
                            "compare_on": [], "rounds": 1, "ratios": {}, "results": []}
    results_path = out / "results.json"
    print("3/5 timing the conversion (one-time cost, own subprocess, all cores)", flush=True)
    convert = run_config(_convert_config(tar, sizes))
    doc["conversion"] = convert
    save_results(doc, results_path)
    if convert["status"] != "ok":
        print(f"    {convert['status']}: {convert['reason']}", file=sys.stderr)
        return 1
    print(f"    {convert['median_s']:.1f} s ({convert['throughput']:,.0f} images/s)", flush=True)
    steps = {"tbl": "4/5 serving with tbl ImageLoader", "pil": "5/5 serving with PyTorch DataLoader + PIL"}
    for config in _configs(ctx, tbl_path, tar, epochs):
        print(f"{steps[config.tool]} (1 warm-up + {epochs} epochs of {images} images, own subprocess)", flush=True)
        r = run_config(config)
        doc["suites"][SUITE]["results"].append(r)
        save_results(doc, results_path)
        if r["status"] != "ok":
            print(f"    {r['status']}: {r['reason']}", file=sys.stderr)
            return 1
        print(f"    {r['throughput']:,.0f} images/s (median epoch {r['median_s']:.2f} s)", flush=True)
    tbl, pil = doc["suites"][SUITE]["results"]
    k = break_even_epoch(convert["median_s"], tbl["median_s"], pil["median_s"])
    doc["suites"][SUITE]["ratios"] = {"serving tbl / pil": tbl["throughput"] / pil["throughput"],
                                      "conversion s": convert["median_s"]}
    if k is not None:  # no entry: the served epoch is not faster, conversion never pays back
        doc["suites"][SUITE]["ratios"]["break-even epoch"] = float(k)
    finish_document(doc, results_path)
    write_report(doc, out)
    (out / f"{SUITE}.png").unlink()  # the generic bar chart: the demo's own chart replaces it
    write_demo_chart(doc, out / "demo.png", subject=tbl, baseline=pil, convert=convert)
    (out / "report.md").write_text((out / "report.md").read_text().replace(f"({SUITE}.png)", "(demo.png)"))

    ratio = tbl["throughput"] / pil["throughput"]
    m = doc["machine"]
    rows = [(tbl["name"], tbl["throughput"], f"{ratio:.1f}x"), (pil["name"], pil["throughput"], "1.0x")]
    w = max(len(r[0]) for r in rows)
    print()
    if quick:
        print(f"*** {QUICK_STAMP} ***")
    print(f"Same {images} images, batch {sizes.batch_size}, every batch summed; {m['cpu_model']}, "
          f"{m['usable_cores']} cores; load average {m['loadavg_start']} -> {m['loadavg_end']}")
    print(f"{'pipeline':<{w}}  {'images/s':>10}  {'vs PIL':>7}")
    for name, ips, rel in rows:
        print(f"{name:<{w}}  {ips:>10,.0f}  {rel:>7}")
    print(f"one-time conversion {convert['median_s']:.1f} s; "
          + (f"break-even against the baseline at epoch {k}" if k is not None
             else "the served epoch is not faster than the baseline's: no break-even"))
    print()
    print(f"chart: {out / 'demo.png'}   report: {out / 'report.md'}   results: {results_path}")
    print(f"demo finished in {time.perf_counter() - t_start:.0f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="demo-output", help="output directory (default: demo-output)")
    p.add_argument("--images", type=int, default=2000, help="images to generate (default: 2000)")
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per pipeline (default: 3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated data (default: 0)")
    p.add_argument("--quick", action="store_true",
                   help=f"{QUICK_IMAGES} images, 2 epochs: proves the pipeline; its outputs say '{QUICK_STAMP}'")
    args = p.parse_args(argv)
    if args.quick:
        args.images, args.epochs = min(args.images, QUICK_IMAGES), min(args.epochs, 2)
    if args.images < 1 or args.epochs < 1:
        p.error("--images and --epochs must be >= 1")
    return run_demo(Path(args.out), images=args.images, epochs=args.epochs, seed=args.seed, quick=args.quick)


if __name__ == "__main__":
    sys.exit(main())
