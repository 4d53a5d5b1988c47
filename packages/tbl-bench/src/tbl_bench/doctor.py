"""`tbl doctor DATASET`: run the loader you would run, beside this machine's ceilings, and name what bounds it.

    tbl doctor DATASET [--batch-size B] [--image-size S] [--threads T] [--dtype D] [--prefetch P]
               [--shuffle global|block|none] [--seconds N] [--cache-dir DIR] [--cache-limit BYTES] [--json] [--quiet]

The loader runs for ``--seconds`` (after two warm-up batches) with its
per-stage counters (``loader.stats()``); in the same run the doctor measures
the ceilings of this machine: a memory copy of one batch's output bytes, the
read speed of the dataset's files (for a URL: the download speed the run got),
and for JPEG storage the decode speed of all cores. It prints the time per
batch of every stage, how far the loader is from each ceiling, the stage that
bounds throughput, and what to change, with the throughput predicted after the
change where a measurement supports a prediction. A URL bound by its downloads
is measured a second time over the rows whose shards the run left cached (as
long again): that is the prediction for a cache that holds the dataset. So are
a loader bound by decode or the kernel on fewer threads than cores (on every
core: the prediction for more threads) and one bound by its transform (without
it).

How the bound stage is named. The producer thread runs read, decode, kernel
and the user's transform one after the other; the consumer runs the training
step (everything outside ``next()``) and the copy to the device. With a
prefetch queue the slower side sets the pace: when the producer's stages add
up to more than the consumer's, the largest producer stage bounds; otherwise
the consumer (``consumer``: data is not the bottleneck) or ``device_copy``.

Exit status: 0 measured (whatever the verdict); 2 the dataset cannot be read
or an option is refused (one line on stderr).

``--json`` prints one object, schema ``tbl.doctor/1`` (docs/observability.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import tbl_format
from tbl_bench.fingerprint import memory_copy_bandwidth

__all__ = ["SCHEMA", "add_arguments", "diagnose", "main", "register_doctor", "run"]

SCHEMA = "tbl.doctor/1"
PRODUCER_STAGES = ("read", "decode", "kernel", "transform")
CONSUMER_STAGES = ("consumer", "device_copy")
WARMUP_BATCHES = 2
DECODE_SAMPLE = 64  # JPEG rows decoded for the all-core decode ceiling
READ_SAMPLE = 256 << 20
SHUFFLES = {"global": True, "block": "block", "none": False}  # --shuffle -> the loaders' shuffle  # bytes of the dataset's files read for the read ceiling


class DoctorError(ValueError):
    """The dataset or an option cannot be measured. ``argument``: the keyword argument at fault (the command line
    names its flag instead), or None when the message names the path."""

    def __init__(self, problem: str, argument: str | None = None) -> None:
        super().__init__(problem if argument is None else f"{argument} {problem}")
        self.problem, self.argument = problem, argument

    def for_cli(self) -> str:
        return str(self) if self.argument is None else f"--{self.argument.replace('_', '-')} {self.problem}"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def _describe(path: str, remote: bool, cache_dir: Any, cache_limit: Any) -> dict[str, Any]:
    """The dataset's storage (``fixed``, ``raw``, ``jpeg`` or ``pytree``), rows, stored bytes and local files."""
    if remote:
        from tbl_loader.source import open_remote  # the manifest only (a single file: downloaded)

        with open_remote(path, cache_dir=cache_dir, cache_limit=cache_limit) as ds:
            leaf, rows = ds.schema.leaves.get("image"), len(ds)
            stored, files = sum(int(e.get("size") or 0) for e in ds.shard_entries), []
    else:
        if not Path(path).exists():
            raise DoctorError(f"{path}: no such file or folder")
        with tbl_format.open(path) as ds:
            leaf, rows, files = ds.schema.leaves.get("image"), len(ds), [Path(f) for f in ds.files]
        stored = sum(f.stat().st_size for f in files)
    if leaf is None:
        storage = "pytree"
    else:
        storage = {"encoded_image": "jpeg", "var_array": "raw"}.get(leaf.kind, "fixed")
    return {"storage": storage, "rows": rows, "stored_bytes": stored, "files": files}


