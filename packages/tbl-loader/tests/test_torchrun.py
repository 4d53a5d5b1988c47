"""torchrun, 2 ranks x 2 fork DataLoader workers, over a variable-size JPEG dataset at a loopback-S3 URL.

Every sample is served exactly once per epoch across the ranks, each rank's batches equal those of
the same command over the local copy, and both runs' wall times are recorded (printed, not asserted:
timings belong in benchmarks).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import needs_per_sample

import tbl_format

pytest.importorskip("torch")
simplejpeg = pytest.importorskip("simplejpeg")
pytestmark = needs_per_sample  # a variable-size JPEG dataset

ROWS, SHARD_ROWS, EPOCHS = 64, 8, 2
HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def jpeg_dataset(tmp_path_factory):
    rng = np.random.default_rng(8)
    schema = tbl_format.Schema({"image": tbl_format.Leaf("encoded_image", format="jpeg"),
                                "height": tbl_format.Leaf("int"), "width": tbl_format.Leaf("int"),
                                "label": tbl_format.Leaf("int"), "caption": tbl_format.Leaf("str")})
    path = tmp_path_factory.mktemp("torchrun") / "jpeg"
    with tbl_format.Writer(path, schema, shard_rows=SHARD_ROWS) as w:
        for i in range(ROWS):
            h, wd = (int(v) for v in rng.integers(30, 90, 2))
            y, x = np.mgrid[0:h, 0:wd]
            img = ((rng.integers(0, 256, 3) + 3 * y[..., None] + 2 * x[..., None]) % 256).astype(np.uint8)
            w.write({"image": simplejpeg.encode_jpeg(np.ascontiguousarray(img), quality=90, colorspace="RGB"),
                     "height": h, "width": wd, "label": i, "caption": f"photo {i}"})
    return path


def _torchrun(where: str, cache: Path, options: str, out: Path) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_port", str(_free_port()), str(HERE / "torchrun_rank.py"), where, str(cache),
                           options, str(out), str(EPOCHS)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [{**dict(np.load(f"{out}-rank{r}.npz")), **json.loads(Path(f"{out}-rank{r}.json").read_text())}
            for r in range(2)]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_two_ranks_two_fork_workers_over_s3(s3_server, jpeg_dataset, tmp_path):
    from tbl_loader import upload_dataset

    url = f"s3://{s3_server.new_bucket()}/jpeg/"
    upload_dataset(jpeg_dataset, url, storage_options=s3_server.storage_options)
    options = {k: v for k, v in s3_server.storage_options.items() if k != "retry_config"}  # (JSON for argv)
    remote = _torchrun(url, tmp_path / "cache", json.dumps(options), tmp_path / "remote")
    local = _torchrun(str(jpeg_dataset), tmp_path / "unused", "-", tmp_path / "local")
    per_epoch = ROWS // 2 // 8
    for epoch in range(EPOCHS):
        seen = np.concatenate([r["rows"][epoch * per_epoch:(epoch + 1) * per_epoch].reshape(-1) for r in remote])
        assert np.array_equal(np.sort(seen), np.arange(ROWS))  # every sample exactly once in the epoch
    for got, want in zip(remote, local, strict=True):
        assert np.array_equal(got["rows"], want["rows"]) and np.array_equal(got["images"], want["images"])
        captions = [f"photo {i}" for i in got["rows"].reshape(-1)]
        assert got["captions"].tolist() == want["captions"].tolist() == captions
    print(f"remote {max(r['seconds'] for r in remote):.2f} s, local {max(r['seconds'] for r in local):.2f} s")
