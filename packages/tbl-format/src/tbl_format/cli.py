"""The `tbl` command: `tbl inspect PATH`, `tbl verify PATH`, plus subcommands from other packages.

Exit codes of the core commands: 0 success; 1 the path is not an intact
dataset (a FormatError: corrupt, not a TBL file, a FIFO or device in place of
a file, a shard missing or listed twice), one line on stderr naming the path,
the error class and the cause (``NOT A TBL DATASET`` for another kind of file
or a folder without a manifest, ``CORRUPT`` otherwise); 2 the path cannot be
read at all (missing, no permission); 130 interrupted. No traceback reaches
the user. ``--json`` prints one object on stdout (schemas ``tbl.inspect/1``
and ``tbl.verify/1``, docs/cli-json.md), on failure too.

Other packages register subcommands through the entry-point group
``tbl.commands``: each entry point names ``register(subparsers)``, which adds
one subparser and sets ``func=callable(args) -> int`` as its default. A plugin
that fails to load or register is reported on stderr and skipped; the core
subcommands keep working.

URLs. ``tbl inspect URL`` and ``tbl verify URL`` (any ``scheme://...`` path)
ask the entry-point group ``tbl.url_resolvers`` for a local copy: an entry
point named by the URL's scheme (``s3``, ``gs``, ``https``, ...) names
``resolve(url) -> local path``, which the command then reads as usual. This
package stays pure stdlib: tbl-loader's ``remote`` extra provides the
resolvers. With none installed the command fails (exit 2) naming the pip command.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from importlib.metadata import distributions, entry_points
from typing import Any, TextIO

from . import __version__
from .dataset import open as open_dataset
from .errors import BadMagicError, FormatError, NotADatasetError, NotRegularFileError
from .layout import FORMAT_VERSION

ENTRY_POINT_GROUP = "tbl.commands"
URL_RESOLVER_GROUP = "tbl.url_resolvers"

__all__ = ["ENTRY_POINT_GROUP", "URL_RESOLVER_GROUP", "build_parser", "inspect_report", "main", "resolve_path"]


def resolve_path(path: str) -> str:
    """``path`` itself, or for a URL the local copy its scheme's resolver returns (OSError without one)."""
    scheme, sep, _ = path.partition("://")
    if not sep or not scheme.isalnum():
        return path
    resolvers = [ep for ep in entry_points(group=URL_RESOLVER_GROUP) if ep.name == scheme.lower()]
    if not resolvers:
        raise OSError(f"no reader for {scheme}:// URLs is installed; install one with: "
                      f'pip install "tbl-loader[remote]"')
    try:
        return str(resolvers[0].load()(path))
    except ImportError as exc:  # the resolver's own library is missing: its message names the pip command
        raise OSError(str(exc)) from None