def _make_loader(path: str, storage: str, *, batch_size: int, image_size: int | None, threads: int | None,
                 dtype: str, prefetch: int, shuffle: Any, transform: Any, remote: dict[str, Any],
                 rows: Any = None) -> Any:
    from tbl_loader import ImageLoader, PyTreeLoader, RandomResizedCrop

    if storage == "pytree":
        if image_size is not None or transform is not None or threads is not None:
            given = [name for name, value in (("image_size", image_size), ("threads", threads),
                                              ("transform", transform)) if value is not None]
            raise DoctorError("applies to image datasets only (this one has no 'image' leaf)", given[0])
        return PyTreeLoader(path, batch_size, shuffle=shuffle, prefetch=prefetch, rows=rows, **remote)
    size = image_size if image_size is not None else (None if storage == "fixed" else 224)
    crop = RandomResizedCrop(size) if size is not None else None
    return ImageLoader(path, batch_size, shuffle=shuffle, random_resized_crop=crop, hflip=0.5, dtype=dtype,
                       num_threads=threads, prefetch=prefetch, transform=transform, rows=rows, **remote)


def _touch(batch: Any) -> None:
    """The *produce* consumption level: one element of the first array of the batch."""
    first = batch
    while isinstance(first, (tuple, list)) and first:
        first = first[0]
    if isinstance(first, dict) and first:
        first = next(iter(first.values()))
    if hasattr(first, "reshape"):
        first.reshape(-1)[:1].tolist()


def _batches(loader: Any) -> Any:
    while True:
        yield from loader
        loader.set_epoch(loader.epoch + 1)


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    seconds = {k: after["seconds"][k] - before["seconds"][k] for k in after["seconds"]}
    cache = {k: after["cache"][k] - before["cache"][k] for k in after["cache"]}
    return {"batches": after["batches"] - before["batches"], "samples": after["samples"] - before["samples"],
            "seconds": seconds, "cache": cache, "decoded_rows": after["decoded_rows"] - before["decoded_rows"]}


def _run_loader(loader: Any, seconds: float, consume: Any, progress: bool) -> tuple[dict[str, Any], float, int]:
    bar = None
    if progress:
        import tqdm

        bar = tqdm.tqdm(total=round(seconds, 1), unit="s", desc="measuring the loader", file=sys.stderr,
                        bar_format="{desc}: {bar} {n:.1f}/{total:.1f} s")
    batches = _batches(loader)
    out_bytes = 0
    try:
        for _ in range(WARMUP_BATCHES):  # maps, thread pools, the first downloads
            batch = next(batches)
            out_bytes = max(out_bytes, _nbytes(batch))
            consume(batch)
            del batch
        before = loader.stats()
        start = last = time.perf_counter()
        while True:
            consume(next(batches))
            now = time.perf_counter()
            if bar is not None and now - last > 0.1:
                bar.update(min(now - start, seconds) - bar.n)
                last = now
            if now - start >= seconds:
                break
        wall = time.perf_counter() - start
        after = loader.stats()
    finally:
        batches.close()
        if bar is not None:
            bar.update(bar.total - bar.n)
            bar.close()
    return _delta(after, before), wall, out_bytes


def _rate_of(loader: Any, seconds: float, consume: Any) -> float | None:
    """Batches per second of ``loader`` measured as the diagnosis is (closed after)."""
    try:
        delta, wall, _ = _run_loader(loader, seconds, consume, False)
    finally:
        loader.close()
    return delta["batches"] / wall if delta["batches"] else None


