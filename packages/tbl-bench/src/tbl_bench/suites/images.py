"""Image serving: batches per second from converted data, at both levels, plain / flip / crop.

Subjects: TBL's ImageLoader; a hand-written numpy pipeline over the same
column (np.take + lookup table + transpose: what a user writes without the
kernels); with --peers TurboLoader, litdata, Mosaic streaming, webdataset and
FFCV (skipped with the import error where it does not import), each serving
its own converted copy of the same images.
Baseline: the PyTorch DataLoader + PIL pipeline decoding the TAR every epoch
(2 workers). Ceiling: copying the batch's output bytes (float32 CHW) from a
buffer larger than the caches - no loader that writes float32 batches can beat
it. Same data, same batch size and the same consumer for all.

TBL and TurboLoader crop from the stored size x size image; the PIL, litdata,
Mosaic streaming and webdataset pipelines crop from the image they decode (the
full photo for PIL, the stored image for the others); FFCV crops inside its
decoder from the stored image.
"""

from __future__ import annotations

import numpy as np

from tbl_bench.config import Config, SkipConfig
from tbl_bench.context import BenchContext, DataUnavailable
from tbl_bench.levels import LEVELS, consume_batch
from tbl_bench.peers.transforms import AUGMENTATIONS, EVAL, EVAL_CROP_RATIO, IMAGENET_MEAN, IMAGENET_STD

NAME = "images"
TITLE = "Image serving"
UNIT = "images/s"
COMPARE_ON = ("level", "aug", "size")

# Plain and flip are served at the stored size; crop is RandomResizedCrop to 224 px
# from 256-px storage (TBL) or from the decoded photo (PIL, litdata).
CROP_STORAGE, CROP_OUTPUT = 256, 224
SLOW_TOOLS = ("pil", "litdata", "mosaic", "webdataset")

_RING_BYTES = 256 << 20


# Output dtype -> a numpy type of the same width: the ceiling copies the same number of bytes.
_COPY_TYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8}


class _MemcpyCeiling:
    """Copy each batch's output bytes out of a 256 MiB ring (so they come from DRAM, not cache)."""

    def __init__(self, count: int, batch_size: int, size: int, level: str, dtype: str = "float32"):
        self.items_per_epoch = count
        self.batch_size, self.level = batch_size, level
        per_image = 3 * size * size
        copy_type = _COPY_TYPES[dtype]
        itemsize = np.dtype(copy_type).itemsize
        self.ring = np.ones(max(_RING_BYTES // itemsize, batch_size * per_image), dtype=copy_type)
        self.out = np.empty((batch_size, 3, size, size), dtype=copy_type)
        self.per_batch = batch_size * per_image
        self.info = {"ring_bytes": self.ring.nbytes}

    def run_epoch(self, epoch: int) -> int:
        n, pos = 0, 0
        while n < self.items_per_epoch:
            k = min(self.batch_size, self.items_per_epoch - n)
            m = k * self.per_batch // self.batch_size
            if pos + m > self.ring.size:
                pos = 0
            dst = self.out.reshape(-1)[:m]
            np.copyto(dst, self.ring[pos : pos + m])
            consume_batch(self.out[:k], self.level)
            pos += m
            n += k
        return n

    def close(self) -> None:
        self.ring = self.out = None


def memcpy_ceiling(count: int, batch_size: int, size: int, level: str, dtype: str = "float32"):
    """Workload factory: the memory-copy ceiling for CHW batches of `size` in `dtype` (its bytes per element)."""
    if dtype not in _COPY_TYPES:
        raise ValueError(f"dtype must be one of {tuple(_COPY_TYPES)}, got {dtype!r}")
    return _MemcpyCeiling(count, batch_size, size, level, dtype)


def _image_loader():
    try:
        from tbl_loader import ImageLoader
    except ImportError as e:
        raise SkipConfig(f"tbl_loader.ImageLoader is not importable: {e}") from e
    return ImageLoader


def _crop_spec(size: int):
    try:
        from tbl_loader import RandomResizedCrop
    except ImportError as e:
        raise SkipConfig(f"tbl_loader.RandomResizedCrop is not importable: {e}") from e
    return RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))


