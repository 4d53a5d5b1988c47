"""Remote serving: cold first epoch and warm epochs after it from a loopback S3 server, TBL vs litdata.

    python -m tbl_bench.remote [--images 8000] [--size 96] [--shard-rows 250] [--epochs 8] [--warm-seconds 5]
                           [--rounds 3]

Needs ``tbl-loader[remote]``, ``moto[server]`` and (for the peer) ``litdata``.
Starts moto's S3 server on 127.0.0.1, writes the same random uint8 images once
as a TBL dataset and once as a litdata dataset (``litdata.optimize``, chunks of
about the TBL shard's size), uploads both to the server, then runs each
configuration in its own subprocess with a fresh cache:

- ``TBL local``: ImageLoader on the local TBL copy (the warm reference);
- ``TBL remote``: ImageLoader on the S3 URL, ``shuffle="block"``;
- ``litdata remote``: ``StreamingDataset`` + ``StreamingDataLoader`` on the S3 URL,
  ``shuffle=True`` (its chunk-then-sample shuffle), ``num_workers=0``.

Every configuration yields uint8 HWC batches of 128 and touches every batch.
Each child runs at least ``--epochs`` epochs: epoch 1 is cold (nothing
cached), and warm is the images of the epochs after it over their total time,
with warm epochs added until they have taken ``--warm-seconds`` (one figure
over several seconds, not the median of sub-second epochs, which the load of a
shared machine scatters). The three configurations run one after the other
in each of ``--rounds`` rounds (interleaved, so a change of the machine's load
reaches all three; each round starts with the next one, so none always runs
first); the ratios are taken within a round and the report gives each round's
and their median. Images/s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
import numpy as np
kind, where, cache, opts, epochs = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
warm_seconds = float(sys.argv[6])
rates = []  # (images, seconds) of each epoch

def more(epoch):  # the cold epoch, then warm ones: at least `epochs` in all and `warm_seconds` of warm ones
    return epoch < epochs or sum(t for _, t in rates[1:]) < warm_seconds
if kind.startswith("tbl"):
    from tbl_loader import ImageLoader
    extra = {} if kind == "tbl-local" else {"cache_dir": cache, "storage_options": opts["tbl"]}
    loader = ImageLoader(where, batch_size=128, shuffle="block", seed=0, backend="numpy", dtype="uint8",
                         layout="HWC", **extra)
    epoch = 0
    while more(epoch):
        loader.set_epoch(epoch)
        t, n = time.perf_counter(), 0
        for b in loader:
            n += int(np.asarray(b.images)[:, 0, 0, 0].shape[0])
        rates.append((n, time.perf_counter() - t))
        epoch += 1
    loader.close()
else:
    from litdata import StreamingDataLoader, StreamingDataset
    import litdata.streaming.downloader as lit_downloader
    from obstore.store import S3Store
    build = lit_downloader._build_obstore_s3_store
    def with_http(bucket, client):  # the loopback server speaks plain HTTP (real S3 is HTTPS)
        store = build(bucket, client)
        config = {k: v for k, v in store.config.items() if k not in ("bucket", "aws_bucket")}
        return S3Store(bucket, config=config, client_options={"allow_http": True},
                       credential_provider=store.credential_provider)
    lit_downloader._build_obstore_s3_store = with_http
    ds = StreamingDataset(where, cache_dir=cache, shuffle=True, seed=0, storage_options=opts["litdata"])
    dl = StreamingDataLoader(ds, batch_size=128, num_workers=0)
    epoch = 0
    while more(epoch):
        t, n = time.perf_counter(), 0
        for b in dl:
            n += int(np.asarray(b["image"])[:, 0, 0, 0].shape[0])
        rates.append((n, time.perf_counter() - t))
        epoch += 1
print(json.dumps(rates))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _litdata_item(item: tuple[str, int]) -> dict:  # module level: litdata's workers import it
    import numpy as np

    path, i = item
    return {"image": np.array(np.load(path, mmap_mode="r")[i]), "label": i}


def _ratios(results: dict) -> str:
    parts = []
    if "TBL remote" in results and "litdata remote" in results:
        parts.append(f"cold TBL/litdata {results['TBL remote'][0] / results['litdata remote'][0]:.2f}x")
    if "TBL remote" in results and "TBL local" in results:
        parts.append(f"warm TBL remote/local {results['TBL remote'][1] / results['TBL local'][1]:.2f}x")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tbl_bench.remote", description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=8000)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--shard-rows", type=int, default=250)
    ap.add_argument("--epochs", type=int, default=8, help="epochs per child at least: the first cold, the rest warm")
    ap.add_argument("--warm-seconds", type=float, default=5.0,
                    help="each child runs warm epochs until they have taken at least this long in all")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the three configurations, interleaved")
    args = ap.parse_args(argv)
    if args.epochs < 2 or args.rounds < 1:
        ap.error("need --epochs >= 2 and --rounds >= 1")

    import boto3
    import numpy as np
    from litdata import optimize
    from moto.server import ThreadedMotoServer

    import tbl_format
    from tbl_loader import upload_dataset

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    keys = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}
    tbl_opts = {**keys, "region": "us-east-1", "endpoint": endpoint, "client_options": {"allow_http": True}}
    lit_opts = {**keys, "endpoint_url": endpoint, "region_name": "us-east-1"}
    work = Path(tempfile.mkdtemp(prefix="tbl-remote-bench-"))
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **keys)
        s3.create_bucket(Bucket="bench")
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (args.images, args.size, args.size, 3), dtype=np.uint8)
        np.save(work / "images.npy", images)
        tbl_path = tbl_format.write(({"image": images[i], "label": np.int64(i)} for i in range(args.images)),
                                    work / "tbl", shard_rows=args.shard_rows)
        upload_dataset(tbl_path, "s3://bench/tbl/", storage_options=tbl_opts)
        shard_mb = max(p.stat().st_size for p in tbl_path.glob("*.tbl")) / 1e6
        optimize(fn=_litdata_item, inputs=[(str(work / "images.npy"), i) for i in range(args.images)], output_dir=str(work / "lit"),
                 chunk_bytes=f"{max(1, int(shard_mb))}MB", num_workers=1)
        for p in (work / "lit").iterdir():
            s3.upload_file(str(p), "bench", f"lit/{p.name}")
        tbl_mb = sum(p.stat().st_size for p in tbl_path.iterdir()) / 1e6
        lit_mb = sum(p.stat().st_size for p in (work / "lit").iterdir()) / 1e6
        print(f"{args.images} images {args.size}x{args.size}x3 uint8; TBL {tbl_mb:.0f} MB, litdata {lit_mb:.0f} MB "
              f"on the loopback S3 server")
        opts = json.dumps({"tbl": tbl_opts, "litdata": lit_opts})
        configs = (("TBL local", "tbl-local", str(tbl_path)), ("TBL remote", "tbl-remote", "s3://bench/tbl/"),
                   ("litdata remote", "litdata", "s3://bench/lit/"))
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "bench",
               "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_ALLOW_HTTP": "true"}  # litdata's own obstore store reads it (plain-HTTP loopback server)
        rounds = []
        for number in range(1, args.rounds + 1):
            results = {}
            shift = (number - 1) % len(configs)  # each round starts with another configuration
            for label, kind, where in configs[shift:] + configs[:shift]:
                cache = tempfile.mkdtemp(dir=work, prefix="cache-")  # fresh: epoch 1 is cold
                out = subprocess.run([sys.executable, "-c", CHILD, kind, where, cache, opts, str(args.epochs), str(args.warm_seconds)],
                                     capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    print(f"round {number} {label}: failed:\n{out.stderr[-3000:]}")
                    continue
                epochs = json.loads(out.stdout.strip().splitlines()[-1])
                warm_n, warm_s = sum(n for n, _ in epochs[1:]), sum(t for _, t in epochs[1:])
                results[label] = (epochs[0][0] / epochs[0][1], warm_n / warm_s, warm_s, len(epochs) - 1)
                shutil.rmtree(cache, ignore_errors=True)
            rounds.append(results)
            print(f"round {number}:")
            for label, (cold, warm, warm_s, warm_epochs) in results.items():
                print(f"  {label:16s} cold {cold:9.0f} images/s   warm {warm:9.0f} images/s "
                      f"({warm_epochs} epochs, {warm_s:.1f} s)")
            print("  " + _ratios(results))
        cold_ratio = [r["TBL remote"][0] / r["litdata remote"][0] for r in rounds
                      if "TBL remote" in r and "litdata remote" in r]
        warm_ratio = [r["TBL remote"][1] / r["TBL local"][1] for r in rounds if "TBL remote" in r and "TBL local" in r]
        if cold_ratio:
            print(f"cold TBL remote / litdata remote: median {statistics.median(cold_ratio):.2f}x over "
                  f"{len(cold_ratio)} rounds ({', '.join(f'{x:.2f}' for x in cold_ratio)})")
        if warm_ratio:
            print(f"warm TBL remote / TBL local: median {statistics.median(warm_ratio):.2f}x over "
                  f"{len(warm_ratio)} rounds ({', '.join(f'{x:.2f}' for x in warm_ratio)})")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