def _rate_without_transform(make: Any, seconds: float, consume: Any) -> float | None:
    """Batches per second of the same loader without the user's transform. Measured, not modelled: while a slow
    transform spaces batches out, every other stage runs cold (thread pools asleep, caches evicted) and takes
    about twice what it takes at full pace, so the stage times of the bound run overstate what remains."""
    return _rate_of(make(with_transform=False), seconds, consume)


def _rate_with_threads(make: Any, threads: int, seconds: float, consume: Any) -> float | None:
    """Batches per second of the same loader on ``threads`` threads. Measured, not modelled: the decode ceiling's
    scaling (a few dozen rows through simplejpeg) moved by 30% between runs on a shared machine, and the loader's
    own decode (and its producer thread) does not scale as a bare decoder does."""
    return _rate_of(make(threads=threads), seconds, consume)


def _cached_rows(path: str, cache_dir: Any, cache_limit: Any) -> list[int]:
    """The rows of a URL dataset whose shards are in the local cache now."""
    from tbl_loader.source import open_remote

    with open_remote(path, cache_dir=cache_dir, cache_limit=cache_limit) as remote:
        rows, start = [], 0
        for entry in remote.shard_entries:
            count = int(entry["rows"] or 0)
            if count and (remote.local_dir / entry["file"]).is_file():
                rows.extend(range(start, start + count))
            start += count
    return rows


def _warm_rate(make: Any, rows: list[int], batch_size: int, epoch_batches: int, seconds: float,
               consume: Any) -> float | None:
    """Batches per second of the same loader over ``rows`` (shards already cached: nothing to download), as it
    would run over the whole dataset (``epoch_batches`` batches a pass), or None when they hold too few batches to
    measure. What every epoch runs at once the cache holds the dataset: the cold run's other stages are no guide
    to it, since its downloads contend with them (for the GIL, the cores).

    The cached rows make short passes (a quarter of 1,500 rows: 11 batches of 32), and each pass starts with a
    fixed cost (its order, its producer thread, its shard schedule) that the whole dataset spreads over more
    batches: measured as is, a pass's start cost 0.1 ms a batch against a 0.5 ms batch, and the prediction came
    out 15-25% low. So the first batch of each pass is timed apart, and its excess over a batch within a pass is
    spread over ``epoch_batches``."""
    if len(rows) < (WARMUP_BATCHES + 4) * batch_size:
        return None
    loader = make(rows)
    warmup = passes = inner = 0
    first = within = 0.0  # seconds getting the first batch of each timed pass, and the other batches
    start = None  # set after the warm-up batches (maps, thread pools)
    try:
        while start is None or time.perf_counter() - start < seconds:
            t = time.perf_counter()
            for k, batch in enumerate(loader):
                consume(batch)
                now = time.perf_counter()
                if start is None:
                    warmup += 1
                    if warmup == WARMUP_BATCHES:
                        start = now
                elif k == 0:
                    first += now - t
                    passes += 1
                else:
                    within += now - t
                    inner += 1
                t = now
                if start is not None and inner and now - start >= seconds:
                    return _pass_corrected_rate(within, inner, first, passes, epoch_batches)  # even within a pass
            loader.set_epoch(loader.epoch + 1)
    finally:
        loader.close()
    return _pass_corrected_rate(within, inner, first, passes, epoch_batches)


def _pass_corrected_rate(within: float, inner: int, first: float, passes: int, epoch_batches: int) -> float | None:
    """Batches per second from ``inner`` batches within passes (``within`` seconds) and the first batches of
    ``passes`` passes (``first`` seconds), the excess of a pass's first batch spread over ``epoch_batches``."""
    if not inner:
        return None
    per_batch = within / inner
    pass_start = max(first / passes - per_batch, 0.0) if passes else 0.0
    return 1.0 / (per_batch + pass_start / max(epoch_batches, 1))


