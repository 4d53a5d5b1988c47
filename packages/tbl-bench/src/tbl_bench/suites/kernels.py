"""The tbl-kernels C++ kernels against memory bandwidth and TurboLoader's kernels.

Every configuration allocates a source of >= 2.2 GB of uint8 images (untimed
setup), draws random indices over all of it and times one batch of 256 per
epoch: after warm-up batches, at least 20 timed batches and more until they
cover one second. Each full run does 3 rounds, round-robin. Configurations:

* ``copy-SIZE`` (ceiling): ``np.copyto`` of a buffer as large as one float32
  batch moves (read + written), single-threaded: the machine's own memory
  bandwidth, same run; its "images" are batches of that many bytes.
* ``tbl-SIZE-DTYPE-Nt``: ``tbl_kernels.gather_normalize`` / ``gather_u8`` at
  1 and 2 threads, float32 / float16 / bfloat16 / uint8, at the level the kernels
  choose; on a machine with the avx512 level, ``tbl-SIZE-float32-Nt-avx2`` pins
  the avx2 level (TBL_KERNELS_SIMD): what the avx512 float32 lookup gains;
  ``tbl-crop-256to224-DTYPE-Nt``: ``gather_crop_resize`` with flips.
* ``turboloader-SIZE-DTYPE``, ``turboloader-crop-256to224-float32`` (with
  ``--peers``, in the peer interpreter): TurboLoader's ``normalize_u8_gather``
  and ``crop_resize_normalize_u8_gather`` on identical inputs; TurboLoader picks
  its own thread count, OMP_NUM_THREADS is set to the requested one.

The module imports only numpy at top level: the peer interpreter runs it.
"""

from __future__ import annotations

import numpy as np

from tbl_bench.config import Config
from tbl_bench.context import BenchContext

NAME = "kernels"
TITLE = "C++ kernels"
UNIT = "images/s"
COMPARE_ON = ("size", "dtype")
ROUNDS = 3

SOURCE_BYTES = int(2.2e9)
BATCH = 256
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
MIN_TIMED_S = 1.0  # keep timing past the minimum batch count until this much wall time is covered
MAX_BATCHES = 2000
_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16, "uint8": np.uint8}


def _make_source(size: int) -> np.ndarray:
    """(N, size, size, 3) uint8 of >= SOURCE_BYTES, filled (pages touched) before timing."""
    per = size * size * 3
    n = -(-SOURCE_BYTES // per)
    src = np.empty((n, size, size, 3), dtype=np.uint8)
    block = np.random.default_rng(0).integers(0, 256, size=(64, size, size, 3), dtype=np.uint8)
    for i in range(0, n, 64):
        m = min(64, n - i)
        src[i : i + m] = block[:m]
    return src


def _boxes(rng: np.random.Generator, b: int, size: int) -> np.ndarray:
    """RandomResizedCrop-style boxes (scale 0.08..1, ratio 3/4..4/3) as (top, left, height, width)."""
    area = size * size * rng.uniform(0.08, 1.0, b)
    ratio = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3), b))
    w = np.clip(np.round(np.sqrt(area * ratio)), 1, size).astype(np.int64)
    h = np.clip(np.round(np.sqrt(area / ratio)), 1, size).astype(np.int64)
    top = (rng.uniform(0, 1, b) * (size - h + 1)).astype(np.int64)
    left = (rng.uniform(0, 1, b) * (size - w + 1)).astype(np.int64)
    return np.stack([top, left, h, w], axis=1).astype(np.int32)


