"""The same real photos with captions and labels in every layout `tbl convert` reads, each converted with one
command: every result equal row for row to the folder-with-sidecar conversion, and each conversion's time
against the TAR's, same round.

    python -m tbl_bench.record_check --data-dir DIR --images 10000 [--size 160] [--rounds 3] [--peer-python PY]

The photos are `tbl_bench.data.make_image_tar`'s (100 classes, seed 0; the TAR is shared with
`tbl_bench.doctor_check` in the same DIR); each gets a deterministic caption (`caption`) and, as its label,
the index of its class folder among the sorted ones (what a folder conversion stores). Written once under
``DIR/records-N/`` and reused, each with its own library:

- ``folder``: the images extracted (ImageNet layout) and ``captions.json``, a sidecar keyed by path:
  ``tbl convert folder/ DST --sidecar captions.json``, the reference every other result must equal;
- ``tar``: the TAR itself, with the same sidecar: the figure every other source is read against;
- ``webdataset``: shards of `record_sources.SHARD_SAMPLES` keys (``.jpg``, ``.cls``, ``.txt``) written by
  webdataset's ``ShardWriter``, converted by their brace pattern (the caption is the ``txt`` field);
- ``parquet``: one file of HuggingFace-style ``{bytes, path}`` image structs, ``label`` and ``caption``,
  row groups of `record_sources.ROW_GROUP_ROWS` rows (pyarrow);
- ``hf``: ``Dataset.from_dict(...).cast_column("image", Image())`` saved with ``save_to_disk`` (datasets);
- ``manifest``: ``manifest.jsonl`` of ``{path, label, caption}`` beside the folder (paths into it).

Every conversion is one ``tbl convert SRC DST --size S --mode squash --workers W --quiet`` in a subprocess of
its own, timed from outside (interpreter start and imports included: what the user waits for), one at a
time; each round runs every source once, the order rotated by one source per round so no source always
runs first or last on a noisy machine. The first round's results are checked against the folder's:
every image with ``np.array_equal``, every label and caption with ``==`` (exit status 1 on any
difference or failed conversion). With ``--peer-python PY`` (an interpreter with litdata) each round also
runs ``litdata-from-parquet``, `tbl_bench.peers.litdata_peer.litdata_optimize_parquet` over the same
Parquet (one input per row group, PIL decode + squash resize; labels only, no captions), timed the same
way.

The table: per source, the seconds (median, min-max over rounds), images per second at the median, the
median over rounds of the TAR's seconds over the source's in the same round (the throughput ratio; the
goal is >= 0.9x), the CPU seconds (user + system of the command and its workers) and the same ratio by
them, and the 1-minute load average before its conversions (min-max); with a peer, the median over rounds of
litdata's seconds over ``parquet``'s, same round. On a machine shared with other work the wall times move
with the load; the CPU seconds, the work each conversion did, much less.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

__all__ = ["CAPTION_FIELDS", "PEER", "SOURCES", "caption", "check_rows", "main", "peer_ratio", "prepare", "summarize"]

SOURCES = ("folder", "tar", "webdataset", "parquet", "hf", "manifest")
PEER = "litdata-from-parquet"
CAPTION_FIELDS = {"webdataset": "txt"}  # WebDataset names a field by its extension; the others "caption"
GOAL = 0.9
_WORDS = ("red", "quiet", "café", "distant", "bright", "naïve", "small", "old", "sunlit", "blurred")


def caption(index: int, name: str) -> str:
    """The caption of photo ``index`` (member ``name``): deterministic text of 1 to 5 words, some non-ASCII."""
    words = " ".join(_WORDS[(index * 7 + k) % len(_WORDS)] for k in range(1 + index % 5))
    return f"photo {index} of {name.split('/', 1)[0]}: {words}"


def _written(path: Path, write: Callable[[Path], None]) -> Path:
    """``path``, written by ``write(tmp)`` under a temporary name and renamed into place (kept when present)."""
    from tbl_bench.record_sources import write_atomically

    return path if path.exists() else write_atomically(path, write)


def _write_folder(rows: list[tuple[str, int, str, bytes]], out: Path) -> None:
    for name, _, _, data in rows:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _write_webdataset(rows: list[tuple[str, int, str, bytes]], out: Path) -> None:
    import webdataset as wds

    from tbl_bench.record_sources import SHARD_SAMPLES

    out.mkdir()
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxcount=SHARD_SAMPLES, verbose=0) as sink:
        for i, (_, label, text, data) in enumerate(rows):
            sink.write({"__key__": f"{i:07d}", "jpg": data, "cls": label, "txt": text})


def _write_parquet(rows: list[tuple[str, int, str, bytes]], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tbl_bench.record_sources import ROW_GROUP_ROWS

    table = pa.table({"image": [{"bytes": data, "path": name} for name, _, _, data in rows],
                      "label": pa.array([label for _, label, _, _ in rows], pa.int64()),
                      "caption": [text for _, _, text, _ in rows]})
    pq.write_table(table, out, row_group_size=ROW_GROUP_ROWS)


def _write_hf(rows: list[tuple[str, int, str, bytes]], out: Path) -> None:
    from datasets import Dataset, Image, disable_progress_bars

    disable_progress_bars()
    ds = Dataset.from_dict({"image": [{"bytes": data, "path": None} for _, _, _, data in rows],
                            "label": [label for _, label, _, _ in rows],
                            "caption": [text for _, _, text, _ in rows]}).cast_column("image", Image())
    ds.save_to_disk(str(out))


def prepare(data_dir: Path, images: int) -> dict[str, list[str]]:
    """Write every layout of the photos (reused when present); per source, the SRC argument of its
    conversion followed by its own options."""
    from tbl_bench.data import make_image_tar
    from tbl_bench.record_sources import SHARD_SAMPLES, tar_samples

    data_dir.mkdir(parents=True, exist_ok=True)
    tar = _written(data_dir / f"photos-{images}.tar",
                   lambda path: make_image_tar(path, images, num_classes=100, seed=0))
    root = data_dir / f"records-{images}"
    root.mkdir(exist_ok=True)
    rows = [(name, label, caption(i, name), data) for i, (name, label, data) in enumerate(tar_samples(tar))]
    folder = _written(root / "folder", lambda path: _write_folder(rows, path))
    sidecar = _written(root / "captions.json", lambda path: path.write_text(
        json.dumps({name: {"caption": text} for name, _, text, _ in rows}, ensure_ascii=False)))
    wds = _written(root / "webdataset", lambda path: _write_webdataset(rows, path))
    last = (len(rows) - 1) // SHARD_SAMPLES
    parquet = _written(root / "photos.parquet", lambda path: _write_parquet(rows, path))
    hf = _written(root / "hf", lambda path: _write_hf(rows, path))
    manifest = _written(root / "manifest.jsonl", lambda path: path.write_text("".join(
        json.dumps({"path": f"folder/{name}", "label": label, "caption": text}, ensure_ascii=False) + "\n"
        for name, label, text, _ in rows)))
    return {"folder": [str(folder), "--sidecar", str(sidecar)], "tar": [str(tar), "--sidecar", str(sidecar)],
            "webdataset": [str(wds / f"shard-{{000000..{last:06d}}}.tar")], "parquet": [str(parquet)],
            "hf": [str(hf)], "manifest": [str(manifest)], PEER: [str(parquet)]}


def _load1() -> float | None:
    from tbl_bench.fingerprint import load_average

    load = load_average()
    return load[0] if load else None


class _TreeCpu:
    """CPU seconds (user + system) of every process below this one while it runs, polled every ``POLL_S``.

    ``getrusage(RUSAGE_CHILDREN)`` does not see `tbl convert`'s workers: they are the forkserver's children,
    and the forkserver is never waited for. Polling the process tree sees every process that lives longer
    than a poll; each one's last poll before it ends is what it is counted for (at most ``POLL_S`` short per
    process). A process's own times only: a parent's ``children_*`` times would count its children twice.
    """

    POLL_S = 0.05

    def __init__(self) -> None:
        self.seen: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _sample(self) -> None:
        try:
            children = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        for proc in children:
            try:
                with proc.oneshot():
                    key, times = (proc.pid, proc.create_time()), proc.cpu_times()
            except psutil.Error:  # ended between the listing and the read: its last poll stands
                continue
            self.seen[key] = max(self.seen.get(key, 0.0), times.user + times.system)

    def _poll(self) -> None:
        while not self._stop.wait(self.POLL_S):
            self._sample()

    def __enter__(self) -> _TreeCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())


def _timed(run: Callable[[], Any]) -> tuple[Any, float, float]:
    """``run()``'s result, its wall seconds and the CPU seconds of the processes it started (`_TreeCpu`): the
    CPU figure moves less than the wall time when others share the cores."""
    with _TreeCpu() as cpu:
        start = time.perf_counter()
        result = run()
        wall = time.perf_counter() - start
    return result, wall, cpu.seconds


def _options(size: int, workers: int) -> list[str]:
    """The options every source's `tbl convert` is given."""
    return ["--size", str(size), "--mode", "squash", "--workers", str(workers), "--quiet"]