class _Progress:
    """Progress to stderr: tqdm when importable, else a one-line stdlib printer redrawn at most 10 times a second."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.bar: Any = None
        self.last = 0.0
        self.shown = False
        self.base = 0  # bytes of earlier shards
        self.prev_total = 0
        try:
            import tqdm

            self.tqdm: Any = tqdm.tqdm
        except ImportError:
            self.tqdm = None

    def __call__(self, done: int, total: int) -> None:
        if total < (64 << 20):  # small files finish before a bar would help
            return
        if self.tqdm is not None:
            if self.bar is None or self.bar.total != total:
                self.close()
                self.bar = self.tqdm(total=total, unit="B", unit_scale=True, desc=self.label, file=self.stream)
            self.bar.update(done - self.bar.n)
            return
        now = time.monotonic()
        if now - self.last < 0.1 and done < total:
            return
        self.last = now
        pct = 100.0 * done / total if total else 100.0
        self.stream.write(f"\r{self.label}: {done / 2**20:,.0f}/{total / 2**20:,.0f} MiB ({pct:5.1f}%)")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.shown:
            self.stream.write("\n")
            self.shown = False


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


NOT_A_DATASET = (BadMagicError, NotADatasetError, NotRegularFileError)
"""Errors that mean the path is no TBL dataset at all (another kind of file, a folder without a manifest)."""

INSPECT_SCHEMA = "tbl.inspect/1"
VERIFY_SCHEMA = "tbl.verify/1"


def _problem(exc: BaseException) -> dict[str, str]:
    """What went wrong, for ``--json``: ``not_a_dataset``, ``corrupt`` (exit 1) or ``unreadable`` (exit 2)."""
    if isinstance(exc, NOT_A_DATASET):
        kind = "not_a_dataset"
    elif isinstance(exc, FormatError):
        kind = "corrupt"
    else:
        kind = "unreadable"
    return {"kind": kind, "class": type(exc).__name__, "message": _one_line(exc)}


def _failed(path: str, exc: BaseException, schema: str | None = None) -> int:
    """Report a failed command in one line on stderr (and with ``--json``, its object on stdout); its exit code
    (1: not an intact dataset, 2: cannot read)."""
    problem = _problem(exc)
    if schema is not None:
        print(json.dumps({"schema": schema, "path": path, "ok": False, "error": problem}))
    if problem["kind"] == "unreadable":
        print(f"{path}: cannot read: {problem['message']}", file=sys.stderr)
        return 2
    label = "NOT A TBL DATASET" if problem["kind"] == "not_a_dataset" else "CORRUPT"
    print(f"{path}: {label}: {problem['class']}: {problem['message']}", file=sys.stderr)
    return 1


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _leaf_json(path: str, leaf: Any, column: dict[str, Any]) -> dict[str, Any]:
    return {"path": path, "kind": leaf.kind, "dtype": leaf.dtype,
            "shape": list(leaf.shape) if leaf.shape is not None else None, "ndim": leaf.ndim,
            "format": leaf.format, "item": leaf.item, "optional": leaf.optional,
            "stored_bytes": column.get("stored_bytes", 0), "raw_bytes": column.get("raw_bytes", 0),
            "compression": column.get("compression")}


HISTOGRAM_SHOWN = 10  # labels listed one by one in the text output; more are summarized


def _int_column(ds: Any, leaf_path: str) -> list[int] | None:
    """Every row of an int leaf that every row holds (a list), or None when there is no such leaf."""
    leaf = ds.schema.leaves.get(leaf_path)
    if leaf is None or leaf.kind != "int" or leaf.optional:
        return None
    values: list[int] = []
    for segment in ds.segments(leaf_path):  # numpy arrays, or memoryviews without numpy: both have tolist()
        values += segment.tolist()
    return values


def _spread(values: list[int]) -> dict[str, Any]:
    return {"min": min(values), "max": max(values), "mean": sum(values) / len(values)}


def column_statistics(ds: Any) -> dict[str, Any]:
    """Statistics of the small columns that describe a dataset: the label histogram (an int ``label`` leaf)
    and, for images of variable size (``height`` / ``width`` int leaves), their size distribution."""
    stats: dict[str, Any] = {}
    labels = _int_column(ds, "label")
    if labels:
        counts = Counter(labels)
        stats["label"] = {"distinct": len(counts),
                          "histogram": [[label, n] for label, n in sorted(counts.items())]}
    heights, widths = _int_column(ds, "height"), _int_column(ds, "width")
    if heights and widths:
        sizes = Counter(zip(heights, widths, strict=True))
        stats["image_size"] = {"height": _spread(heights), "width": _spread(widths), "distinct": len(sizes),
                               "most_common": [[h, w, n] for (h, w), n in sizes.most_common(5)]}
    return stats


def _statistics_lines(stats: dict[str, Any], metadata: dict[str, Any]) -> list[str]:
    lines = []
    label = stats.get("label")
    if label:
        classes = metadata.get("classes") if isinstance(metadata.get("classes"), list) else []

        def name(k: int) -> str:
            return f"{k} ({classes[k]})" if 0 <= k < len(classes) else str(k)

        hist = label["histogram"]
        if len(hist) <= HISTOGRAM_SHOWN:
            lines.append("labels:    " + ", ".join(f"{name(k)}: {n:,}" for k, n in hist))
        else:
            low, high = min(hist, key=lambda kn: kn[1]), max(hist, key=lambda kn: kn[1])
            lines.append(f"labels:    {label['distinct']:,} distinct; rows per label {low[1]:,} ({name(low[0])}) "
                         f"to {high[1]:,} ({name(high[0])})")
    size = stats.get("image_size")
    if size:
        h, w = size["height"], size["width"]
        common = ", ".join(f"{ch}x{cw} ({n:,})" for ch, cw, n in size["most_common"][:3])
        lines.append(f"sizes:     height {h['min']}..{h['max']} (mean {h['mean']:.1f}), width {w['min']}..{w['max']} "
                     f"(mean {w['mean']:.1f}); {size['distinct']:,} distinct HxW, most common {common}")
    return lines


def inspect_report(ds: Any, path: str) -> dict[str, Any]:
    """What ``tbl inspect --json`` prints for an open dataset (schema ``tbl.inspect/1``, docs/cli-json.md)."""
    shard_rows = ds.segment_rows
    columns: dict[str, dict[str, Any]] = {}
    info: dict[str, Any] = {}
    for k in range(len(shard_rows)):
        info = ds.shard(k).describe()
        for leaf_path, c in info.get("columns", {}).items():
            acc = columns.setdefault(leaf_path, {"stored_bytes": 0, "raw_bytes": 0})
            acc["stored_bytes"] += c.get("stored_bytes", 0)
            acc["raw_bytes"] += c.get("raw_bytes", 0)
            if c.get("compression"):
                acc["compression"] = c["compression"]
    return {
        "schema": INSPECT_SCHEMA,
        "path": path,
        "ok": True,
        "format": info.get("format"),
        "reader_format": f"{FORMAT_VERSION[0]}.{FORMAT_VERSION[1]}",
        "rows": len(ds),
        "files": len(shard_rows),
        "shard_rows": list(shard_rows),
        "block_size": info.get("block_size"),
        "leaves": [_leaf_json(p, leaf, columns.get(p, {})) for p, leaf in ds.schema.leaves.items()],
        "metadata": ds.metadata,
        "statistics": column_statistics(ds),
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    try:
        ds = open_dataset(resolve_path(args.path))
        try:
            report = inspect_report(ds, args.path)
            kinds = [str(leaf) for leaf in ds.schema.leaves.values()]
        finally:
            ds.close()
    except (FormatError, OSError) as exc:
        return _failed(args.path, exc, INSPECT_SCHEMA if as_json else None)
    if as_json:
        print(json.dumps(report, ensure_ascii=False))
        return 0
    out = sys.stdout
    fmt = report["format"] or "?"
    print(f"path:      {args.path}", file=out)
    print(f"format:    {fmt} (this reader writes {report['reader_format']})", file=out)
    print(f"rows:      {report['rows']:,} in {report['files']} file(s)", file=out)
    if report["block_size"] is not None:
        print(f"checksums: header, tables; data CRC-32 per {_fmt_bytes(report['block_size'])} block", file=out)
    print("leaves:", file=out)
    width = max((len(leaf["path"]) for leaf in report["leaves"]), default=4)
    for leaf, kind in zip(report["leaves"], kinds, strict=True):
        stored, raw = leaf["stored_bytes"], leaf["raw_bytes"]
        extra = ""
        if leaf["compression"]:
            extra = f"  {leaf['compression']} ratio {raw / stored if stored else 1.0:.2f}x"
        print(f"  {leaf['path'] or '<root>':<{width}}  {kind:<28} {_fmt_bytes(stored):>10}{extra}", file=out)
    for line in _statistics_lines(report["statistics"], report["metadata"]):
        print(line, file=out)
    print(f"metadata:  {json.dumps(report['metadata'], ensure_ascii=False, sort_keys=True)}", file=out)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    as_json = getattr(args, "json", False)
    progress = _Progress(f"verify {args.path}")
    try:
        ds = open_dataset(resolve_path(args.path))
        try:
            ds.verify(progress)
            rows = len(ds)
        finally:
            ds.close()
    except (FormatError, OSError) as exc:
        progress.close()
        return _failed(args.path, exc, VERIFY_SCHEMA if as_json else None)
    progress.close()
    if as_json:
        print(json.dumps({"schema": VERIFY_SCHEMA, "path": args.path, "ok": True, "rows": rows}))
    else:
        print(f"{args.path}: OK ({rows:,} rows, every checksum verified)")
    return 0


def _load_plugins(subparsers: Any) -> None:
    try:
        eps = entry_points(group=ENTRY_POINT_GROUP)
    except Exception as exc:  # a broken installation's metadata must not break the core commands
        print(f"tbl: warning: cannot list {ENTRY_POINT_GROUP} entry points: {exc}", file=sys.stderr)
        return
    for ep in sorted(eps, key=lambda e: e.name):
        try:
            ep.load()(subparsers)
        except Exception as exc:
            print(f"tbl: warning: subcommand plugin {ep.name!r} ({ep.value}) failed: {exc!r}", file=sys.stderr)


EXIT_CODES = """\
exit status:
  0    done: the dataset is intact (verify) or was read (inspect)
  1    not an intact dataset: NOT A TBL DATASET (another kind of file, a folder without manifest.json)
       or CORRUPT (a checksum, a bound or a rule of SPEC.md broken); one line on stderr names the error
  2    the path cannot be read at all (missing, no permission), or a usage error
  130  interrupted
