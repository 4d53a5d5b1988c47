"""Remote serving from one loopback S3 server: TBL vs Mosaic streaming vs litdata, cold and second epoch.

    python -m tbl_bench.remote [--images 8000] [--size 96] [--shard-rows 250] [--rounds 3]
                               [--peer-python PATH] [--child-timeout 600]

Needs ``tbl-loader[remote]``, ``moto[server]`` and boto3 in this interpreter; the
peers (``mosaicml-streaming``, ``litdata``, with torch, boto3 and obstore) in
``--peer-python`` (default: this interpreter).

Starts moto's S3 server on 127.0.0.1 in this process, behind a WSGI wrapper that
counts the body bytes of every GET it answers. Writes the same random uint8
images (one ``.npy``) as a TBL dataset (``--shard-rows`` rows a shard), as a
Mosaic dataset (``MDSWriter``) and as a litdata dataset (``litdata.optimize``),
the peers' shards and chunks of about the TBL shard's bytes, and uploads all
three to the server. Then, in each of ``--rounds`` rounds, runs every
configuration in its own subprocess with a fresh cache directory
(``remote_child.py``; TBL ones under this interpreter, the peers' under
``--peer-python``):

- ``TBL local``: ImageLoader on the local TBL copy, ``shuffle="block"``: the
  consumer's limit, the reference for the second epoch;
- for each cache fraction (1.0, 0.3) and shuffle (global, block), the cache
  limit being the fraction of each system's own dataset bytes:

  - ``TBL``: ImageLoader on the S3 URL, ``shuffle=True`` / ``"block"`` (blocks of
    4 shards), ``cache_limit``;
  - ``Mosaic``: ``streaming.StreamingDataset(remote=URL, local=cache dir,
    shuffle=True, cache_limit)`` in a torch DataLoader; ``shuffle_algo="naive"``
    (its all-to-all shuffle) for global, ``"py1br"`` for block with
    ``shuffle_block_size`` the samples of TBL's block (4 shards): shard order
    shuffled, samples shuffled within blocks, TBL's block design (the default,
    ``py1e``, spreads each shard's samples over a range instead, and its default
    block of 262144 samples would make a small dataset's "block" shuffle a
    global one). Mosaic reads S3 through boto3, pointed at the server by
    ``S3_ENDPOINT_URL``;
  - ``litdata``: ``StreamingDataset(URL, shuffle=True, max_cache_size)`` in a
    ``StreamingDataLoader``: its chunk-then-sample shuffle, in the block rows
    only (it has no global shuffle: n/a in the global rows).

Every configuration yields uint8 HWC batches of 128 and touches every batch.
The peers run with ``num_workers=0`` (their download threads still run beside
the loop); TBL with its own producer and download threads. Each child runs two
epochs: the cold one (timed from before the loader is constructed: opening the
dataset counts; nothing cached) and the second. Reported per round and as the
median over rounds: cold and second-epoch images/s; per row, the ratio of TBL to
the best peer (cold and second epoch, taken within a round) and TBL's second
epoch over TBL local's; and each system's downloaded bytes in the cold epoch
(the server's counter, from before opening to the end of the cold epoch) over its
own dataset's bytes (1.0: every byte once; more: bytes fetched again after
eviction, or fetched twice). Configurations run one after the other in each round
(interleaved, so a change of the machine's load reaches all; each round starts
one configuration later, so none always runs first).

Caveats: one loopback server in Python, shared by the machine's other work, is
far from a real object store (no latency, bandwidth bound by the server's
CPU); each system's dataset has its own size (per-sample framing), so the rates
are images/s and the bytes are a fraction of each system's own; a configuration
that fails or passes ``--child-timeout`` is reported as such, not retried.
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
import threading
import time
from pathlib import Path

from tbl_bench.remote_child import COUNTER_PATH

CHILD = Path(__file__).with_name("remote_child.py")
FRACTIONS = (1.0, 0.3)
SHUFFLES = ("global", "block")
PEERS = ("Mosaic", "litdata")
BLOCK_WINDOW = 4  # TBL's default shuffle="block" window, in shards
KEYS = {"aws_access_key_id": "bench", "aws_secret_access_key": "bench"}


class _ByteCounter:
    """WSGI wrapper: counts the body bytes of the GET answers of ``app``; ``COUNTER_PATH`` answers the count."""

    def __init__(self, app) -> None:
        self.app = app
        self.sent = 0
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == COUNTER_PATH:
            body = str(self.sent).encode()
            start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
            return [body]
        body = self.app(environ, start_response)
        return self._counted(body) if environ.get("REQUEST_METHOD") == "GET" else body

    def _counted(self, body):
        try:
            for chunk in body:
                with self._lock:
                    self.sent += len(chunk)
                yield chunk
        finally:
            close = getattr(body, "close", None)  # PEP 3333: the server calls the iterable's close if it has one
            if close is not None:
                close()


class _Throttle:
    """WSGI wrapper: the GET answers of ``app`` share ``bytes_per_s`` (a store behind a slow link)."""

    PIECE = 256 << 10  # sent at a time: an answer of one large chunk still flows at the rate

    def __init__(self, app, bytes_per_s: float) -> None:
        self.app = app
        self.rate = float(bytes_per_s)
        self._free_at = 0.0  # when the link has sent everything handed to it so far
        self._lock = threading.Lock()

    def __call__(self, environ, start_response):
        body = self.app(environ, start_response)
        return self._paced(body) if environ.get("REQUEST_METHOD") == "GET" else body

    def _paced(self, body):
        try:
            for chunk in body:
                for at in range(0, len(chunk), self.PIECE):
                    piece = chunk[at:at + self.PIECE]
                    with self._lock:
                        now = time.monotonic()
                        self._free_at = max(self._free_at, now) + len(piece) / self.rate
                        due = self._free_at
                    time.sleep(max(0.0, due - time.monotonic()))
                    yield piece
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()


class _S3Server:
    """moto's S3 server on 127.0.0.1 in a thread, behind :class:`_ByteCounter` (and :class:`_Throttle` at
    ``bytes_per_s`` when given)."""

    def __init__(self, bytes_per_s: float | None = None) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        app = DomainDispatcherApplication(create_backend_app)
        if bytes_per_s is not None:
            app = _Throttle(app, bytes_per_s)
        app = _ByteCounter(app)
        self.server = make_server("127.0.0.1", _free_port(), app, threaded=True, request_handler=MotoRequestHandler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _upload_dir(s3, local: Path, prefix: str) -> None:
    for p in sorted(local.rglob("*")):
        if p.is_file():
            s3.upload_file(str(p), "bench", f"{prefix}/{p.relative_to(local).as_posix()}")


def _configs() -> list[tuple[str, float | None, str]]:
    """(system, cache fraction, shuffle) of each configuration; TBL local has no cache."""
    configs = [("TBL local", None, "block")]
    for fraction in FRACTIONS:
        for shuffle in SHUFFLES:
            configs += [("TBL", fraction, shuffle), ("Mosaic", fraction, shuffle)]
            if shuffle == "block":  # litdata has no global shuffle
                configs.append(("litdata", fraction, shuffle))
    return configs


def _run_child(python: str, spec: dict, env: dict, timeout: float) -> dict | str:
    """The child's result, or why there is none."""
    try:
        out = subprocess.run([python, str(CHILD), json.dumps(spec)], capture_output=True, text=True, env=env,
                             timeout=timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:.0f} s"
    if out.returncode != 0:
        lines = out.stderr.strip().splitlines()
        return f"failed: {lines[-1] if lines else f'exit {out.returncode}'}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def _figures(result: dict | str) -> dict | str:
    """A child's epochs as images/s (cold, second) and the cold epoch's downloaded bytes; a failure as is."""
    if not isinstance(result, dict):
        return result
    (cold_n, cold_s), (second_n, second_s) = result["cold"], result["second"]
    return {"cold": cold_n / cold_s, "second": second_n / second_s, "cold_bytes": result["cold_bytes"]}


