"""The cost of extra fields on a converted image dataset: the images suite's fields pair on any .tbl.

    python -m tbl_bench.fields_cost SRC.tbl --data-dir DIR [--rounds 5] [--json OUT.json]

``SRC.tbl`` is a converted image dataset (``tbl convert --size S``). It is written once
more with the images suite's ``FIELDS`` added to every row (two fixed-size leaves and
one string, :func:`tbl_bench.suites.images.write_fields_dataset`), then the suite's two
configurations run on that copy: ``images-only`` (``ImageLoader`` without ``fields=``)
and ``fields`` (with them), consume level, no augmentation, batch 64. Each round runs each
configuration in its own subprocess, the two alternating (``images-only``, ``fields``,
``images-only``, ...), so a burst of someone else's load lands on both. Printed: every
round's throughput and the ``fields / images-only`` ratio of that round, then the median
ratio with its range over rounds, and the load average around each round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from tbl_bench.config import Config
from tbl_bench.context import BenchContext
from tbl_bench.runner import run_round
from tbl_bench.suites import images

PAIR = ("images-only", "fields")


def configurations(src: str, fields_path: str, batch_size: int, warmup: int, epochs: int) -> list[Config]:
    """The images suite's fields pair (same target and parameters) over ``fields_path``."""
    import tbl_format

    with tbl_format.open(src) as ds:
        size = int(ds.schema.leaves["image"].shape[0])
    return [Config(images.NAME, f"tbl/consume/plain/{size}/{suffix}", "tbl", "tbl_bench.suites.images:tbl_serve",
                   {"path": fields_path, "batch_size": batch_size, "aug": "plain", "level": "consume", "size": size,
                    "fields": suffix == "fields"}, warmup=warmup, epochs=epochs, unit=images.UNIT)
            for suffix in PAIR]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.fields_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("src", help="a converted image dataset (.tbl)")
    p.add_argument("--data-dir", required=True, help="where the copy with fields is written (reused across runs)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3, help="timed epochs per round (after 1 warm-up epoch)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--json", default=None, help="write every round record here")
    args = p.parse_args(argv)
    ctx = BenchContext(args.data_dir, quick=False)
    src = str(Path(args.src).resolve())
    fields_path = str(ctx.artifact(f"{Path(src).stem}-fields.tbl", {"kind": "images-fields", "src": src},
                                   lambda path: images.write_fields_dataset(src, str(path))))
    configs = configurations(src, fields_path, args.batch_size, 1, args.epochs)
    records: dict[str, list[dict]] = {c.name: [] for c in configs}
    ratios = []
    for k in range(args.rounds):
        got = {}
        for config in configs:
            record = run_round(config)
            records[config.name].append(record)
            if record["status"] != "ok":
                print(f"round {k + 1} {config.name}: {record['status']}: {record.get('reason')}", file=sys.stderr)
                return 1
            got[config.name] = record["items_per_epoch"] / statistics.median(record["epochs_s"])
            print(f"round {k + 1} {config.name}: {got[config.name]:,.0f} images/s "
                  f"(load {record['loadavg_before'][0]:.2f} -> {record['loadavg_after'][0]:.2f})")
        ratio = got[configs[1].name] / got[configs[0].name]
        ratios.append(ratio)
        print(f"round {k + 1} fields / images-only: {ratio:.3f}")
    print(f"fields / images-only over {len(ratios)} rounds: median {statistics.median(ratios):.3f}, "
          f"range [{min(ratios):.3f}, {max(ratios):.3f}]")
    if args.json:
        Path(args.json).write_text(json.dumps({"ratios": ratios, "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
