"""Does `tbl doctor` tell the truth? Four loaders built to be bound by four different stages, diagnosed, then
run again with the doctor's top suggestion applied: the stage it names, and its predicted gain against the
gain measured.

    python -m tbl_bench.doctor_check --data-dir DIR [--images 1500] [--seconds 6] [--bandwidth-mb 8]

The cases (real photos, converted once into DIR and reused):

- ``decode``: the photos as they are (JPEG storage) served at 224 by 1 thread; the suggestion: one thread per core.
- ``consumer``: float32 224 x 224 output read by a training step that sleeps; the suggestion: nothing on the
  data side, so serving a cheaper output (uint8) must not change the pace.
- ``fetch``: the photos at 160 px in 16 shards at a URL on a loopback S3 server behind a link of
  ``--bandwidth-mb`` MB/s, through a cache of a quarter of it; the suggestion: a cache that holds the dataset
  (measured on a warm cache, as every epoch after the first reads it). At 96 px a batch's work (0.3 ms) was
  smaller than the loader's fixed cost per batch, and the prediction measured over the cached quarter
  (a ``rows=`` subset, which costs a little more per batch) came out at half the full run's pace.
- ``transform``: a user transform that sleeps; the suggestion: without it.

Every diagnosis and every run after the change is a subprocess of its own (``--child``), one at a time; the
S3 server runs in this process. The gain is the batches per second after the change over those the
diagnosis measured; the prediction error is ``predicted gain / measured gain - 1`` (goal: within 25%).
This machine is shared: load changes both runs of a case, and one round is a quick look.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main"]

CASES = ("decode", "consumer", "fetch", "transform")
BATCH = 32
CONSUMER_SLEEP = 0.12  # seconds per training step: several times what the loader needs for a batch
TRANSFORM_SLEEP = 0.10
GOAL = 0.25


def _prepare(data_dir: Path, images: int) -> dict[str, Path]:
    """The photos as a TAR, and three conversions of it (reused when present)."""
    from tbl_bench.data import make_image_tar
    from tbl_loader import convert

    data_dir.mkdir(parents=True, exist_ok=True)
    tar = data_dir / f"photos-{images}.tar"
    if not tar.exists():
        make_image_tar(tar, images, num_classes=100, seed=0)
    paths = {"jpeg": data_dir / f"jpeg-{images}", "fixed224": data_dir / f"fixed224-{images}",
             "fixed160": data_dir / f"fixed160-{images}"}
    settings = {"jpeg": {"max_size": 512, "store": "jpeg"}, "fixed224": {"size": 224},
                "fixed160": {"size": 160, "shard_rows": max(1, images // 16)}}
    for name, path in paths.items():
        if not (path / "manifest.json").exists() and not path.is_file():
            convert(tar, path, progress=False, **settings[name])
    return paths


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """One diagnosis in this process: the report of ``tbl_bench.doctor.diagnose``."""
    from tbl_bench.doctor import diagnose

    kwargs = dict(spec["kwargs"])
    if spec.get("consume_sleep"):
        pause = spec["consume_sleep"]
        kwargs["consume"] = lambda batch: time.sleep(pause)
    if spec.get("transform_sleep"):
        pause = spec["transform_sleep"]

        def transform(batch: Any) -> Any:
            time.sleep(pause)
            return batch

        kwargs["transform"] = transform
    if spec.get("warm"):  # the cache filled first, as a run's first epoch leaves it
        from tbl_loader.source import open_remote

        with open_remote(spec["path"], cache_dir=kwargs.get("cache_dir"), cache_limit=kwargs.get("cache_limit")) as r:
            r.ensure_all()
    return diagnose(spec["path"], **kwargs)


def _run(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tbl_bench.doctor_check", "--child", json.dumps(spec)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{spec['case']}: the child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _specs(case: str, paths: dict[str, Path], url: str, cache: str, remote_bytes: int, seconds: float,
           cores: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The stage the case is built to be bound by, its diagnosis, and its run with the top suggestion applied."""
    base = {"batch_size": BATCH, "seconds": seconds}
    if case == "decode":
        before = {"path": str(paths["jpeg"]), "kwargs": {**base, "image_size": 224, "threads": 1}}
        after = {"path": str(paths["jpeg"]), "kwargs": {**base, "image_size": 224, "threads": cores}}
        return "decode", before, after
    if case == "consumer":
        kwargs = {**base, "image_size": 224, "dtype": "float32"}
        before = {"path": str(paths["fixed224"]), "kwargs": kwargs, "consume_sleep": CONSUMER_SLEEP}
        after = {**before, "kwargs": {**kwargs, "dtype": "uint8"}}
        return "consumer", before, after
    if case == "transform":
        before = {"path": str(paths["fixed224"]), "kwargs": base, "transform_sleep": TRANSFORM_SLEEP}
        return "transform", before, {"path": str(paths["fixed224"]), "kwargs": base}
    remote = {**base, "shuffle": "block", "cache_dir": cache}
    before = {"path": url, "kwargs": {**remote, "cache_limit": remote_bytes // 4}}
    after = {"path": url, "kwargs": {**remote, "cache_limit": None}, "warm": True}
    return "read", before, after


def _check(case: str, expected: str, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    top = before["advice"][0]
    rate = before["measured"]["batches_per_s"]
    predicted = top["predicted_batches_per_s"]
    measured = after["measured"]["batches_per_s"]
    row = {"case": case, "expected": expected, "named": before["bound"], "batches_per_s": rate,
           "suggestion": top["change"], "predicted_batches_per_s": predicted, "after_batches_per_s": measured,
           "predicted_gain": predicted / rate if predicted else None, "measured_gain": measured / rate}
    row["error"] = row["predicted_gain"] / row["measured_gain"] - 1 if predicted else None
    for name, report in (("before", before), ("after", after)):  # where the time went, per batch
        row[f"{name}_ms_per_batch"] = {k: round(v * 1e3, 3) for k, v in report["per_batch_seconds"].items()}
    row["ok"] = row["named"] == expected and row["error"] is not None and abs(row["error"]) <= GOAL
    return row


def _print(rows: list[dict[str, Any]]) -> None:
    print("| case | built to be bound by | doctor names | batches/s | top suggestion | predicted gain "
          "| measured gain | error |")
    print("|---|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        pg = f"{r['predicted_gain']:.2f}x" if r["predicted_gain"] else "-"
        err = f"{r['error']:+.0%}" if r["error"] is not None else "-"
        print(f"| {r['case']} | {r['expected']} | {r['named']} | {r['batches_per_s']:.1f} | {r['suggestion']} "
              f"| {pg} | {r['measured_gain']:.2f}x | {err} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.doctor_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, help="where the photos and their conversions are kept")
    p.add_argument("--images", type=int, default=1500)
    p.add_argument("--seconds", type=float, default=6.0, help="each diagnosis's measured time")
    p.add_argument("--bandwidth-mb", type=float, default=8.0, help="the fetch case's link, MB/s")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child is not None:
        print(json.dumps(_child(json.loads(args.child))))
        return 0
    if args.data_dir is None:
        p.error("--data-dir is required")
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        p.error(f"unknown cases {unknown}; the cases are {list(CASES)}")
    paths = _prepare(args.data_dir, args.images)
    from tbl_bench.remote import KEYS, _S3Server
    from tbl_loader import upload_dataset

    server = _S3Server(bytes_per_s=args.bandwidth_mb * 1e6)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEYS["aws_access_key_id"],
           "AWS_SECRET_ACCESS_KEY": KEYS["aws_secret_access_key"], "AWS_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": server.endpoint, "AWS_ALLOW_HTTP": "true"}
    work = Path(tempfile.mkdtemp(prefix="doctor-check-"))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    rows = []
    try:
        url = "s3://doctor/fixed160/"
        if "fetch" in cases:
            import boto3

            boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1", **KEYS).create_bucket(
                Bucket="doctor")
            upload_dataset(paths["fixed160"], url, storage_options={
                **KEYS, "region": "us-east-1", "endpoint": server.endpoint, "client_options": {"allow_http": True}})
        remote_bytes = sum(f.stat().st_size for f in paths["fixed160"].glob("*.tbl"))
        for case in cases:
            cache = str(work / f"cache-{case}")
            expected, before, after = _specs(case, paths, url, cache, remote_bytes, args.seconds, cores)
            timeout = 60 + 20 * args.seconds + (remote_bytes / (args.bandwidth_mb * 1e6) if case == "fetch" else 0)
            first = _run({**before, "case": case}, env, timeout)
            second = _run({**after, "case": case, "kwargs": {**after["kwargs"], "cache_dir": cache + "-after"}
                           if case == "fetch" else after["kwargs"]}, env, timeout)
            rows.append(_check(case, expected, first, second))
            print(f"{case}: {rows[-1]}", file=sys.stderr)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"tbl doctor on {cores} core(s), {args.images} photos, {args.seconds:g} s per diagnosis, "
          f"fetch link {args.bandwidth_mb:g} MB/s; one round")
    _print(rows)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