class _Kernel:
    """One kernel call per epoch; epoch i uses input set i % inputs (indices, flips, crop boxes)."""

    def __init__(self, tool: str, op: str, size: int, out_size: int, dtype: str, threads: int, inputs: int):
        np_dtype = _NP_DTYPES[dtype]
        self.items_per_epoch = BATCH
        self.inputs = inputs
        out_elems = BATCH * 3 * out_size * out_size
        moved = BATCH * size * size * 3 + out_elems * np.dtype(np_dtype).itemsize  # read + written per batch
        if op == "copy":
            a = np.empty(moved // 2, np.uint8)
            b = np.empty_like(a)
            a[:] = 1
            b[:] = 2
            self._fn = lambda i: np.copyto(b, a)
            self.info = {"bytes_per_batch": 2 * a.nbytes}
            return
        rng = np.random.default_rng(1)
        src = _make_source(size)
        idx = [rng.integers(0, len(src), BATCH).astype(np.int64) for _ in range(inputs)]
        flips = [rng.integers(0, 2, BATCH).astype(np.uint8) for _ in range(inputs)]
        out = np.empty((BATCH, 3, out_size, out_size), np_dtype)
        out[...] = 0
        boxes = [_boxes(rng, BATCH, size) for _ in range(inputs)] if op == "crop" else None
        if tool == "tbl":
            import tbl_kernels as tk

            tk.set_num_threads(threads)
            table = None if dtype == "uint8" else tk.normalization_table(MEAN, STD, dtype)
            if op == "crop":
                def fn(i):
                    tk.gather_crop_resize([src], idx[i], boxes[i], out, table, flip=flips[i], layout="CHW")
            elif table is None:
                def fn(i):
                    tk.gather_u8([src], idx[i], out, layout="CHW")
            else:
                def fn(i):
                    tk.gather_normalize([src], idx[i], out, table, layout="CHW")
            info = {"simd": tk.simd_level(), "version": tk.__version__}
        elif tool == "turboloader":
            import turboloader as t

            if op == "crop":
                # TurboLoader's crop windows are (x, y, w, h) float32.
                tl_boxes = [bx[:, [1, 0, 3, 2]].astype(np.float32) for bx in boxes]

                def fn(i):
                    t.crop_resize_normalize_u8_gather(src, idx[i], tl_boxes[i], flips[i], out, mean=MEAN, std=STD)
            else:
                def fn(i):
                    t.normalize_u8_gather(src, idx[i], out, mean=MEAN, std=STD)
            info = {"version": getattr(t, "__version__", "?")}
        else:
            raise ValueError(f"tool must be tbl or turboloader, got {tool!r}")
        self._fn = fn
        self.info = {"bytes_per_batch": int(moved), "source_bytes": int(src.nbytes), **info}

    def run_epoch(self, epoch: int) -> int:
        self._fn(epoch % self.inputs)
        return BATCH

    def close(self) -> None:
        self._fn = None


def kernel_batch(tool: str, op: str, size: int, dtype: str, threads: int, inputs: int, out_size: int | None = None,
                 simd: str | None = None):
    """Workload factory: one batch of `op` ("copy", "gather" or "crop") per epoch; `simd` the instruction-set
    level the configuration pinned (TBL_KERNELS_SIMD), checked to be the one the kernels run."""
    if simd is not None:
        import tbl_kernels

        if tbl_kernels.simd_level() != simd:
            raise RuntimeError(f"the kernels run at {tbl_kernels.simd_level()!r}, not the pinned {simd!r}")
    return _Kernel(tool, op, size, out_size or size, dtype, threads, inputs)


def configurations(ctx: BenchContext) -> list[Config]:
    import tbl_kernels

    levels = tbl_kernels.simd_levels()
    batches, warmup = (5, 2) if ctx.quick else (20, 3)
    configs = []

    def add(name: str, tool: str, op: str, size: int, dtype: str, threads: int, out_size: int | None = None,
            role: str = "subject", simd: str | None = None) -> None:
        params = {"tool": tool, "op": op, "size": size, "dtype": dtype, "threads": threads,
                  "inputs": warmup + batches}
        if out_size is not None:
            params["out_size"] = out_size
        env = {"OMP_NUM_THREADS": str(threads)}
        if simd is not None:  # a pinned instruction-set level (tbl_kernels reads it at import)
            params["simd"] = simd
            env["TBL_KERNELS_SIMD"] = simd
        configs.append(Config(NAME, name, tool, "tbl_bench.suites.kernels:kernel_batch", params, role=role,
                              warmup=warmup, epochs=batches, min_time_s=MIN_TIMED_S, max_epochs=MAX_BATCHES,
                              unit=UNIT, peer=tool == "turboloader", rss=False, preimport=["numpy"],
                              env=env))

    for size in (224,) if ctx.quick else (160, 224):
        add(f"copy-{size}", "numpy", "copy", size, "float32", 1, role="ceiling")
        for threads in (1, 2):
            for dtype in ("float32", "float16", "bfloat16", "uint8"):
                add(f"tbl-{size}-{dtype}-{threads}t", "tbl", "gather", size, dtype, threads)
            # float32 at the avx2 level: what the avx512 level's lookup in registers gains
            if "avx512" in levels:
                add(f"tbl-{size}-float32-{threads}t-avx2", "tbl", "gather", size, "float32", threads, simd="avx2")
        if ctx.peers:
            for dtype in ("float32", "float16"):
                add(f"turboloader-{size}-{dtype}", "turboloader", "gather", size, dtype, 2)
    for threads in (1, 2):
        for dtype in ("float32", "float16", "uint8"):
            add(f"tbl-crop-256to224-{dtype}-{threads}t", "tbl", "crop", 256, dtype, threads, out_size=224)
    if ctx.peers:
        add("turboloader-crop-256to224-float32", "turboloader", "crop", 256, "float32", 2, out_size=224)
    return configs


def ratios(results: dict[str, dict]) -> dict[str, float]:
    """Same-run ratios between configurations: dtypes (bfloat16 against float16 too), threads, the copy ceiling
    and TurboLoader."""

    def rate(name):
        r = results.get(name)
        return r["throughput"] if r else None

    def gbs(name):
        r = results.get(name)
        return r["info"]["bytes_per_batch"] / r["median_s"] / 1e9 if r else None

    out = {}
    for size in (160, 224):
        for threads in (1, 2):
            if rate(f"tbl-{size}-bfloat16-{threads}t") and rate(f"tbl-{size}-float16-{threads}t"):
                out[f"{size}: bfloat16 vs float16 images/s ({threads}t)"] = (rate(f"tbl-{size}-bfloat16-{threads}t")
                                                                             / rate(f"tbl-{size}-float16-{threads}t"))
        f32 = f"tbl-{size}-float32-2t"
        if f32 not in results:
            continue
        if gbs(f"copy-{size}"):
            out[f"{size}: float32 2t bytes/s vs copy"] = gbs(f32) / gbs(f"copy-{size}")
        for dtype in ("float16", "bfloat16", "uint8"):
            if rate(f"tbl-{size}-{dtype}-2t"):
                out[f"{size}: {dtype} vs float32 images/s (2t)"] = rate(f"tbl-{size}-{dtype}-2t") / rate(f32)
        for dtype in ("float32", "float16"):
            if rate(f"turboloader-{size}-{dtype}") and rate(f"tbl-{size}-{dtype}-2t"):
                out[f"{size}: {dtype} tbl 2t vs turboloader"] = (rate(f"tbl-{size}-{dtype}-2t")
                                                                 / rate(f"turboloader-{size}-{dtype}"))
        if rate(f"tbl-{size}-float32-1t"):
            out[f"{size}: float32 2t vs 1t"] = rate(f32) / rate(f"tbl-{size}-float32-1t")
        for threads in (1, 2):
            if rate(f"tbl-{size}-float32-{threads}t") and rate(f"tbl-{size}-float32-{threads}t-avx2"):
                out[f"{size}: float32 at the chosen level vs avx2 ({threads}t)"] = (
                    rate(f"tbl-{size}-float32-{threads}t") / rate(f"tbl-{size}-float32-{threads}t-avx2"))
    crop = "tbl-crop-256to224-float32"
    if rate(f"{crop}-2t") and rate(f"{crop}-1t"):
        out["crop float32 2t vs 1t"] = rate(f"{crop}-2t") / rate(f"{crop}-1t")
    if rate("turboloader-crop-256to224-float32") and rate(f"{crop}-2t"):
        out["crop float32 tbl 2t vs turboloader"] = rate(f"{crop}-2t") / rate("turboloader-crop-256to224-float32")
    return out
