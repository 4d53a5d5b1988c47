"""Conversion: images per second from the JPEG TAR to a served format, 2 worker processes each.

Subjects: `tbl_loader.convert` (squash to size x size, the same geometry the
peers produce); TurboLoader's `preprocess_to_tbl` and `litdata.optimize` with
--peers. Baseline: decoding and resizing the same JPEGs with PIL in a process
pool and writing one uint8 .npy - the bare work, with no format around it.
Every epoch converts from scratch into a fresh destination that is deleted after.
"""

from __future__ import annotations

import io
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from tbl_bench.config import Config, SkipConfig
from tbl_bench.context import BenchContext
from tbl_bench.peers.pil import index_tar

NAME = "convert"
TITLE = "Conversion (JPEG TAR to a served format)"
UNIT = "images/s"
COMPARE_ON = ()


class _TblConvert:
    def __init__(self, tar: str, size: int, mode: str, workers: int, count: int):
        try:
            from tbl_loader import convert
        except ImportError as e:
            raise SkipConfig(f"tbl_loader.convert is not importable: {e}") from e
        self.convert = convert
        self.tar, self.size, self.mode, self.workers = tar, size, mode, workers
        self.items_per_epoch = count
        self._tmp = Path(tempfile.mkdtemp(prefix="tbl-bench-convert-"))
        self.info = {"workers": workers, "mode": mode}

    def run_epoch(self, epoch: int) -> int:
        dst = self._tmp / f"epoch{epoch}.tbl"
        rep = self.convert(self.tar, dst, self.size, mode=self.mode, workers=self.workers,
                           report=False, progress=False)
        self.info["output_bytes"] = dst.stat().st_size
        dst.unlink()
        if rep.status != "ok":
            raise RuntimeError(f"tbl convert failed: {rep.error}")
        self.info["draft"] = rep.draft
        return rep.written

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def tbl_convert(tar: str, size: int, count: int, mode: str = "squash", workers: int = 2):
    """Workload factory: one `tbl_loader.convert` of the TAR per epoch."""
    return _TblConvert(tar, size, mode, workers, count)


_TAR: str | None = None


def _init(tar: str) -> None:
    global _TAR
    _TAR = tar


def _decode_chunk(args: tuple[list[tuple[int, int]], int]) -> np.ndarray:
    from PIL import Image

    spans, size = args
    out = np.empty((len(spans), size, size, 3), dtype=np.uint8)
    with open(_TAR, "rb") as f:
        for i, (off, n) in enumerate(spans):
            f.seek(off)
            img = Image.open(io.BytesIO(f.read(n))).convert("RGB").resize((size, size), Image.BILINEAR)
            out[i] = np.asarray(img)
    return out


class _PilNpy:
    def __init__(self, tar: str, size: int, workers: int):
        self.tar, self.size, self.workers = tar, size, workers
        self.spans, _ = index_tar(tar)
        self.items_per_epoch = len(self.spans)
        self._tmp = Path(tempfile.mkdtemp(prefix="tbl-bench-pilnpy-"))
        self.info = {"workers": workers}

    def run_epoch(self, epoch: int) -> int:
        chunks = [(self.spans[i : i + 64], self.size) for i in range(0, len(self.spans), 64)]
        out = np.lib.format.open_memmap(self._tmp / "images.npy", mode="w+", dtype=np.uint8,
                                        shape=(len(self.spans), self.size, self.size, 3))
        with ProcessPoolExecutor(self.workers, initializer=_init, initargs=(self.tar,)) as pool:
            pos = 0
            for block in pool.map(_decode_chunk, chunks):
                out[pos : pos + len(block)] = block
                pos += len(block)
        out.flush()
        del out
        (self._tmp / "images.npy").unlink()
        return pos

    def close(self) -> None:
        shutil.rmtree(self._tmp, ignore_errors=True)


def pil_npy(tar: str, size: int, workers: int = 2):
    """Workload factory: decode + resize with PIL in `workers` processes into one uint8 .npy."""
    return _PilNpy(tar, size, workers)


def configurations(ctx: BenchContext) -> list[Config]:
    s = ctx.sizes
    tar = str(ctx.image_tar())
    # A conversion is long and its first run is as representative as any: no warm-up.
    common = {"warmup": 0, "epochs": 1 if ctx.quick else 3, "unit": UNIT}
    configs = [
        Config(NAME, "pil-npy", "pil", "tbl_bench.suites.convert:pil_npy",
               {"tar": tar, "size": s.image_size}, role="baseline", **common),
        Config(NAME, "tbl", "tbl", "tbl_bench.suites.convert:tbl_convert",
               {"tar": tar, "size": s.image_size, "count": s.images}, **common),
    ]
    if ctx.peers:
        configs += [
            Config(NAME, "turboloader", "turboloader", "tbl_bench.peers.turbo:turbo_convert",
                   {"tar": tar, "size": s.image_size, "count": s.images}, peer=True, **common),
            Config(NAME, "litdata", "litdata", "tbl_bench.peers.litdata_peer:litdata_convert",
                   {"tar": tar, "size": s.image_size, "count": s.images}, peer=True, **common),
        ]
    return configs
