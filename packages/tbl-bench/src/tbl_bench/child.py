"""Subprocess entry point: `python -m tbl_bench.child CONFIG.json RESULT.json`.

Runs exactly one configuration in a fresh interpreter (thread pools, allocators
and page-cache state of other configurations cannot leak into it) and writes
its result. Exit status 0 when a result (ok or skipped) was written.
"""

from __future__ import annotations

import importlib
import json
import sys

from tbl_bench.harness import Config, measure


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tbl_bench.child CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        config = Config(**json.load(f))
    for name in config.preimport:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    result = measure(config)
    with open(argv[1], "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