def _read_ceiling(files: list[Path]) -> dict[str, Any]:
    """Bytes per second reading the dataset's files as the OS serves them now (page cache or disk)."""
    done, buf = 0, bytearray(8 << 20)
    t0 = time.perf_counter()
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while done < READ_SAMPLE:
                n = fh.readinto(buf)
                if not n:
                    break
                done += n
        if done >= READ_SAMPLE:
            break
    elapsed = max(time.perf_counter() - t0, 1e-9)
    return {"bytes_per_s": done / elapsed, "bytes": done}


def _decode_ceiling(path: str, cores: int) -> dict[str, Any]:
    """JPEG rows per second decoding (full scale) a sample of the dataset's rows on one thread and on every core."""
    import simplejpeg

    with tbl_format.open(path) as ds:
        rows = list(range(min(DECODE_SAMPLE, len(ds))))
        blobs = [bytes(b) for b in ds.values("image", rows)]

    def decode(blob: bytes) -> Any:
        return simplejpeg.decode_jpeg(blob, "RGB")

    rates = {}
    for threads in (1, cores):
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(decode, blobs[:threads]))  # threads started
            t0 = time.perf_counter()
            list(pool.map(decode, blobs))
            rates[threads] = len(blobs) / max(time.perf_counter() - t0, 1e-9)
    return {"rows_per_s": rates[cores], "threads": cores, "one_thread_rows_per_s": rates[1]}


def _nbytes(batch: Any) -> int:
    """Bytes of the arrays / tensors of a batch (what the memory-copy ceiling copies)."""
    if isinstance(batch, dict):
        return sum(_nbytes(v) for v in batch.values())
    if isinstance(batch, (tuple, list)):
        return sum(_nbytes(v) for v in batch)
    return int(getattr(batch, "nbytes", 0) or 0)


def _advice(bound: str, per_batch: dict[str, float], *, storage: str, threads: int, cores: int,
            decode_ceiling: dict[str, Any] | None, batch_size: int, is_remote: bool,
            warm_rate: float | None = None, untransformed_rate: float | None = None,
            all_cores_rate: float | None = None) -> list[dict[str, Any]]:
    """What to change for the ``bound`` stage, first the change with the best-supported prediction.

    ``warm_rate``: for a URL bound by its downloads, the batches per second the same loader measured over the
    rows already cached (the prediction for a cache that holds the dataset), None when not measured.
    ``untransformed_rate``: for a loader bound by its transform, the batches per second the same loader measured
    without it, None when not measured. ``all_cores_rate``: for a loader bound by decode or the kernel on fewer
    threads than cores, the batches per second the same loader measured on every core, None when not measured."""
    producer = sum(per_batch[s] for s in PRODUCER_STAGES)
    consumer = sum(per_batch[s] for s in CONSUMER_STAGES)

    def predicted(**new: float) -> float:
        """Batches per second once the stages named take the seconds given (the slower side sets the pace)."""
        p = producer + sum(v - per_batch[k] for k, v in new.items() if k in PRODUCER_STAGES)
        c = consumer + sum(v - per_batch[k] for k, v in new.items() if k in CONSUMER_STAGES)
        return 1.0 / max(p, c, 1e-9)

    out: list[dict[str, Any]] = []
    if bound == "decode":
        if threads < cores:
            # Scaled as this machine's decode scaled from one thread to every core (measured in this run).
            scaling = cores / threads
            if decode_ceiling is not None:
                scaling = min(scaling, decode_ceiling["rows_per_s"] / decode_ceiling["one_thread_rows_per_s"])
            scaling = max(scaling, 1.0)  # the kernel pass runs on the same threads: it scales alike
            modelled = predicted(decode=per_batch["decode"] / scaling, kernel=per_batch["kernel"] / scaling)
            out.append({"change": f"use {cores} loader threads instead of {threads} (one per core here)",
                        "predicted_batches_per_s": all_cores_rate if all_cores_rate is not None else modelled})
        out.append({"change": "store decoded pixels: tbl convert --max-size N --store raw (or --size S), "
                              "no decode when serving", "predicted_batches_per_s": predicted(decode=0.0)})
    elif bound == "kernel":
        if threads < cores:
            modelled = predicted(kernel=per_batch["kernel"] * threads / cores)
            out.append({"change": f"use {cores} loader threads instead of {threads} (one per core here)",
                        "predicted_batches_per_s": all_cores_rate if all_cores_rate is not None else modelled})
        out.append({"change": "serve dtype uint8 (normalize on the GPU) or a smaller output size",
                    "predicted_batches_per_s": None})
    elif bound == "transform":
        out.append({"change": "make the transform cheaper, or move its work to device_transform (runs after the "
                              "copy to the GPU); without it",
                    "predicted_batches_per_s": untransformed_rate if untransformed_rate is not None
                    else predicted(transform=0.0)})
    elif bound == "read":
        if is_remote:
            out.append({"change": "raise cache_limit to hold the dataset (later epochs read the cache), or raise "
                                  "the store's bandwidth",
                        "predicted_batches_per_s": warm_rate if warm_rate is not None else predicted(read=0.0)})
        else:
            out.append({"change": "the files are read from disk: keep the dataset in RAM (page cache) or use "
                                  "shuffle='block' for datasets larger than memory", "predicted_batches_per_s": None})
    elif bound == "device_copy":
        out.append({"change": "pin_memory=True (copies from pinned buffers overlap the step)",
                    "predicted_batches_per_s": None})
    else:  # consumer: a faster loader changes nothing, the training step keeps its pace
        out.append({"change": "nothing on the data side: the loader keeps ahead of the training step",
                    "predicted_batches_per_s": predicted()})
    if storage == "pytree" and bound in ("kernel", "read"):
        out.append({"change": "select fewer leaves (leaves=[...])", "predicted_batches_per_s": None})
    return out


