"""Conversion: images per second from the JPEG TAR to a served format, on every usable core.

Ceiling, the decode limit: Pillow's share of the work alone, on the same
images - read each member, draft-decode it (DCT scaling, as `tbl convert`
does by default), convert to RGB and squash-resize it to size x size
(bilinear, ``reducing_gap=None``: the geometry `tbl convert --mode squash`
stores), in one warm process per core, keeping and writing nothing. No
converter that decodes and resizes with Pillow can be faster than this on
this machine in this run. `tbl convert` resizes with tbl-kernels'
``pillow_resize`` (Pillow's bytes, computed faster), so it can pass this
limit: its own ceiling, ``decode-limit-tbl-resize``, is the same work with
that resize (`tbl_loader.conversion.decode.preprocess_into` into a row), still writing
nothing. TBL's figure is read as a fraction of both.

Subjects: `tbl_loader.convert` (squash), from the TAR and from the same images
and labels written as WebDataset shards, Parquet, a `datasets` folder and a
JSONL manifest (``tbl-from-*``, `tbl_bench.record_sources`; each figure is
read against the TAR's, same run); with --peers, TurboLoader's
`preprocess_to_tbl`, `litdata.optimize` (PIL decode + resize in its workers; from the TAR, and from the
Parquet layout with one input per row group, ``litdata-from-parquet``)
and FFCV 1.0.2's `DatasetWriter` from the photos at ``max_resolution=size``
in its two modes, ``raw`` (decoded pixels) and ``jpg`` (re-encoded; FFCV
keeps the aspect ratio, so its images are not squashed). Each tool gets as
many workers as there are usable cores. Every epoch converts from scratch
into a fresh destination, deleted before the next epoch, untimed
(`tbl_bench.conversions`); reading the TAR's member list is part of each
converter's time (the decode limits' is not).

With ``--data TAR`` (an ImageNet-layout TAR of JPEGs) and ``--image-size``,
the user's TAR is converted at that size instead of the generated photos.
"""

from __future__ import annotations

import io
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tbl_bench.config import Config, SkipConfig
from tbl_bench.context import BenchContext
from tbl_bench.conversions import ConversionEpochs

NAME = "convert"
TITLE = "Conversion (JPEG TAR to a served format)"
UNIT = "images/s"
COMPARE_ON = ()
DECODE_CHUNK = 64  # images per task of the decode limit, as `tbl convert --size` hands them to its workers


class _TblConvert(ConversionEpochs):
    def __init__(self, tar: str, size: int, mode: str, workers: int, count: int, source_format: str | None = None):
        try:
            from tbl_loader import convert
        except ImportError as e:
            raise SkipConfig(f"tbl_loader.convert is not importable: {e}") from e
        self.convert = convert
        self.tar, self.size, self.mode, self.workers = tar, size, mode, workers
        self.source_format = source_format
        self.items_per_epoch = count
        self.info = {"workers": workers, "mode": mode, "source_format": source_format or "tar"}
        super().__init__("tbl-bench-convert-", ".tbl")

    def convert_into(self, dst: Path) -> int:
        rep = self.convert(self.tar, dst, self.size, mode=self.mode, workers=self.workers,
                           report=False, progress=False, source_format=self.source_format)
        if rep.status != "ok":
            raise RuntimeError(f"tbl convert failed: {rep.error}")
        self.info["draft"] = rep.draft
        return rep.written


def tbl_convert(tar: str, size: int, count: int, mode: str = "squash", workers: int = 2,
                source_format: str | None = None):
    """Workload factory: one `tbl_loader.convert` of the TAR (or of the same images in another layout,
    ``source_format``: `tbl_bench.record_sources`) per epoch."""
    return _TblConvert(tar, size, mode, workers, count, source_format)


_TAR_FD: int | None = None


def _open_tar(tar: str) -> None:
    global _TAR_FD
    from PIL import Image  # noqa: F401  (imported once per worker, before any timing)

    _TAR_FD = os.open(tar, os.O_RDONLY)