class _TblServe:
    def __init__(self, path: str, batch_size: int, aug: str, level: str, size: int, seed: int, threads, device,
                 verify: str = "never", reopen: bool = False, dtype: str = "float32",
                 fields: bool = False, jpeg_dct: str = "accurate", stage_timing: bool = True,
                 jpeg_decode: str = "kernel"):
        ImageLoader = _image_loader()
        if jpeg_decode == "threads":  # JPEG rows decoded as on kernels without the JPEG decode (tbl-kernels 0.2)
            _thread_pool_jpeg_decode()
        elif jpeg_decode != "kernel":
            raise ValueError(f"jpeg_decode must be 'kernel' or 'threads', got {jpeg_decode!r}")
        if aug not in (*AUGMENTATIONS, EVAL):
            raise ValueError(f"aug must be one of {(*AUGMENTATIONS, EVAL)}, got {aug!r}")
        kwargs = {"fields": FIELDS} if fields else {}
        if aug in ("flip", "crop"):
            kwargs["hflip"] = 0.5
        if aug == "crop":
            kwargs["random_resized_crop"] = _crop_spec(size)
        if aug == EVAL:  # torchvision's Resize + CenterCrop, no flip
            kwargs["resize"], kwargs["center_crop"] = round(size / EVAL_CROP_RATIO), size
        self.level = level
        import tbl_format

        ds = tbl_format.open(path)
        self.items_per_epoch = len(ds)
        ds.close()
        if device is not None:
            kwargs["device"] = device
        if verify != "never":
            kwargs["verify"] = verify
        if dtype != "float32":
            kwargs["dtype"] = dtype
        if jpeg_dct != "accurate":
            kwargs["jpeg_dct"] = jpeg_dct
        # reopen: a new loader (fresh maps, nothing verified yet) every epoch, so each timed epoch
        # pays what a first epoch pays.
        def open_loader():
            loader = ImageLoader(path, batch_size, shuffle=True, seed=seed, num_threads=threads, **kwargs)
            if not stage_timing:  # the per-stage clocks off: what leaving them on costs (loader.stats())
                loader.time_stages(False)
            return loader

        self.open_loader = open_loader
        self.reopen = reopen
        self.loader = self.open_loader()
        self.info = {"num_threads": threads, "device": device, "verify": verify, "reopen": reopen, "dtype": dtype,
                     "stage_timing": stage_timing, "jpeg_decode": jpeg_decode,
                     **({"jpeg_dct": jpeg_dct} if jpeg_dct != "accurate" else {})}

    def run_epoch(self, epoch: int) -> int:
        if self.reopen:
            self.loader.close()
            self.loader = self.open_loader()
        self.loader.set_epoch(epoch)
        n = 0
        for batch in self.loader:
            consume_batch(batch.images, self.level)
            for value in batch.fields.values():  # touched, as a training step would read them
                len(value)
            n += batch.images.shape[0]
        return n

    def close(self) -> None:
        self.loader.close()


def _thread_pool_jpeg_decode() -> None:
    """This process serves JPEG storage as on kernels without the JPEG decode (tbl-kernels 0.2): whole rows
    decoded by simplejpeg in a thread pool, then the crop-resize kernel. The kernels' JPEG calls are hidden
    from the loader, which then takes that path (each configuration runs in its own process)."""
    import tbl_kernels

    tbl_kernels.decode_crop_resize_jpegs = tbl_kernels.decode_resize_crop_jpegs = None