def _tbl_convert(args: list[str], dst: Path, size: int, workers: int, timeout: float) -> tuple[float, float]:
    """Wall and CPU seconds of one `tbl convert` command in a subprocess (RuntimeError with its stderr when it
    fails)."""
    src, options = args[0], args[1:]
    cmd = [sys.executable, "-m", "tbl_format.cli", "convert", src, str(dst), *_options(size, workers), *options]
    done, wall, cpu = _timed(lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout))
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr[-2000:]}")
    return wall, cpu


def _litdata(peer_python: str, parquet: str, dst: Path, size: int, workers: int, timeout: float,
             images: int) -> tuple[float, float]:
    """Wall and CPU seconds of litdata `optimize` over the Parquet under ``peer_python``
    (`tbl_bench.runner.call_in`)."""
    from tbl_bench.runner import call_in

    n, wall, cpu = _timed(lambda: call_in(
        peer_python, "tbl_bench.peers.litdata_peer:litdata_optimize_parquet",
        {"parquet": parquet, "dst": str(dst), "size": size, "workers": workers}, timeout_s=timeout))
    if n != images:
        raise RuntimeError(f"litdata optimize wrote {n} samples, not {images}")
    return wall, cpu


def check_rows(path: Path, caption_field: str, reference: Path) -> str | None:
    """None when the dataset at ``path`` equals the folder's conversion at ``reference`` row for row (images
    with ``np.array_equal``, labels and captions with ``==``), else the first difference."""
    import numpy as np

    from tbl_loader import PyTreeDataset

    with PyTreeDataset(reference) as want, PyTreeDataset(path) as got:
        if len(got) != len(want):
            return f"{len(got)} rows, the reference {len(want)}"
        for i in range(len(want)):
            g, w = got[i], want[i]
            if caption_field not in g:
                return f"row {i}: no field {caption_field!r} (fields: {sorted(g)})"
            if g["image"].shape != w["image"].shape or not np.array_equal(g["image"], w["image"]):
                return f"row {i}: the image differs"
            if int(g["label"]) != int(w["label"]):
                return f"row {i}: label {int(g['label'])}, the reference {int(w['label'])}"
            if g[caption_field] != w["caption"]:
                return f"row {i}: caption {g[caption_field]!r}, the reference {w['caption']!r}"
    return None