def decode_resize(data: bytes, size: int):
    """Pillow's share of converting one image: draft-decode, RGB and squash-resize; the decode limit's unit."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        if img.format == "JPEG":
            img.draft("RGB", (size, size))
        img.load()
        rgb = img if img.mode == "RGB" else img.convert("RGB")
        return rgb.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=None)


def _decode_resize_chunk(args: tuple[list[tuple[int, int]], int, str]) -> int:
    """The decoding and resizing of a conversion for each image of a task (``resize``: "pillow", Pillow's
    `decode_resize`; "tbl", `tbl_loader.conversion.decode.preprocess_into` into a row); keep nothing."""
    spans, size, resize = args
    assert _TAR_FD is not None, "worker not initialised"
    if resize == "tbl":
        import numpy as np

        from tbl_loader.conversion.decode import preprocess_into

        row = np.empty((size, size, 3), np.uint8)
        for off, n in spans:
            preprocess_into(os.pread(_TAR_FD, n, off), size, "squash", "bilinear", True, row)
    else:
        for off, n in spans:
            decode_resize(os.pread(_TAR_FD, n, off), size)
    return len(spans)


class _DecodeLimit:
    """A decode limit: `workers` warm processes doing only the decoding and resizing of a conversion."""

    def __init__(self, tar: str, size: int, workers: int, resize: str):
        from tbl_bench.peers.pil import index_tar

        self.size, self.workers, self.resize = size, workers, resize
        self.spans, _ = index_tar(tar)  # untimed: the limit is the decoding alone
        self.items_per_epoch = len(self.spans)
        # forkserver (spawn off Linux): the worker starts clean of this process's threads and imports.
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                        initializer=_open_tar, initargs=(tar,))
        # Every worker starts untimed, its imports done and (tbl) its resize checked against Pillow.
        warm = self.spans[: workers] if resize == "tbl" else []
        list(self.pool.map(_decode_resize_chunk, [(warm, size, resize)] * workers))
        self.info = {"workers": workers, "draft": True, "resize": resize}

    def run_epoch(self, epoch: int) -> int:
        chunks = [(self.spans[i : i + DECODE_CHUNK], self.size, self.resize)
                  for i in range(0, len(self.spans), DECODE_CHUNK)]
        return sum(self.pool.map(_decode_resize_chunk, chunks))

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def decode_limit(tar: str, size: int, workers: int, resize: str = "pillow"):
    """Workload factory: draft decode + squash resize of every image on `workers` cores, nothing written;
    resized by Pillow (``resize="pillow"``) or by tbl-kernels as `tbl convert` does (``"tbl"``)."""
    return _DecodeLimit(tar, size, workers, resize)


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _source(ctx: BenchContext) -> tuple[str, int, int]:
    """(TAR, stored side, images): the user's TAR and image size with --data, else the generated photos."""
    s = ctx.sizes
    user = ctx.user
    if user is None:
        return str(ctx.image_tar()), s.image_size, s.images
    from tbl_bench.peers.pil import index_tar
    from tbl_bench.user_data import UserDataError, data_kind

    if data_kind(user.path) != "image-tar":
        raise UserDataError(f"--data {user.path}: the convert suite converts a JPEG TAR; this is a converted .tbl")
    return str(user.path), user.image_size or s.image_size, len(index_tar(user.path)[0])


