"""TurboLoader 2.39 adapters: `preprocess_to_tbl` (convert) and `TblRawImageLoader` (serve).

TurboLoader's RAW_U8 `.tbl` stores decoded, resized uint8 images like TBL does;
serving maps the file and runs its fused SIMD gather + normalize (and, with
`train_aug`, RandomResizedCrop + flip) with a background prefetch thread.
Labels are not stored by `preprocess_to_tbl`; the loader yields sample indices.
"""

from __future__ import annotations

from pathlib import Path

from tbl_bench.config import SkipConfig
from tbl_bench.conversions import ConversionEpochs
from tbl_bench.levels import consume_batch

__all__ = ["import_turboloader", "turbo_convert", "turbo_preprocess", "turbo_serve"]


def import_turboloader():
    try:
        import turboloader
    except ImportError as e:
        raise SkipConfig(f"turboloader is not installed (pip install 'tbl-bench[peers]'): {e}") from e
    return turboloader


def turbo_preprocess(tar: str, dst: str, size: int, workers: int = 2) -> int:
    """`preprocess_to_tbl` of the TAR into `dst` (the served data of the images and train suites)."""
    return import_turboloader().preprocess_to_tbl(str(tar), str(dst), image_size=size, num_workers=workers)


class _Convert(ConversionEpochs):
    def __init__(self, tar: str, size: int, workers: int, count: int):
        self.t = import_turboloader()
        self.tar, self.size, self.workers = tar, size, workers
        self.items_per_epoch = count
        self.info = {"workers": workers}
        super().__init__("tbl-bench-tl-convert-", ".tbl")

    def convert_into(self, dst: Path) -> int:
        return self.t.preprocess_to_tbl(self.tar, dst, image_size=self.size, num_workers=self.workers)


def turbo_convert(tar: str, size: int, count: int, workers: int = 2):
    """Workload factory: one `preprocess_to_tbl` of the TAR per epoch."""
    return _Convert(tar, size, workers, count)


class _Serve:
    def __init__(self, path: str, batch_size: int, aug: str, level: str, seed: int, prefetch: int):
        t = import_turboloader()
        from turboloader.tbl import TblRawImageLoader

        if aug not in ("plain", "flip", "crop"):
            raise ValueError(f"aug must be plain, flip or crop, got {aug!r}")
        self.level = level
        self.loader = TblRawImageLoader(
            path,
            batch_size,
            shuffle=True,
            seed=seed,
            hflip_prob=0.0 if aug == "plain" else 0.5,
            train_aug=aug == "crop",
            prefetch_batches=prefetch,
        )
        self.items_per_epoch = self.loader.num_samples
        self.info = {"turboloader": t.__version__, "prefetch": prefetch}

    def run_epoch(self, epoch: int) -> int:
        self.loader.set_epoch(epoch)
        n = 0
        for images, _meta in self.loader:
            consume_batch(images, self.level)
            n += images.shape[0]
        return n

    def close(self) -> None:
        self.loader.close()


def turbo_serve(path: str, batch_size: int, aug: str, level: str, seed: int = 0, prefetch: int = 2,
                size: int | None = None):
    """Workload factory: TblRawImageLoader over a RAW_U8 `.tbl` from `preprocess_to_tbl`.

    `size` is the stored image size of `path`; it only labels the result (the file knows its size)."""
    return _Serve(path, batch_size, aug, level, seed, prefetch)