def _drop(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    Path(f"{path}.report.json").unlink(missing_ok=True)


def _span(values: list[float], fmt: str) -> str:
    return f"{format(min(values), fmt)}-{format(max(values), fmt)}" if len(values) > 1 else format(values[0], fmt)


def _ratios(mine: list[float | None], theirs: list[float | None]) -> list[float]:
    """Their seconds over mine, round by round (my throughput over theirs), where both ran."""
    return [t / m for m, t in zip(mine, theirs, strict=False) if m is not None and t is not None]


def summarize(seconds: dict[str, list[float | None]], cpu: dict[str, list[float | None]],
              loads: dict[str, list[float | None]], images: int) -> list[dict[str, Any]]:
    """One row per source: wall seconds (median, min, max), images/s at the median, the median over rounds of
    the TAR's seconds over its own in the same round (range), the same by CPU seconds, the load before its
    conversions."""
    out = []
    for name, times in seconds.items():
        done = [t for t in times if t is not None]
        if not done:
            continue
        wall = _ratios(times, seconds.get("tar", []))
        by_cpu = _ratios(cpu[name], cpu.get("tar", []))
        used = [c for c in cpu[name] if c is not None]
        load = [x for x in loads.get(name, []) if x is not None]
        median = statistics.median(done)
        out.append({"source": name, "seconds": median, "seconds_min": min(done), "seconds_max": max(done),
                    "rounds": len(done), "images_per_s": images / median,
                    "vs_tar": statistics.median(wall) if wall else None,
                    "vs_tar_min": min(wall) if wall else None, "vs_tar_max": max(wall) if wall else None,
                    "cpu_seconds": statistics.median(used) if used else None,
                    "vs_tar_cpu": statistics.median(by_cpu) if by_cpu else None,
                    "load_min": min(load) if load else None, "load_max": max(load) if load else None})
    return out


def peer_ratio(seconds: dict[str, list[float | None]]) -> tuple[float, float, float] | None:
    """tbl-from-parquet's throughput over litdata-from-parquet's in the same round: (median, min, max)."""
    ratios = _ratios(seconds.get("parquet", []), seconds.get(PEER, []))
    return (statistics.median(ratios), min(ratios), max(ratios)) if ratios else None


def _print(table: list[dict[str, Any]]) -> None:
    print("| source | seconds, median (range) | images/s | vs TAR, same round: median (range) | CPU s, median "
          "| vs TAR by CPU s | load (1 min) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in table:
        secs = f"{r['seconds']:.2f} ({_span([r['seconds_min'], r['seconds_max']], '.2f')})"
        if r["vs_tar"] is None:
            ratio = "-"
        else:
            ratio = f"{r['vs_tar']:.2f}x ({_span([r['vs_tar_min'], r['vs_tar_max']], '.2f')})"
            if r["source"] not in ("tar", PEER) and r["vs_tar"] < GOAL:
                ratio += f", below {GOAL}x"
        load = _span([r["load_min"], r["load_max"]], ".2f") if r["load_min"] is not None else "-"
        used = f"{r['cpu_seconds']:.1f}" if r["cpu_seconds"] is not None else "-"
        by_cpu = f"{r['vs_tar_cpu']:.2f}x" if r["vs_tar_cpu"] is not None else "-"
        print(f"| {r['source']} | {secs} | {r['images_per_s']:.0f} | {ratio} | {used} | {by_cpu} | {load} |")


def main(argv: list[str] | None = None) -> int:
    from tbl_bench.suites.convert import usable_cores
    from tbl_loader import PyTreeDataset

    p = argparse.ArgumentParser(prog="python -m tbl_bench.record_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, required=True, help="where the photos and their layouts are kept")
    p.add_argument("--images", type=int, default=10_000)
    p.add_argument("--size", type=int, default=160, help="stored side of every conversion")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=None, help="workers of every conversion (default: usable cores)")
    p.add_argument("--sources", default=",".join(SOURCES[1:]),
                   help="the sources converted beside the folder (default: all)")
    p.add_argument("--peer-python", default=None, help="an interpreter with litdata: adds litdata-from-parquet")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds allowed to one conversion")
    p.add_argument("--json", type=Path, help="also write the rounds and the table here")
    args = p.parse_args(argv)
    chosen = [s for s in args.sources.split(",") if s]
    unknown = sorted(set(chosen) - set(SOURCES))
    if unknown or args.images < 1 or args.rounds < 1:
        p.error(f"unknown sources {unknown}; the sources are {list(SOURCES)}" if unknown
                else "--images and --rounds must be >= 1")
    if args.peer_python is not None and not Path(args.peer_python).exists():
        p.error(f"--peer-python {args.peer_python} does not exist")
    workers = args.workers or usable_cores()
    commands = prepare(args.data_dir, args.images)
    names = ["folder", *(s for s in SOURCES if s in chosen and s != "folder")]
    if args.peer_python is not None:
        names.append(PEER)
    seconds: dict[str, list[float | None]] = {n: [] for n in names}
    cpu: dict[str, list[float | None]] = {n: [] for n in names}
    loads: dict[str, list[float | None]] = {n: [] for n in names}
    failures: dict[str, str] = {}
    checks: dict[str, str | None] = {}
    out = Path(tempfile.mkdtemp(prefix=".record-check-", dir=args.data_dir / f"records-{args.images}"))
    try:
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            dsts = {}
            for name in order:
                dst = out / (name if name == PEER else f"{name}.tbl")
                taken = used = None
                if name not in failures:
                    loads[name].append(_load1())
                    try:
                        if name == PEER:
                            taken, used = _litdata(args.peer_python, commands[PEER][0], dst, args.size, workers,
                                             args.timeout, args.images)
                        else:
                            taken, used = _tbl_convert(commands[name], dst, args.size, workers, args.timeout)
                    except (RuntimeError, subprocess.TimeoutExpired) as e:
                        failures[name] = str(e)
                        print(f"round {r}: {name} failed: {e}", file=sys.stderr)
                seconds[name].append(taken)
                cpu[name].append(used)
                if taken is not None:
                    print(f"round {r}: {name} {taken:.2f} s, {used:.2f} CPU s", file=sys.stderr)
                if r == 0 and name != PEER:
                    dsts[name] = dst
                else:
                    _drop(dst)
            if r == 0:  # the results against the folder's, row for row
                if "folder" in failures:
                    break
                with PyTreeDataset(dsts["folder"]) as ref:
                    if len(ref) != args.images:
                        failures["folder"] = f"{len(ref)} rows, not {args.images}"
                        break
                for name, dst in dsts.items():
                    if name != "folder" and name not in failures:
                        checks[name] = check_rows(dst, CAPTION_FIELDS.get(name, "caption"), dsts["folder"])
                        print(f"{name}: {checks[name] or 'equal row for row to the folder'}", file=sys.stderr)
                for dst in dsts.values():
                    _drop(dst)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    table = summarize(seconds, cpu, loads, args.images)
    print(f"tbl convert of {args.images:,} photos with captions at --size {args.size} --mode squash, "
          f"{workers} worker(s), {args.rounds} round(s)")
    for name in names:
        if name == PEER:
            print(f"- {name}: litdata optimize over {commands[PEER][0]} under {args.peer_python}")
        else:
            src, *options = commands[name]
            print(f"- {name}: tbl convert {' '.join([src, 'DST', *_options(args.size, workers), *options])}")
    _print(table)
    versus, versus_cpu = peer_ratio(seconds), peer_ratio(cpu)
    if versus is not None and versus_cpu is not None:
        print(f"parquet (tbl convert) vs {PEER}, same round: {versus[0]:.2f}x ({_span(list(versus[1:]), '.2f')}); "
              f"by CPU seconds {versus_cpu[0]:.2f}x ({_span(list(versus_cpu[1:]), '.2f')})")
    for name, diff in checks.items():
        print(f"{name}: {'equal row for row to the folder (images, labels, captions)' if diff is None else diff}")
    for name, why in failures.items():
        print(f"{name}: FAILED: {why[-500:]}")
    if args.json is not None:
        args.json.write_text(json.dumps({"images": args.images, "size": args.size, "workers": workers,
                                         "rounds": args.rounds, "seconds": seconds, "cpu_seconds": cpu, "loads": loads,
                                         "table": table, "parquet_vs_peer": versus, "parquet_vs_peer_cpu": versus_cpu, "checks": checks,
                                         "failures": failures}, indent=2))
    failed = set(failures) - {PEER}
    return 0 if not failed and all(d is None for d in checks.values()) and len(checks) == len(names) - 1 - (
        PEER in names) else 1


if __name__ == "__main__":
    sys.exit(main())