def tbl_serve(path: str, batch_size: int, aug: str, level: str, size: int, seed: int = 0, threads=None, device=None,
              verify: str = "never", reopen: bool = False, dtype: str = "float32",
              fields: bool = False, jpeg_dct: str = "accurate", stage_timing: bool = True,
              jpeg_decode: str = "kernel"):
    """Workload factory: tbl_loader.ImageLoader over a converted .tbl (batches moved to `device` if given).

    `aug` is one of AUGMENTATIONS or EVAL (the evaluation transform, Resize(round(size / EVAL_CROP_RATIO)) +
    CenterCrop(size)); `size` is the output size of crop and eval; plain and flip serve the stored size.
    `verify` is the loader's data-checksum mode; `reopen` makes a new loader every epoch (first-epoch cost);
    `dtype` the output dtype; `fields` serves FIELDS beside the images (a dataset written by
    `write_fields_dataset`); `jpeg_dct` the IDCT of JPEG storage ("accurate" or "fast"); `stage_timing=False`
    turns the loader's per-stage clocks off (`loader.time_stages(False)`), to measure what they cost;
    `jpeg_decode="threads"` serves JPEG storage by the thread-pool decode of kernels before 0.3 instead of the
    kernels' own (`"kernel"`, where they have it)."""
    return _TblServe(path, batch_size, aug, level, size, seed, threads, device, verify, reopen, dtype, fields,
                     jpeg_dct, stage_timing, jpeg_decode)


