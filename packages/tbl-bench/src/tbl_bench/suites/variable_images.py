"""Serving from images stored as they come: TBL's three storages against FFCV's two modes and PyTorch + PIL.

Every configuration serves RandomResizedCrop(224) (scale 0.08-1, ratio 3/4-4/3)
+ horizontal flip p=0.5, float32 CHW normalized, batch 256, at the consume
level, with the same parallelism (THREADS loader threads / workers), from the
same photos:

- TBL from JPEG storage (`convert(max_size=256, store="jpeg")`: decode inside the
  batch pass, DCT-domain downscaling where the crop allows) twice: with the
  accurate IDCT (the default, `tbl/jpeg256`) and with the fast IDCT
  (`jpeg_dct="fast"`, `tbl/jpeg256-fastdct`), which is the one FFCV decodes
  with; from variable raw storage (`store="raw"`), and from today's fixed
  224 x 224 raw file (`convert(size=224)`, center crop);
- FFCV 1.0.2, JPEG mode and raw mode (`RGBImageField(write_mode="jpg" / "raw",
  max_resolution=256)`; its JPEG mode decodes every image in full with
  TurboJPEG's `tjDecompress2(..., TJFLAG_FASTDCT | TJFLAG_NOREALLOC)`, the fast
  IDCT, then crops and resizes with OpenCV), served by its `Loader` with
  RandomResizedCropRGBImageDecoder((224, 224)), RandomHorizontalFlip,
  NormalizeImage, ToTensor, ToTorchImage (peer interpreter; skipped with the
  import error where FFCV does not import);
- the baseline: a PyTorch DataLoader decoding the JPEGs of the TAR with PIL
  every epoch, with the torchvision transforms reimplemented in PIL + numpy
  (`tbl_bench.peers.transforms`; torchvision itself is not a dependency).

JPEG storage (`--max-size 256` and `512`) is also served, for the JPEG decode inside the kernel pass, by
today's thread-pool decode (`tbl/jpegN-threads`: simplejpeg on whole rows, then the crop-resize kernel), at
the produce level (`tbl/jpegN-produce`: the batch complete in memory, not summed; `tbl/jpegN-u8-produce`:
the same with a uint8 batch, to be normalized on the GPU, so without the float32 write), and with the evaluation
transform (`-eval`: Resize(256) + CenterCrop(224), no flip; FFCV's `CenterCropRGBImageDecoder` with the
same ratio) by both decodes; against `decode/jpegN`, simplejpeg decoding the same stored bytes whole on
THREADS threads and doing nothing else (the decode-only ceiling: no batch written, nothing summed).

The photos are the bench TAR's (10,000 in a full run, 1,000 with --quick); a
TAR of more than SUBSET_ROWS is cut to its first SUBSET_ROWS JPEGs, written
once to a subset TAR that every tool converts, so that an epoch of the PIL
baseline stays within about a minute on a 2-core machine (~300 images/s).
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from tbl_bench.config import Config
from tbl_bench.context import BenchContext, DataUnavailable
from tbl_bench.peers.transforms import EVAL

NAME = "variable_images"
TITLE = "Serving variable-size images (RandomResizedCrop 224 + flip; JPEG storage also with the evaluation transform)"
UNIT = "images/s"
# `path`: a configuration's "vs ceiling" is the decode of its own JPEG store (the ceiling serves no transform
# and sums nothing, so its level and aug are None: any of them); raw and FFCV files have none. The PIL baseline
# reads the TAR (no `path`), so it stays every RandomResizedCrop configuration's baseline.
COMPARE_ON = ("level", "aug", "size", "path")
ROUNDS = 3

MAX_SIZE, OUTPUT_SIZE, BATCH_SIZE, THREADS = 256, 224, 256, 2
SUBSET_ROWS = 10_000

# Goals of the comparison (issue 12): name -> (numerator, denominator, at least).
GOALS = {
    "tbl jpeg256 vs ffcv jpg256": ("tbl/jpeg256", "ffcv/jpg256", 1.3),
    "tbl jpeg256 fast IDCT (as FFCV decodes) vs ffcv jpg256": ("tbl/jpeg256-fastdct", "ffcv/jpg256", 1.3),
    "tbl jpeg256 vs pytorch-pil": ("tbl/jpeg256", "pil/jpeg-tar", 4.0),
    "tbl raw256 vs ffcv raw256": ("tbl/raw256", "ffcv/raw256", 1.5),
    # issue 38: the JPEG decode inside the kernel pass against the decode alone and against FFCV
    "tbl jpeg256 vs decode-only ceiling": ("tbl/jpeg256", "decode/jpeg256", 1.0),
    "tbl jpeg256 vs ffcv jpg256 (issue 38)": ("tbl/jpeg256", "ffcv/jpg256", 2.0),
    "tbl jpeg256 vs its thread-pool decode": ("tbl/jpeg256", "tbl/jpeg256-threads", 1.0),
    "tbl jpeg512 vs decode-only ceiling": ("tbl/jpeg512", "decode/jpeg512", 1.0),
    "tbl jpeg512 vs its thread-pool decode": ("tbl/jpeg512", "tbl/jpeg512-threads", 1.0),
    "tbl jpeg512 vs ffcv jpg512 (issue 38)": ("tbl/jpeg512", "ffcv/jpg512", 2.0),
    # The same at the produce level: the batch complete in memory, not summed. The ceiling writes no batch and
    # sums nothing, so this is the like-for-like pass against it; the consume level adds the sum of a batch.
    "tbl jpeg256 at the produce level vs decode-only ceiling": ("tbl/jpeg256-produce", "decode/jpeg256", 1.0),
    "tbl jpeg512 at the produce level vs decode-only ceiling": ("tbl/jpeg512-produce", "decode/jpeg512", 1.0),
    # ... and with a uint8 batch: the pass without the float32 write (which the ceiling does not pay either)
    "tbl jpeg256 uint8 at the produce level vs decode-only ceiling": ("tbl/jpeg256-u8-produce", "decode/jpeg256", 1.0),
    "tbl jpeg512 uint8 at the produce level vs decode-only ceiling": ("tbl/jpeg512-u8-produce", "decode/jpeg512", 1.0),
    # The evaluation transform (Resize 256 + CenterCrop 224): the same goals against the same ceiling
    "tbl jpeg256 eval vs decode-only ceiling": ("tbl/jpeg256-eval", "decode/jpeg256", 1.0),
    "tbl jpeg256 eval vs its thread-pool decode": ("tbl/jpeg256-eval", "tbl/jpeg256-threads-eval", 1.0),
    "tbl jpeg256 eval vs ffcv jpg256 eval": ("tbl/jpeg256-eval", "ffcv/jpg256-eval", 2.0),
    "tbl jpeg512 eval vs decode-only ceiling": ("tbl/jpeg512-eval", "decode/jpeg512", 1.0),
    "tbl jpeg512 eval vs its thread-pool decode": ("tbl/jpeg512-eval", "tbl/jpeg512-threads-eval", 1.0),
    "tbl jpeg512 eval vs ffcv jpg512 eval": ("tbl/jpeg512-eval", "ffcv/jpg512-eval", 2.0),
}


def subset_rows(ctx: BenchContext) -> int:
    return min(ctx.sizes.images, SUBSET_ROWS)


def _write_first_members(src: Path, dst: Path, count: int) -> None:
    """The first `count` files of the TAR `src` (names, bytes and order kept) as the TAR `dst`, atomically."""
    tmp = dst.with_name(dst.name + ".tmp")
    written = 0
    with tarfile.open(src) as tin, tarfile.open(tmp, "w") as tout:
        for member in tin:
            if written == count:
                break
            if member.isfile():
                tout.addfile(member, tin.extractfile(member))
                written += 1
    if written != count:
        tmp.unlink()
        raise DataUnavailable(f"{src} holds {written} files, fewer than the {count} asked for")
    os.replace(tmp, dst)


def subset_tar(ctx: BenchContext) -> Path:
    """The bench TAR, or its first `subset_rows(ctx)` JPEGs when it holds more (made once per data directory)."""
    tar = ctx.image_tar()
    n = subset_rows(ctx)
    if n == ctx.sizes.images:
        return tar
    return ctx.artifact(f"{tar.stem}-first{n}.tar", {"kind": "subset_tar", "tar": tar.name, "rows": n},
                        lambda path: _write_first_members(tar, path, n))


# Config name -> convert() keyword arguments of TBL's three storages.
TBL_STORAGES = {"tbl/jpeg256": {"max_size": MAX_SIZE, "store": "jpeg"},
                "tbl/raw256": {"max_size": MAX_SIZE, "store": "raw"},
                "tbl/fixed224": {"size": OUTPUT_SIZE}}
# JPEG storage at a larger size cap, where decoding only the crop's region at its DCT scale saves more.
JPEG_LARGE = {"tbl/jpeg512": {"max_size": 512, "store": "jpeg"}}
# Config name -> (storage config it serves, ImageLoader jpeg_dct): JPEG storage served with each IDCT.
TBL_JPEG_DCT = {"tbl/jpeg256-fastdct": ("tbl/jpeg256", "fast")}


def _tbl_file(ctx: BenchContext, tar: Path, name: str, kwargs: dict) -> tuple[str, str | None]:
    try:
        from tbl_loader import convert
    except ImportError as e:
        return "", f"tbl_loader.convert is not importable: {e}"
    key = {"kind": "tbl_variable", "tar": tar.name, **kwargs}
    stem = name.split("/", 1)[1]
    try:
        path = ctx.artifact(f"{tar.stem}-{stem}.tbl", key, lambda dst: convert(
            tar, dst, workers=THREADS, report=False, progress=False, **kwargs))
    except DataUnavailable as e:
        return "", str(e)
    return str(path), None


def _ffcv_file(ctx: BenchContext, tar: Path, write_mode: str, max_resolution: int = MAX_SIZE) -> tuple[str, str | None]:
    try:
        reason = ctx.peer_call("tbl_bench.peers.ffcv_peer:ffcv_unavailable_reason", {})
    except RuntimeError as e:
        reason = str(e)
    if reason is not None:
        return "", reason
    try:
        path = ctx.peer_artifact(f"{tar.stem}-{write_mode}{max_resolution}.beton",
                                 {"kind": "ffcv_photos", "tar": tar.name, "write_mode": write_mode,
                                  "max_resolution": max_resolution},
                                 "tbl_bench.peers.ffcv_peer:ffcv_write_photos",
                                 {"tar": str(tar), "write_mode": write_mode, "max_resolution": max_resolution,
                                  "workers": THREADS})
    except DataUnavailable as e:
        return "", str(e)
    return str(path), None


def configurations(ctx: BenchContext) -> list[Config]:
    timing = {"warmup": 1, "epochs": 2 if not ctx.quick else 1, "unit": UNIT}
    crop = {"batch_size": BATCH_SIZE, "aug": "crop", "level": "consume", "size": OUTPUT_SIZE}
    evaluation = {**crop, "aug": EVAL}
    tar = subset_tar(ctx)
    configs = []
    files = {}
    for name, kwargs in TBL_STORAGES.items():
        path, skip = files[name] = _tbl_file(ctx, tar, name, kwargs)
        configs.append(Config(NAME, name, "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, **crop},
                              skip=skip, **timing))
        # The cost of the per-stage clocks (loader.stats()): the same loader with them off.
        configs.append(Config(NAME, f"{name}/stats-off", "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, "stage_timing": False, **crop},
                              skip=skip, **timing))
    for name, (storage, jpeg_dct) in TBL_JPEG_DCT.items():
        path, skip = files[storage]
        configs.append(Config(NAME, name, "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, "jpeg_dct": jpeg_dct, **crop},
                              skip=skip, **timing))
    for name, kwargs in JPEG_LARGE.items():
        path, skip = files[name] = _tbl_file(ctx, tar, name, kwargs)
        configs.append(Config(NAME, name, "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, **crop}, skip=skip, **timing))
    for name in ("tbl/jpeg256", *JPEG_LARGE):
        path, skip = files[name]
        # Today's fallback (kernels 0.2): whole rows decoded by simplejpeg in a thread pool, then crop-resize.
        configs.append(Config(NAME, f"{name}-threads", "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, "jpeg_decode": "threads", **crop},
                              skip=skip, **timing))
        configs.append(Config(NAME, f"{name}-produce", "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, **crop, "level": "produce"}, skip=skip, **timing))
        # A uint8 batch (normalized later on the GPU, as FFCV's own pipelines do): the decode side of the pass
        # without the float32 write, which costs about as much per image as the region decode saves.
        configs.append(Config(NAME, f"{name}-u8-produce", "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, **crop, "level": "produce", "dtype": "uint8"},
                              skip=skip, **timing))
        # The evaluation transform, by the kernels' decode and by the thread-pool decode
        configs.append(Config(NAME, f"{name}-eval", "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, **evaluation}, skip=skip, **timing))
        configs.append(Config(NAME, f"{name}-threads-eval", "tbl", "tbl_bench.suites.images:tbl_serve",
                              {"path": path, "threads": THREADS, "jpeg_decode": "threads", **evaluation},
                              skip=skip, **timing))
        # The decode-only ceiling: simplejpeg decoding the same stored bytes whole on THREADS threads.
        configs.append(Config(NAME, "decode/" + name.split("/", 1)[1], "simplejpeg",
                              "tbl_bench.suites.images:jpeg_decode_ceiling",
                              {"path": path, "threads": THREADS, **crop, "level": None, "aug": None},
                              role="ceiling", skip=skip, **timing))
    # FFCV's two modes at 256, and its JPEG mode at 512 too (max_resolution equal to TBL's --max-size)
    for mode, size in (("jpg", MAX_SIZE), ("raw", MAX_SIZE), ("jpg", 512)) if ctx.peers else ():
        path, skip = _ffcv_file(ctx, tar, mode, size)
        configs.append(Config(NAME, f"ffcv/{mode}{size}", "ffcv", "tbl_bench.peers.ffcv_peer:ffcv_serve",
                              {"path": path, "workers": THREADS, **crop},
                              skip=skip, peer=True, **timing))
        if mode == "jpg":  # its validation decoder (CenterCropRGBImageDecoder) against TBL's evaluation transform
            configs.append(Config(NAME, f"ffcv/{mode}{size}-eval", "ffcv", "tbl_bench.peers.ffcv_peer:ffcv_serve",
                                  {"path": path, "workers": THREADS, **evaluation},
                                  skip=skip, peer=True, **timing))
    configs.append(Config(NAME, "pil/jpeg-tar", "pil", "tbl_bench.peers.pil:pil_loader",
                          {"tar": str(tar), "workers": THREADS, **crop},
                          role="baseline", **timing))
    return configs


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """The goals' same-run ratios of median images/s (a goal whose two sides did not both run is absent)."""
    out = {}
    for label, (num, den, _goal) in GOALS.items():
        if num in results and den in results and results[den]["throughput"]:
            out[label] = results[num]["throughput"] / results[den]["throughput"]
    return out