With --json the same outcome is also printed on stdout as {"ok": false, "error": {"kind", "class", "message"}}.
"""


def _installed_versions() -> str:
    """One line per installed TBL distribution (name starting with "tbl-"), sorted: "NAME VERSION".

    Read from the installed metadata, so it names exactly what pip installed;
    tbl-format is always there (this module is part of it), even when run from
    a source tree without metadata.
    """
    found = {"tbl-format": __version__}
    for dist in distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("tbl-"):
            found[name] = dist.version
    return "\n".join(f"{name} {version}" for name, version in sorted(found.items()))


def build_parser(plugins: bool = True) -> argparse.ArgumentParser:
    # Raw text: the --version lines stay one package per line.
    parser = argparse.ArgumentParser(prog="tbl", description="Inspect, verify and (with plugins) convert .tbl datasets.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_installed_versions(),
                        help="name every installed TBL package and its version, one per line, and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("inspect", help="schema, rows, bytes per column, compression, metadata",
                       description="Print a dataset's format version, rows, files, leaves (kind, dtype, shape, "
                                   "stored bytes, compression), metadata, the label histogram (an int 'label' "
                                   "leaf) and the image size distribution (int 'height' / 'width' leaves: images "
                                   "of variable size). Reads the headers and those small columns only: it does "
                                   "not check data checksums (tbl verify does).",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="a .tbl file, a dataset folder (with manifest.json) or a URL")
    p.add_argument("--json", action="store_true",
                   help=f"print one JSON object on stdout (schema {INSPECT_SCHEMA!r}, docs/cli-json.md)")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser("verify", help="check every checksum; exit 0 if intact, 1 if not",
                       description="Open a dataset and check every checksum: header, tables and every data "
                                   "block of every file.",
                       epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="a .tbl file, a dataset folder (with manifest.json) or a URL")
    p.add_argument("--json", action="store_true",
                   help=f"print one JSON object on stdout (schema {VERIFY_SCHEMA!r}, docs/cli-json.md)")
    p.set_defaults(func=cmd_verify)
    if plugins:
        _load_plugins(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()  # loads the subcommands of the installed packages: Ctrl-C may land here
        args = parser.parse_args(argv)
        if getattr(args, "func", None) is None:
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("tbl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
