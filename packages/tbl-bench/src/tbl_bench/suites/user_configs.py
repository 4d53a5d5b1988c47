"""The configurations of the images, pytree_read and convert suites on the user's own dataset (`--data PATH`).

The same workloads as on generated data, with the user's batch size, image
size, output dtype and thread count (`tbl_bench.user_data.UserData`):

images: TBL's ImageLoader at both levels, plain / flip / RandomResizedCrop;
the numpy reference (float32 only: it writes float32); the memory-copy
ceiling of the same output bytes; the PyTorch DataLoader + PIL baseline when
PATH is a JPEG TAR (skipped, with the reason, for a converted .tbl), with as
many worker processes as TBL gets threads (2 by default).

pytree_read: PyTreeDataset iteration, `ds[i]` in random order and
`get_batch` of the user's batch size, over every row of the user's .tbl.

convert: the user's JPEG TAR converted at their image size, against the
decode limit (`tbl_bench.suites.convert`).
"""

from __future__ import annotations

from pathlib import Path

from tbl_bench.config import Config
from tbl_bench.context import BenchContext
from tbl_bench.levels import LEVELS
from tbl_bench.suites import convert, images, pytree_read
from tbl_bench.user_data import USER_DATA_SUITES, UserDataError, data_kind

__all__ = ["user_configurations", "user_image_configurations", "user_pytree_configurations"]

NO_JPEGS = ("the PIL baseline decodes JPEGs and --data is a converted .tbl; pass the JPEG TAR as --data "
            "to measure the baseline too")


def _converted(ctx: BenchContext, tar: Path, size: int) -> Path:
    """The user's TAR converted once to a size x size .tbl in the data directory (not timed; rebuilt when the
    TAR changes)."""
    from tbl_loader import convert

    st = tar.stat()
    key = {"kind": "user_tbl", "tar": str(tar.resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
           "size": size, "mode": "squash"}
    return ctx.artifact(f"user-{tar.stem}-{size}-squash.tbl", key, lambda path: convert(
        tar, path, size, mode="squash", report=False, progress=True))


def _image_shape(path: Path) -> tuple[int, int]:
    import tbl_format

    ds = tbl_format.open(path)
    try:
        shape = ds.schema.leaves["image"].shape
    finally:
        ds.close()
    if not shape:
        raise UserDataError(f"--data {path}: the image column holds variable-size images; the user-data bench "
                            "measures fixed-size image columns (convert with a size)")
    return shape[0], shape[1]


def _rows(path: Path) -> int:
    import tbl_format

    ds = tbl_format.open(path)
    try:
        return len(ds)
    finally:
        ds.close()


def user_image_configurations(ctx: BenchContext) -> list[Config]:
    user, s = ctx.user, ctx.sizes
    data = Path(user.path)
    kind = data_kind(data)
    if kind == "pytree-tbl":
        raise UserDataError(f"--data {data}: the images suite needs an image column or a JPEG TAR; this .tbl "
                            "has no 'image' leaf (measure it with the pytree_read suite)")
    if kind == "image-tar":
        stored = user.image_size or s.image_size
        tar: Path | None = data
        tbl = _converted(ctx, data, stored)
    else:
        tar, tbl = None, data
        height, width = _image_shape(tbl)
        if height != width:
            raise UserDataError(f"--data {tbl}: stored images are {height}x{width}; the bench compares square "
                                "outputs (convert with a square size)")
        stored = height
    crop = user.image_size or stored
    batch = user.batch_size or s.batch_size
    count = _rows(tbl)
    common = {"warmup": s.warmup, "epochs": s.epochs, "unit": images.UNIT}
    slow = {**common, "epochs": min(2, s.epochs)}
    name = images.NAME
    configs = []
    for size in sorted({stored, crop}):
        for level in LEVELS:
            configs.append(Config(name, f"memcpy/{level}/{size}", "memcpy", "tbl_bench.suites.images:memcpy_ceiling",
                                  {"count": count, "batch_size": batch, "size": size, "level": level,
                                   "dtype": user.dtype}, role="ceiling", **common))
    for aug, size in (("plain", stored), ("flip", stored), ("crop", crop)):
        for level in LEVELS:
            configs.append(Config(name, f"tbl/{level}/{aug}/{size}", "tbl", "tbl_bench.suites.images:tbl_serve",
                                  {"path": str(tbl), "batch_size": batch, "aug": aug, "level": level, "size": size,
                                   "threads": user.threads, "dtype": user.dtype}, **common))
            if aug == "plain" and user.dtype == "float32":
                configs.append(Config(name, f"numpy/{level}/plain/{size}", "numpy",
                                      "tbl_bench.suites.images:numpy_reference",
                                      {"path": str(tbl), "batch_size": batch, "level": level, "aug": "plain",
                                       "size": size}, **common))
        configs.append(Config(name, f"pil/consume/{aug}/{size}", "pil", "tbl_bench.peers.pil:pil_loader",
                              {"tar": str(tar) if tar else "", "size": size, "batch_size": batch, "aug": aug,
                               "level": "consume", "workers": user.threads or 2}, role="baseline",
                              skip=None if tar else NO_JPEGS, **slow))
    return configs


def user_pytree_configurations(ctx: BenchContext) -> list[Config]:
    user = ctx.user
    data = Path(user.path)
    if data_kind(data) == "image-tar":
        raise UserDataError(f"--data {data}: pytree_read reads .tbl datasets; convert the TAR first "
                            "(tbl convert) or measure it with the images suite")
    batch = user.batch_size or pytree_read.BATCH
    common = {"warmup": 1, "epochs": 2 if ctx.quick else 5, "min_time_s": pytree_read.MIN_TIMED_S,
              "max_epochs": pytree_read.MAX_EPOCHS, "unit": pytree_read.UNIT, "rss": False, "preimport": ["numpy"]}
    return [Config(pytree_read.NAME, f"tbl/{op}", "tbl", "tbl_bench.suites.pytree_read:user_reads",
                   {"path": str(data), "op": op, "batch_size": batch}, **common)
            for op in ("iter", "item", "batch-all")]


def user_configurations(suite: str, ctx: BenchContext) -> list[Config]:
    """The configurations of `suite` on the user's dataset (`ctx.user`); UserDataError for other suites."""
    if suite == "images":
        return user_image_configurations(ctx)
    if suite == "pytree_read":
        return user_pytree_configurations(ctx)
    if suite == "convert":
        return convert.configurations(ctx)  # the suite itself takes the user's TAR and image size
    raise UserDataError(f"--data works with the suites {', '.join(USER_DATA_SUITES)}, not {suite}")