def _row_ratios(results: dict, fraction: float, shuffle: str) -> dict[str, float]:
    """Within one round: TBL over the best peer (cold, second epoch) and TBL's second epoch over TBL local's."""
    tbl = results.get(("TBL", fraction, shuffle))
    if not isinstance(tbl, dict):
        return {}
    peers = [r for r in (results.get((p, fraction, shuffle)) for p in PEERS) if isinstance(r, dict)]
    ratios = {}
    if peers:
        ratios["cold"] = tbl["cold"] / max(r["cold"] for r in peers)
        ratios["second"] = tbl["second"] / max(r["second"] for r in peers)
    local = results.get(("TBL local", None, "block"))
    if isinstance(local, dict):
        ratios["local"] = tbl["second"] / local["second"]
    return ratios


def _label(fraction: float | None, shuffle: str) -> str:
    return "local" if fraction is None else f"{fraction:4.0%} {shuffle:6s}"


def _print_results(results: dict, sizes: dict[str, int]) -> None:
    print(f"  {'cache shuffle':14s} {'system':9s} {'cold img/s':>11s} {'2nd img/s':>10s} {'cold bytes/size':>16s}")
    for system, fraction, shuffle in _configs():
        r = results.get((system, fraction, shuffle))
        head = f"  {_label(fraction, shuffle):14s} {system:9s}"
        if isinstance(r, dict):
            print(f"{head} {r['cold']:11.0f} {r['second']:10.0f} "
                  f"{r['cold_bytes'] / sizes[system]:16.2f}")
        else:
            print(f"{head} {r or 'missing'}")
        if system == "Mosaic" and shuffle == "global":
            print(f"  {_label(fraction, shuffle):14s} {'litdata':9s} n/a (no global shuffle)")


