"""What an environment holds, for `nox -s install_matrix`; run with the environment's own python.

    python install_probe.py REQUIREMENT...

Prints one JSON object: every installed distribution (canonical name -> version),
the dependency closure of the given requirements in this environment (extras
and markers evaluated the way pip evaluates them), and what `shutil.which`
finds for each compiler and build tool.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from importlib.metadata import distributions

from pip._vendor.packaging.requirements import Requirement

TOOLS = ("gcc", "g++", "cc", "c++", "clang", "cmake")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str], dists: dict) -> set[str]:
    """Names reachable from `roots` through installed metadata (an unmet requirement is kept: it shows as missing)."""
    seen: set[tuple[str, str]] = set()
    todo = [Requirement(r) for r in roots]
    names: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        names.add(name)
        for extra in sorted(req.extras) or [""]:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            dist = dists.get(name)
            for text in (dist.requires or []) if dist else []:
                sub = Requirement(text)
                if sub.marker is None or sub.marker.evaluate({"extra": extra}):
                    todo.append(sub)
    return names


def main() -> None:
    dists = {canonical(d.metadata["Name"]): d for d in distributions()}
    print(json.dumps({
        "installed": {name: d.version for name, d in sorted(dists.items())},
        "closure": sorted(closure(sys.argv[1:], dists)),
        "which": {tool: shutil.which(tool) for tool in TOOLS},
    }))


if __name__ == "__main__":
    main()
