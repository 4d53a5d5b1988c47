"""Download throughput of shard-sized objects from a loopback S3 server: obstore vs fsspec + s3fs.

Starts moto's ThreadedMotoServer on 127.0.0.1 (a free port), uploads ``--objects``
objects of ``--size-mb`` MiB, then, for each client in its own subprocess,
downloads all of them to files ``--repeat`` times (sequentially and with 4 threads)
and reports the median MiB/s. Run: python tools/bench_object_stores.py
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

CLIENT = r'''
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor
which, endpoint, n, repeat, outdir = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
keys = [f"shard-{i:03d}.tbl" for i in range(n)]
if which == "obstore":
    import obstore
    from obstore.store import S3Store
    store = S3Store("bench", endpoint=endpoint, region="us-east-1", aws_access_key_id="k", aws_secret_access_key="s",
                    client_options={"allow_http": True})
    def get(key, path):
        r = obstore.get(store, key)
        with open(path, "wb") as f:
            for chunk in r.stream(min_chunk_size=8 << 20):
                f.write(chunk)
else:
    import s3fs
    fs = s3fs.S3FileSystem(key="k", secret="s", endpoint_url=endpoint, client_kwargs={"region_name": "us-east-1"})
    def get(key, path):
        fs.get_file(f"bench/{key}", path)
results = {}
for mode, workers in (("sequential", 1), ("4 threads", 4)):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(lambda k: get(k, os.path.join(outdir, k)), keys))
        times.append(time.perf_counter() - t)
        for k in keys:
            os.unlink(os.path.join(outdir, k))
    results[mode] = times
print(json.dumps(results))
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--objects", type=int, default=8)
    ap.add_argument("--size-mb", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="k",
                          aws_secret_access_key="s")
        s3.create_bucket(Bucket="bench")
        payload = os.urandom(args.size_mb << 20)
        for i in range(args.objects):
            s3.put_object(Bucket="bench", Key=f"shard-{i:03d}.tbl", Body=payload)
        total_mib = args.objects * args.size_mb
        with tempfile.TemporaryDirectory() as out:
            for which in ("obstore", "fsspec+s3fs"):
                proc = subprocess.run([sys.executable, "-c", CLIENT, which, endpoint, str(args.objects),
                                       str(args.repeat), out], capture_output=True, text=True, check=True)
                res = json.loads(proc.stdout)
                for mode, times in res.items():
                    med = statistics.median(times)
                    print(f"{which:12s} {mode:10s} {total_mib / med:8.1f} MiB/s  (median of {len(times)}: "
                          f"{med:.2f} s for {args.objects} x {args.size_mb} MiB)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