def _print_ratios(rounds: list[dict]) -> None:
    print(f"  {'cache shuffle':14s} {'cold TBL/best peer':>19s} {'2nd TBL/best peer':>18s} {'2nd TBL/local':>14s}")
    for fraction in FRACTIONS:
        for shuffle in SHUFFLES:
            per_round = [_row_ratios(r, fraction, shuffle) for r in rounds]
            cells = []
            for key, width in (("cold", 19), ("second", 18), ("local", 14)):
                values = [x[key] for x in per_round if key in x]
                text = (f"{statistics.median(values):.2f}x ({', '.join(f'{v:.2f}' for v in values)})"
                        if values else "n/a")
                cells.append(f"{text:>{width}s}")
            print(f"  {_label(fraction, shuffle):14s} " + " ".join(cells))


def _median_results(rounds: list[dict]) -> dict:
    """Per configuration, the median of each figure over the rounds in which it ran."""
    medians = {}
    for config in _configs():
        done = [r[config] for r in rounds if isinstance(r.get(config), dict)]
        if not done:
            medians[config] = next((r[config] for r in rounds if config in r), None)
            continue
        medians[config] = {key: statistics.median(d[key] for d in done) for key in ("cold", "second", "cold_bytes")}
    return medians


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print its tables.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
    """
    ap = argparse.ArgumentParser(prog="python -m tbl_bench.remote", description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=8000)
    ap.add_argument("--size", type=int, default=96)
    ap.add_argument("--shard-rows", type=int, default=250)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of all configurations, interleaved")
    ap.add_argument("--peer-python", default=sys.executable,
                    help="interpreter with mosaicml-streaming and litdata: runs the peers and writes their datasets")
    ap.add_argument("--child-timeout", type=float, default=600.0, help="seconds one configuration may run")
    args = ap.parse_args(argv)
    if args.images < 1 or args.shard_rows < 1 or args.rounds < 1:
        ap.error("need --images, --shard-rows and --rounds >= 1")

    import boto3
    import numpy as np

    import tbl_format
    from tbl_loader import upload_dataset

    server = _S3Server()
    endpoint = server.endpoint
    tbl_opts = {**KEYS, "region": "us-east-1", "endpoint": endpoint, "client_options": {"allow_http": True}}
    lit_opts = {**KEYS, "endpoint_url": endpoint, "region_name": "us-east-1"}
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint,  # Mosaic's boto3 reads the latter
           "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ALLOW_HTTP": "true"}  # litdata's own obstore store reads it (plain-HTTP loopback server)
    work = Path(tempfile.mkdtemp(prefix="tbl-remote-bench-"))
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **KEYS)
        s3.create_bucket(Bucket="bench")
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, (args.images, args.size, args.size, 3), dtype=np.uint8)
        np.save(work / "images.npy", images)
        tbl_path = tbl_format.write(({"image": images[i], "label": np.int64(i)} for i in range(args.images)),
                                    work / "tbl", shard_rows=args.shard_rows)
        upload_dataset(tbl_path, "s3://bench/tbl/", storage_options=tbl_opts)
        shard_bytes = max(p.stat().st_size for p in tbl_path.glob("*.tbl"))
        written = _run_child(args.peer_python, {"mode": "write-peers", "npy": str(work / "images.npy"),
                                                "out": str(work), "shard_bytes": shard_bytes}, env, args.child_timeout)
        if not isinstance(written, dict):
            raise SystemExit(f"writing the peers' datasets with {args.peer_python}: {written}")
        _upload_dir(s3, work / "mds", "mds")
        _upload_dir(s3, work / "lit", "lit")
        sizes = {"TBL local": _dir_bytes(tbl_path), "TBL": _dir_bytes(tbl_path), "Mosaic": _dir_bytes(work / "mds"),
                 "litdata": _dir_bytes(work / "lit")}
        print(f"{args.images} images {args.size}x{args.size}x3 uint8 on the loopback S3 server: "
              f"TBL {sizes['TBL'] / 1e6:.1f} MB ({len(list(tbl_path.glob('*.tbl')))} shards), "
              f"Mosaic {sizes['Mosaic'] / 1e6:.1f} MB ({len(list((work / 'mds').glob('*.mds')))} shards), "
              f"litdata {sizes['litdata'] / 1e6:.1f} MB ({len(list((work / 'lit').glob('*.bin')))} chunks); "
              f"batches of 128, peers with num_workers=0")

        urls = {"TBL local": str(tbl_path), "TBL": "s3://bench/tbl/", "Mosaic": "s3://bench/mds",
                "litdata": "s3://bench/lit/"}
        pythons = {"TBL local": sys.executable, "TBL": sys.executable, "Mosaic": args.peer_python,
                   "litdata": args.peer_python}
        configs = _configs()
        rounds = []
        for number in range(1, args.rounds + 1):
            results = {}
            shift = (number - 1) % len(configs)  # each round starts with another configuration
            for system, fraction, shuffle in configs[shift:] + configs[:shift]:
                cache = tempfile.mkdtemp(dir=work, prefix="cache-")  # fresh: epoch 1 is cold
                spec = {"mode": "epochs", "system": system.split()[0].lower(), "where": urls[system],
                        "shuffle": shuffle, "cache_dir": cache, "endpoint": endpoint,
                        "cache_limit": None if fraction is None else int(fraction * sizes[system]),
                        "block_samples": BLOCK_WINDOW * args.shard_rows,
                        "tbl_options": tbl_opts, "litdata_options": lit_opts}
                results[(system, fraction, shuffle)] = _figures(_run_child(pythons[system], spec, env, args.child_timeout))
                shutil.rmtree(cache, ignore_errors=True)
            rounds.append(results)
            print(f"round {number}:")
            _print_results(results, sizes)
            _print_ratios([results])
        print(f"median over {len(rounds)} rounds:")
        _print_results(_median_results(rounds), sizes)
        print("ratios: median over rounds (each round's)")
        _print_ratios(rounds)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