def configurations(ctx: BenchContext) -> list[Config]:
    tar, size, count = _source(ctx)
    workers = usable_cores()
    # A conversion is long and its first run is as representative as any: no warm-up.
    common = {"warmup": 0, "epochs": 1 if ctx.quick else 3, "unit": UNIT}
    configs = [
        Config(NAME, "decode-limit", "pil", "tbl_bench.suites.convert:decode_limit",
               {"tar": tar, "size": size, "workers": workers}, role="ceiling", **common),
        Config(NAME, "decode-limit-tbl-resize", "tbl", "tbl_bench.suites.convert:decode_limit",
               {"tar": tar, "size": size, "workers": workers, "resize": "tbl"}, role="ceiling", **common),
        Config(NAME, "tbl", "tbl", "tbl_bench.suites.convert:tbl_convert",
               {"tar": tar, "size": size, "count": count, "workers": workers}, **common),
    ]
    record_configs = _record_source_configs(ctx, tar, size, count, workers, common)
    configs += record_configs
    if ctx.peers:
        configs += [
            Config(NAME, "turboloader", "turboloader", "tbl_bench.peers.turbo:turbo_convert",
                   {"tar": tar, "size": size, "count": count, "workers": workers}, peer=True, **common),
            Config(NAME, "litdata", "litdata", "tbl_bench.peers.litdata_peer:litdata_convert",
                   {"tar": tar, "size": size, "count": count, "workers": workers}, peer=True, **common),
        ]
        parquet = next((c for c in record_configs if c.name == "tbl-from-parquet"), None)
        if parquet is not None:  # litdata's own Parquet path, against tbl convert of the same file
            configs.append(Config(NAME, "litdata-from-parquet", "litdata",
                                  "tbl_bench.peers.litdata_peer:litdata_convert_parquet",
                                  {"parquet": parquet.params["tar"], "size": size, "count": count,
                                   "workers": workers}, peer=True, skip=parquet.skip, **common))
        ffcv_skip = _ffcv_skip(ctx)
        for mode in ("raw", "jpg"):
            configs.append(Config(NAME, f"ffcv-{mode}", "ffcv", "tbl_bench.peers.ffcv_peer:ffcv_convert",
                                  {"tar": tar, "size": size, "write_mode": mode, "workers": workers},
                                  peer=True, skip=ffcv_skip, **common))
    return configs


def _record_source_configs(ctx: BenchContext, tar: str, size: int, count: int, workers: int,
                           common: dict) -> list[Config]:
    """`tbl convert` of the same images and labels as WebDataset shards, Parquet, a datasets folder and a
    JSONL manifest (`tbl_bench.record_sources`), each against the TAR's conversion in the same run."""
    from tbl_bench.record_sources import LAYOUTS, layout_path, write_layout

    if ctx.user is not None:  # the layouts are written from the generated photos only, not from a user's TAR
        return []
    configs = []
    for layout in LAYOUTS:
        skip, src = None, ""
        try:
            written = ctx.artifact(f"photos-{count}-{layout}", {"kind": "layout", "tar": Path(tar).name,
                                                                 "layout": layout},
                                   lambda path, layout=layout: write_layout(tar, layout, path))
            src = str(layout_path(layout, written))
        except ImportError as e:  # pyarrow (parquet), datasets (hf)
            skip = f"the {layout} layout cannot be written here: {e}"
        configs.append(Config(NAME, f"tbl-from-{layout}", "tbl", "tbl_bench.suites.convert:tbl_convert",
                              {"tar": src, "size": size, "count": count, "workers": workers,
                               "source_format": layout}, skip=skip, **common))
    return configs


def _ffcv_skip(ctx: BenchContext) -> str | None:
    try:
        return ctx.peer_call("tbl_bench.peers.ffcv_peer:ffcv_unavailable_reason", {})
    except RuntimeError as e:
        return str(e)


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """TBL's conversion rate over the decode limit and over each peer's, same run."""
    tbl = results.get("tbl")
    if not tbl:
        return {}
    out = {}
    for name in ("decode-limit", "decode-limit-tbl-resize", "turboloader", "litdata", "ffcv-raw", "ffcv-jpg"):
        other = results.get(name)
        if other and other.get("throughput"):
            out[f"tbl vs {name}"] = tbl["throughput"] / other["throughput"]
    if tbl.get("throughput"):
        for name, res in results.items():
            if name.startswith("tbl-from-") and res and res.get("throughput"):
                out[f"{name} vs tbl"] = res["throughput"] / tbl["throughput"]
    mine, theirs = results.get("tbl-from-parquet"), results.get("litdata-from-parquet")
    if mine and theirs and mine.get("throughput") and theirs.get("throughput"):
        out["tbl-from-parquet vs litdata-from-parquet"] = mine["throughput"] / theirs["throughput"]
    return out