def diagnose(path: str, *, batch_size: int = 64, image_size: int | None = None, threads: int | None = None,
             dtype: str = "float32", prefetch: int = 2, shuffle: Any = True, seconds: float = 5.0, transform: Any = None,
             consume: Any = None, cache_dir: Any = None, cache_limit: Any = None,
             progress: bool = False) -> dict[str, Any]:
    """Measure ``path``'s loader and this machine's ceilings in one run; the report (schema ``tbl.doctor/1``).

    Args:
        path: a ``.tbl`` file, a dataset folder or a URL.
        batch_size, image_size, threads, dtype, prefetch, shuffle: the loader's settings (``image_size``: the
            random-resized-crop output side; default the stored size, 224 for variable-size images).
        seconds: how long the loader is measured (after two warm-up batches).
        transform: the user's ``transform`` (image datasets), run as the loader would.
        consume: called on every batch, standing for the training step (default: touch one element).
        cache_dir, cache_limit: the shard cache of a URL.
        progress: a progress bar on stderr while measuring.
    """
    from tbl_loader.source import is_url

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise DoctorError(f"must be an int >= 1, got {batch_size!r}", "batch_size")
    if not seconds > 0:
        raise DoctorError(f"must be > 0, got {seconds!r}", "seconds")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise DoctorError(f"must be an int >= 1 or None, got {threads!r}", "threads")
    path = str(path)
    remote = is_url(path)
    remote_options = {"cache_dir": cache_dir, "cache_limit": cache_limit} if remote else {}
    info = _describe(path, remote, cache_dir, cache_limit)
    storage = info["storage"]
    cores = _cores()
    def make(rows: Any = None, with_transform: bool = True, threads: int | None = threads) -> Any:
        # Over cached rows (the warm measure) nothing is downloaded, so a block order, which only keeps reads
        # within a few shards for the downloads' sake, gives way to a plain shuffle (block does not take rows=).
        order = True if rows is not None and shuffle == "block" else shuffle
        return _make_loader(path, storage, batch_size=batch_size, image_size=image_size, threads=threads, dtype=dtype,
                            prefetch=prefetch, shuffle=order, transform=transform if with_transform else None,
                            remote=remote_options, rows=rows)

    loader = make()
    try:
        delta, wall, out_bytes = _run_loader(loader, seconds, consume or _touch, progress)
    finally:
        loader.close()
    n = max(delta["batches"], 1)
    s = delta["seconds"]
    per_batch = {k: s[k] / n for k in PRODUCER_STAGES}
    per_batch["device_copy"] = (s["device_copy"] + s["device_transform"]) / n
    per_batch["consumer"] = max(0.0, wall - s["consumer_wait"] - s["device_copy"] - s["device_transform"]) / n
    producer = sum(per_batch[k] for k in PRODUCER_STAGES)
    consumer = sum(per_batch[k] for k in CONSUMER_STAGES)
    if producer >= consumer:
        bound = max(PRODUCER_STAGES, key=lambda k: per_batch[k])
    else:
        bound = max(CONSUMER_STAGES, key=lambda k: per_batch[k])
    measured = delta["batches"] / wall
    # Each prediction measured again runs as long as the diagnosis: a shorter window on a shared machine moved
    # the fetch prediction by 30% from one run to the next.
    warm = None  # a URL bound by its downloads: the same loader measured again over what is cached now
    if remote and bound == "read":
        warm = _warm_rate(make, _cached_rows(path, cache_dir, cache_limit), batch_size,
                          -(-info["rows"] // batch_size), seconds,
                          consume or _touch)
    untransformed = None  # bound by the user's transform: the same loader measured again without it
    if bound == "transform" and transform is not None:
        untransformed = _rate_without_transform(make, seconds, consume or _touch)
    used_threads = threads if threads is not None else _kernel_threads()
    more_threads = None  # bound by decode or the kernel on fewer threads than cores: measured again on every core
    if bound in ("decode", "kernel") and used_threads < cores:
        more_threads = _rate_with_threads(make, cores, seconds, consume or _touch)

    ceilings: dict[str, Any] = {}
    copy_gbps = memory_copy_bandwidth(max(out_bytes, 64 << 20), repeats=3)
    ceilings["memory_copy"] = {"bytes_per_s": copy_gbps * 1e9,
                               "batches_per_s": copy_gbps * 1e9 / out_bytes if out_bytes else None}
    stored_per_sample = info["stored_bytes"] / max(info["rows"], 1)
    if remote:
        c = delta["cache"]
        speed = c["bytes_downloaded"] / c["download_seconds"] if c["download_seconds"] > 0 else None
        ceilings["read"] = {"what": "download", "bytes_per_s": speed}
    else:
        read = _read_ceiling(info["files"])
        ceilings["read"] = {"what": "files", "bytes_per_s": read["bytes_per_s"]}
    speed = ceilings["read"]["bytes_per_s"]
    ceilings["read"]["batches_per_s"] = speed / (stored_per_sample * batch_size) if speed and stored_per_sample else None
    decode = None
    if storage == "jpeg":
        decode = _decode_ceiling(path, cores) if not remote else None
        if decode is not None:
            ceilings["decode"] = {**decode, "batches_per_s": decode["rows_per_s"] / batch_size}
    for ceiling in ceilings.values():
        b = ceiling.get("batches_per_s")
        ceiling["fraction_reached"] = measured / b if b else None
    return {
        "schema": SCHEMA,
        "dataset": path,
        "loader": {"kind": "pytree" if storage == "pytree" else "image", "storage": storage,
                   "batch_size": batch_size, "image_size": image_size, "threads": used_threads, "dtype": dtype,
                   "prefetch": prefetch, "shuffle": shuffle, "transform": transform is not None},
        "machine": {"cores": cores},
        "measured": {"seconds": wall, "batches": delta["batches"], "batches_per_s": measured,
                     "samples_per_s": delta["samples"] / wall, "cache": delta["cache"],
                     "warm_batches_per_s": warm, "untransformed_batches_per_s": untransformed,
                     "all_cores_batches_per_s": more_threads},
        "per_batch_seconds": per_batch,
        "ceilings": ceilings,
        "bound": bound,
        "advice": _advice(bound, per_batch, storage=storage, threads=used_threads, cores=cores,
                          decode_ceiling=decode, batch_size=batch_size, is_remote=remote, warm_rate=warm,
                          untransformed_rate=untransformed, all_cores_rate=more_threads),
    }


def _kernel_threads() -> int:
    import tbl_kernels

    return int(tbl_kernels.get_num_threads())


def render(report: dict[str, Any]) -> str:
    """The report as text for a terminal."""
    m, lo = report["measured"], report["loader"]
    lines = [f"dataset:  {report['dataset']} ({lo['storage']} storage)",
             f"loader:   batch {lo['batch_size']}, image size {lo['image_size'] or 'stored'}, {lo['threads']} "
             f"thread(s), {lo['dtype']}, prefetch {lo['prefetch']}; {report['machine']['cores']} core(s) here",
             f"measured: {m['batches_per_s']:,.1f} batches/s ({m['samples_per_s']:,.0f} samples/s) over "
             f"{m['seconds']:.1f} s, {m['batches']} batches",
             "time per batch:"]
    for stage, value in report["per_batch_seconds"].items():
        mark = "  <- bound" if stage == report["bound"] else ""
        lines.append(f"  {stage:<12} {value * 1e3:9.3f} ms{mark}")
    lines.append("ceilings of this machine (same run):")
    for name, c in report["ceilings"].items():
        b, f = c.get("batches_per_s"), c.get("fraction_reached")
        where = f"{b:,.1f} batches/s, loader at {f:.0%}" if b and f is not None else "not measured"
        lines.append(f"  {name:<12} {where}")
    lines.append(f"bound: {report['bound']}")
    for a in report["advice"]:
        gain = a["predicted_batches_per_s"]
        lines.append(f"  - {a['change']}" + (f": predicted {gain:,.1f} batches/s" if gain else ""))
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", metavar="DATASET", help="a .tbl file, a dataset folder or a URL")
    p.add_argument("--batch-size", type=int, default=64, metavar="B", help="batch size (default 64)")
    p.add_argument("--image-size", type=int, default=None, metavar="S",
                   help="random-resized-crop output side (default: the stored size; 224 for variable-size images)")
    p.add_argument("--threads", type=int, default=None, metavar="T", help="loader threads (default: all cores)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16", "uint8"),
                   help="output dtype (default float32)")
    p.add_argument("--prefetch", type=int, default=2, metavar="P", help="batches prepared ahead (default 2)")
    p.add_argument("--shuffle", choices=tuple(SHUFFLES), default="global",
                   help="global (default), block (shards, then samples within a window) or none")
    p.add_argument("--seconds", type=float, default=5.0, metavar="N", help="how long to measure (default 5)")
    p.add_argument("--cache-dir", default=None, metavar="DIR", help="shard cache of a URL")
    p.add_argument("--cache-limit", default=None, metavar="BYTES", help="shard cache size, e.g. 50GB")
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema tbl.doctor/1)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    try:
        report = diagnose(args.dataset, batch_size=args.batch_size, image_size=args.image_size,
                          threads=args.threads, dtype=args.dtype, prefetch=args.prefetch,
                          shuffle=SHUFFLES[args.shuffle], seconds=args.seconds,
                          cache_dir=args.cache_dir, cache_limit=args.cache_limit, progress=not args.quiet)
    except DoctorError as exc:
        print(f"tbl doctor: {args.dataset}: {exc.for_cli()}", file=sys.stderr)
        return 2
    except (tbl_format.FormatError, OSError, ValueError, TypeError) as exc:
        print(f"tbl doctor: {args.dataset}: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else render(report))
    return 0


def register_doctor(subparsers: Any) -> None:
    """Entry point of the ``tbl.commands`` group: adds ``tbl doctor``."""
    p = subparsers.add_parser("doctor", help="name the stage that bounds the loader on this machine",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tbl doctor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
