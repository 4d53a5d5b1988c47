"""The child processes of :mod:`tbl_bench.remote`: one configuration's two epochs, or the peers' datasets.

Run as a script (``python remote_child.py SPEC_JSON``), not imported through the
``tbl_bench`` package: the peers' configurations run under another interpreter
(``--peer-python``) that has the peers' libraries but not tbl-bench's
dependencies, so this file imports only numpy and the standard library at its
top, and each system's library inside the function that serves it.

``SPEC_JSON["mode"]``:

- ``"write-peers"``: write the images of an ``.npy`` file as a Mosaic (``MDSWriter``)
  and a litdata (``litdata.optimize``) dataset, shards of about ``shard_bytes``;
- ``"epochs"``: open ``system`` (``tbl``, ``mosaic`` or ``litdata``) on ``where``
  and run two epochs of uint8 HWC batches of 128, touching every batch. Prints one
  JSON line: the cold epoch's images and seconds (from before the loader is
  constructed, so opening the dataset counts; the system's library and torch are
  imported before the clock starts), the second epoch's, and the bytes
  the S3 server sent meanwhile (its counter, read before constructing and after
  the cold epoch's last batch).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

BATCH = 128
COUNTER_PATH = "/_bench/bytes-sent"  # the server's count of GET body bytes (tbl_bench.remote._ByteCounter)


def _sent(endpoint: str) -> int:
    with urllib.request.urlopen(endpoint + COUNTER_PATH) as reply:
        return int(reply.read())


# ---- serving: each opener returns a function that runs one epoch and returns its image count ----------
def _open_tbl(spec: dict):
    from tbl_loader import ImageLoader

    remote = {} if spec["cache_limit"] is None else {
        "cache_dir": spec["cache_dir"], "cache_limit": spec["cache_limit"], "storage_options": spec["tbl_options"]}
    loader = ImageLoader(spec["where"], batch_size=BATCH, shuffle=True if spec["shuffle"] == "global" else "block",
                         seed=0, backend="numpy", dtype="uint8", layout="HWC", **remote)

    def epoch(number: int) -> int:
        loader.set_epoch(number)
        return sum(int(np.asarray(b.images)[:, 0, 0, 0].shape[0]) for b in loader)

    return epoch


def _open_mosaic(spec: dict):
    # Reads S3 through boto3, pointed at the loopback server by S3_ENDPOINT_URL (set by the parent).
    import torch.utils.data
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # a child killed earlier may have left its shared memory behind
    # "naive": Mosaic's all-to-all shuffle, the global one. "py1br": shard order shuffled, then samples
    # within blocks of `block_samples` (drawn in 0.75-1.25x of it), TBL's block shuffle's design at its
    # window; py1e, the default, spreads each shard's samples over a range instead.
    algo = "naive" if spec["shuffle"] == "global" else "py1br"
    ds = StreamingDataset(remote=spec["where"], local=spec["cache_dir"], shuffle=True, shuffle_algo=algo,
                          shuffle_seed=0, shuffle_block_size=spec["block_samples"], batch_size=BATCH,
                          cache_limit=spec["cache_limit"])
    dl = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=0)

    def epoch(number: int) -> int:  # StreamingDataset moves to its next epoch on each iteration
        return sum(int(np.asarray(b["image"])[:, 0, 0, 0].shape[0]) for b in dl)

    return epoch


def _open_litdata(spec: dict):
    import litdata.streaming.downloader as lit_downloader
    from litdata import StreamingDataLoader, StreamingDataset
    from obstore.store import S3Store

    build = lit_downloader._build_obstore_s3_store

    def with_http(bucket, client):  # the loopback server speaks plain HTTP (real S3 is HTTPS)
        store = build(bucket, client)
        config = {k: v for k, v in store.config.items() if k not in ("bucket", "aws_bucket")}
        return S3Store(bucket, config=config, client_options={"allow_http": True},
                       credential_provider=store.credential_provider)

    lit_downloader._build_obstore_s3_store = with_http
    ds = StreamingDataset(spec["where"], cache_dir=spec["cache_dir"], shuffle=True, seed=0,
                          storage_options=spec["litdata_options"], max_cache_size=spec["cache_limit"])
    dl = StreamingDataLoader(ds, batch_size=BATCH, num_workers=0)

    def epoch(number: int) -> int:
        return sum(int(np.asarray(b["image"])[:, 0, 0, 0].shape[0]) for b in dl)

    return epoch


OPENERS = {"tbl": _open_tbl, "mosaic": _open_mosaic, "litdata": _open_litdata}
LIBRARIES = {"tbl": "tbl_loader", "mosaic": "streaming", "litdata": "litdata"}


def run_epochs(spec: dict) -> dict:
    """The cold epoch (opening included) and the second one; the bytes the server sent for the cold one."""
    import importlib

    importlib.import_module("torch")  # imported before the clock starts: every system imports torch
    importlib.import_module(LIBRARIES[spec["system"]])
    before = _sent(spec["endpoint"])
    start = time.perf_counter()
    epoch = OPENERS[spec["system"]](spec)
    cold_images = epoch(0)
    cold_s = time.perf_counter() - start
    cold_bytes = _sent(spec["endpoint"]) - before
    start = time.perf_counter()
    second_images = epoch(1)
    second_s = time.perf_counter() - start
    return {"cold": [cold_images, cold_s], "second": [second_images, second_s], "cold_bytes": cold_bytes}


# ---- writing the peers' datasets ------------------------------------------------------------------------
def _litdata_item(item: tuple[str, int]) -> dict:  # module level: litdata's worker process calls it
    path, i = item
    return {"image": np.array(np.load(path, mmap_mode="r")[i]), "label": i}


def write_peers(spec: dict) -> None:
    """The ``.npy`` file's images as ``<out>/mds`` (Mosaic) and ``<out>/lit`` (litdata)."""
    from litdata import optimize
    from streaming import MDSWriter

    images = np.load(spec["npy"], mmap_mode="r")
    out = Path(spec["out"])
    h, w, c = images.shape[1:]
    columns = {"image": f"ndarray:uint8:{h},{w},{c}", "label": "int"}
    with MDSWriter(out=str(out / "mds"), columns=columns, size_limit=spec["shard_bytes"], progress_bar=False) as mds:
        for i in range(images.shape[0]):
            mds.write({"image": np.array(images[i]), "label": i})
    optimize(fn=_litdata_item, inputs=[(spec["npy"], i) for i in range(images.shape[0])], output_dir=str(out / "lit"),
             chunk_bytes=spec["shard_bytes"], num_workers=1)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    if spec["mode"] == "write-peers":
        write_peers(spec)
        print(json.dumps({"written": spec["out"]}))
    else:
        print(json.dumps(run_epochs(spec)))
