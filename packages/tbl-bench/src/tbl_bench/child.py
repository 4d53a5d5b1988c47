"""Subprocess entry point; the parent side is `tbl_bench.runner`.

    python -m tbl_bench.child measure CONFIG.json OUT.json
    python -m tbl_bench.child call MODULE:FUNCTION KWARGS.json OUT.json

`measure` runs one round of one configuration in this fresh interpreter (thread
pools, allocators and imported libraries of other configurations cannot leak
into it) and writes the round record. `call` runs a preparation function (a
peer tool writing its own copy of the data) and writes what it returns. Under
a peer interpreter only the standard library, numpy and the peer tool need to
be installed. Exit status 0 when OUT.json was written. The runner starts it
through ``python -c`` rather than ``-m`` (`tbl_bench.runner` says why).
"""

from __future__ import annotations

import importlib
import json
import sys

from tbl_bench.config import Config
from tbl_bench.measure import measure, resolve_target

USAGE = __doc__.split("\n\n")[1]


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "measure":
        with open(argv[1]) as f:
            config = Config(**json.load(f))
        for name in config.preimport:
            try:
                importlib.import_module(name)
            except ImportError:
                pass
        out = measure(config)
    elif len(argv) == 4 and argv[0] == "call":
        with open(argv[2]) as f:
            out = resolve_target(argv[1])(**json.load(f))
    else:
        print(f"usage:\n{USAGE}", file=sys.stderr)
        return 2
    with open(argv[-1], "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