class _JpegDecodeCeiling:
    """simplejpeg decoding every stored JPEG row whole (full scale, RGB), on `threads` threads: what decoding
    the same bytes costs with nothing else done (no crop, no resize, no batch)."""

    def __init__(self, path: str, threads: int):
        try:
            import simplejpeg

            import tbl_format
        except ImportError as e:
            raise SkipConfig(f"the decode ceiling needs simplejpeg and tbl_format: {e}") from e
        from concurrent.futures import ThreadPoolExecutor

        self.ds = tbl_format.open(path)
        self.items_per_epoch = len(self.ds)
        self.blobs = [bytes(b) for b in self.ds.values("image", list(range(self.items_per_epoch)))]
        self.decode = simplejpeg.decode_jpeg
        self.pool = ThreadPoolExecutor(threads)
        self.threads = threads
        self.info = {"num_threads": threads, "decoder": f"simplejpeg {simplejpeg.__version__}"}

    def run_epoch(self, epoch: int) -> int:
        blobs, decode = self.blobs, self.decode
        step = -(-len(blobs) // self.threads)

        def part(k: int) -> int:
            for b in blobs[k * step : (k + 1) * step]:
                decode(b, "RGB")
            return min(len(blobs), (k + 1) * step) - k * step

        return sum(self.pool.map(part, range(self.threads)))

    def close(self) -> None:
        self.pool.shutdown()
        self.ds.close()


def jpeg_decode_ceiling(path: str, threads: int = 2, **_: object):
    """Workload factory: the decode-only ceiling of JPEG storage (`_JpegDecodeCeiling`)."""
    return _JpegDecodeCeiling(path, threads)


FIELDS = ("orig_size", "score", "path")
"""Extra leaves of the fields configurations: two fixed-size ((2,) int64, float64) and one string."""


def write_fields_dataset(src: str, dst: str) -> None:
    """The converted dataset `src` again with FIELDS added to every row (the fields configurations read it)."""
    import tbl_format

    with tbl_format.open(src) as ds:
        rows = ({**row, "orig_size": np.array([480 + i % 7, 640 - i % 5], np.int64), "score": i / 7.0,
                 "path": f"train/n{i % 10:08d}/img_{i:06d}.JPEG"} for i, row in enumerate(ds))
        tbl_format.write(rows, dst, shard_rows=max(1, len(ds) // 2))


class _NumpyReference:
    """What a user writes by hand over the same column: gather, table lookup, HWC -> CHW."""

    def __init__(self, path: str, batch_size: int, level: str, seed: int):
        try:
            import tbl_format
        except ImportError as e:
            raise SkipConfig(f"tbl_format is not importable: {e}") from e
        self.ds = tbl_format.open(path)
        self.column = np.concatenate(self.ds.segments("image")) if len(self.ds.segment_rows) > 1 else (
            self.ds.segments("image")[0]
        )
        self.items_per_epoch = len(self.ds)
        self.batch_size, self.level, self.seed = batch_size, level, seed
        v = np.arange(256, dtype=np.float64) / 255
        self.table = ((v[None, :] - np.array(IMAGENET_MEAN)[:, None]) / np.array(IMAGENET_STD)[:, None]).astype(
            np.float32
        )
        self.info = {}

    def run_epoch(self, epoch: int) -> int:
        order = np.random.default_rng([self.seed, epoch]).permutation(self.items_per_epoch)
        n = 0
        for start in range(0, len(order), self.batch_size):
            u8 = np.take(self.column, order[start : start + self.batch_size], axis=0)  # (B, H, W, 3)
            out = np.empty((u8.shape[0], 3, *u8.shape[1:3]), dtype=np.float32)
            for c in range(3):
                np.take(self.table[c], u8[..., c], out=out[:, c])
            consume_batch(out, self.level)
            n += u8.shape[0]
        return n

    def close(self) -> None:
        self.column = None
        self.ds.close()


def numpy_reference(path: str, batch_size: int, level: str, aug: str = "plain", seed: int = 0, size: int | None = None):
    """Workload factory: the numpy reference pipeline over the converted .tbl's image column (plain only)."""
    if aug != "plain":
        raise ValueError(f"the numpy reference implements aug='plain' only, got {aug!r}")
    return _NumpyReference(path, batch_size, level, seed)  # `size` only labels the result


def serve_sizes(ctx: BenchContext) -> tuple[int, ...]:
    """Stored (= served) image sizes of the plain and flip configurations."""
    return (ctx.sizes.image_size,) if ctx.quick else (160, 224)


def _augs_at(ctx: BenchContext) -> list[tuple[str, int]]:
    """(aug, output size) pairs: plain and flip at every serve size, crop at CROP_OUTPUT."""
    pairs = [(aug, size) for size in serve_sizes(ctx) for aug in AUGMENTATIONS if aug != "crop"]
    return pairs + [("crop", CROP_OUTPUT)]


def configurations(ctx: BenchContext) -> list[Config]:
    s = ctx.sizes
    common = {"warmup": s.warmup, "epochs": s.epochs, "unit": UNIT}

    def cfg(name, tool, target, params, role="subject", skip=None, peer=False):
        # The decode-every-epoch pipelines run ~100x slower; fewer epochs keep a full run
        # within the hour, and their spread (min/max) is reported like everyone else's.
        epochs = {**common, "epochs": min(2, s.epochs)} if tool in SLOW_TOOLS else common
        return Config(NAME, name, tool, target, params, role=role, skip=skip, peer=peer, **epochs)

    def tbl_path(size: int, mode: str) -> tuple[str, str | None]:
        try:
            return str(ctx.tbl_images(size=size, mode=mode)), None
        except DataUnavailable as e:
            return "", str(e)

    configs = []
    count = s.images
    for size in sorted({size for _, size in _augs_at(ctx)}):
        for level in LEVELS:
            configs.append(cfg(f"memcpy/{level}/{size}", "memcpy", "tbl_bench.suites.images:memcpy_ceiling",
                               {"count": count, "batch_size": s.batch_size, "size": size, "level": level},
                               role="ceiling"))
    tar = str(ctx.image_tar())
    for aug, size in _augs_at(ctx):
        path, skip = tbl_path(CROP_STORAGE, "center_crop") if aug == "crop" else tbl_path(size, "squash")
        for level in LEVELS:
            configs.append(cfg(f"tbl/{level}/{aug}/{size}", "tbl", "tbl_bench.suites.images:tbl_serve",
                               {"path": path, "batch_size": s.batch_size, "aug": aug, "level": level,
                                "size": size}, skip=skip))
            if aug == "plain" and level == "consume":
                # The cost of verify="lazy": steady state (blocks checked in the warm-up epoch), and a
                # first epoch (a new loader every epoch), each next to "never" measured the same way.
                # The cost of the per-stage clocks (loader.stats()): the same loader with them off.
                for suffix, extra in (("verify-lazy", {"verify": "lazy"}), ("reopen", {"reopen": True}),
                                      ("reopen-verify-lazy", {"verify": "lazy", "reopen": True}),
                                      ("stats-off", {"stage_timing": False})):
                    configs.append(cfg(f"tbl/{level}/{aug}/{size}/{suffix}", "tbl",
                                       "tbl_bench.suites.images:tbl_serve",
                                       {"path": path, "batch_size": s.batch_size, "aug": aug, "level": level,
                                        "size": size, **extra}, skip=skip))
            if aug == "plain" and level == "consume" and not skip:
                # The cost of extra fields: the same dataset with FIELDS added, served with and without them.
                fields_path = str(ctx.artifact(f"images-fields-{size}", {"kind": "images-fields", "src": path},
                                               lambda p, src=path: write_fields_dataset(src, str(p))))
                for suffix, on in (("images-only", False), ("fields", True)):
                    configs.append(cfg(f"tbl/{level}/{aug}/{size}/{suffix}", "tbl",
                                       "tbl_bench.suites.images:tbl_serve",
                                       {"path": fields_path, "batch_size": s.batch_size, "aug": aug, "level": level,
                                        "size": size, "fields": on}))
            if aug == "plain":
                configs.append(cfg(f"numpy/{level}/plain/{size}", "numpy", "tbl_bench.suites.images:numpy_reference",
                                   {"path": path, "batch_size": s.batch_size, "level": level, "aug": "plain",
                                    "size": size}, skip=skip))
        levels = LEVELS if aug == "plain" else ("consume",)
        for level in levels:
            configs.append(cfg(f"pil/{level}/{aug}/{size}", "pil", "tbl_bench.peers.pil:pil_loader",
                               {"tar": tar, "size": size, "batch_size": s.batch_size, "aug": aug,
                                "level": level}, role="baseline"))
    if ctx.peers:
        configs += peer_configurations(ctx, cfg)
    return configs


def peer_configurations(ctx: BenchContext, cfg) -> list[Config]:
    s = ctx.sizes
    configs = []
    for aug, size in _augs_at(ctx):
        # TurboLoader's train_aug crops to the stored size, so its crop runs on 224-px storage.
        try:
            tl_path, tl_skip = str(ctx.turbo_images(size)), None
        except DataUnavailable as e:
            tl_path, tl_skip = "", str(e)
        for level in LEVELS:
            configs.append(cfg(f"turboloader/{level}/{aug}/{size}", "turboloader",
                               "tbl_bench.peers.turbo:turbo_serve",
                               {"path": tl_path, "batch_size": s.batch_size, "aug": aug, "level": level,
                                "size": size}, skip=tl_skip, peer=True))
        try:
            ld_path, ld_skip = str(ctx.litdata_images(size)), None
        except DataUnavailable as e:
            ld_path, ld_skip = "", str(e)
        configs.append(cfg(f"litdata/consume/{aug}/{size}", "litdata", "tbl_bench.peers.litdata_peer:litdata_serve",
                           {"path": ld_path, "size": size, "batch_size": s.batch_size, "aug": aug,
                            "level": "consume"}, skip=ld_skip, peer=True))
        # Mosaic streaming and webdataset run the PIL baseline's per-sample transforms in 2 DataLoader
        # workers (like litdata); FFCV runs its own compiled pipeline, so it is measured at both levels.
        for tool, prepare, target, extra in (
                ("mosaic", ctx.mosaic_images, "tbl_bench.peers.mosaic_peer:mosaic_serve", {}),
                ("webdataset", ctx.webdataset_images, "tbl_bench.peers.webdataset_peer:webdataset_serve",
                 {"count": s.images})):
            path, skip = _peer_data(prepare, size)
            configs.append(cfg(f"{tool}/consume/{aug}/{size}", tool, target,
                               {"path": path, "size": size, "batch_size": s.batch_size, "aug": aug,
                                "level": "consume", **extra}, skip=skip, peer=True))
        ffcv_path, ffcv_skip = _peer_data(ctx.ffcv_images, size)
        for level in LEVELS:
            configs.append(cfg(f"ffcv/{level}/{aug}/{size}", "ffcv", "tbl_bench.peers.ffcv_peer:ffcv_serve",
                               {"path": ffcv_path, "size": size, "batch_size": s.batch_size, "aug": aug,
                                "level": level}, skip=ffcv_skip, peer=True))
    return configs


def _peer_data(prepare, size: int) -> tuple[str, str | None]:
    """(path, None) of a peer's converted copy of the images, or ("", why it could not be made)."""
    try:
        return str(prepare(size)), None
    except DataUnavailable as e:
        return "", str(e)
