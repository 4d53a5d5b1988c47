"""litdata 0.2.76 adapters: `optimize` (convert) and `StreamingDataset` + `StreamingDataLoader` (serve).

Conversion stores what TBL stores: each JPEG decoded and resized to size x size
(PIL bilinear) as a uint8 HWC array, plus its label. Serving reads those arrays
back in 2 worker processes, applies the same augmentation and normalization as
the PIL baseline (`transforms.py`) and collates float32 CHW batches.
"""

from __future__ import annotations

import functools
import io
from pathlib import Path

import numpy as np

from tbl_bench.config import SkipConfig
from tbl_bench.conversions import ConversionEpochs
from tbl_bench.peers.epochs import ImageLabelEpochs
from tbl_bench.peers.pil import index_tar
from tbl_bench.peers.transforms import transform_image

__all__ = ["litdata_convert", "litdata_convert_parquet", "litdata_optimize", "litdata_optimize_parquet",
           "litdata_serve"]


def _import_litdata():
    try:
        import litdata
    except ImportError as e:
        raise SkipConfig(f"litdata is not installed (pip install 'tbl-bench[peers]'): {e}") from e
    return litdata


def _decode_resize(item: tuple[int, int, int], tar: str, size: int) -> dict:
    from PIL import Image

    offset, nbytes, label = item
    with open(tar, "rb") as f:
        f.seek(offset)
        data = f.read(nbytes)
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((size, size), Image.BILINEAR)
    return {"image": np.asarray(img), "label": label}


def litdata_optimize(tar: str, dst: str | Path, size: int, workers: int = 2) -> int:
    """Convert the TAR into a litdata optimized directory at `dst`; return the sample count."""
    litdata = _import_litdata()
    spans, labels = index_tar(tar)
    inputs = [(off, n, lab) for (off, n), lab in zip(spans, labels, strict=True)]
    litdata.optimize(
        fn=functools.partial(_decode_resize, tar=str(tar), size=size),
        inputs=inputs,
        output_dir=str(dst),
        chunk_bytes="64MB",
        num_workers=workers,
        verbose=False,
        mode="overwrite",
    )
    return len(inputs)


def _row_group_samples(row_group: int, parquet: str, size: int):
    """Every sample of one Parquet row group (HF-style ``{bytes, path}`` image structs), decoded and resized as
    `_decode_resize` does: one litdata input per row group, as litdata's docs read Parquet in `optimize`."""
    import pyarrow.parquet as pq
    from PIL import Image

    table = pq.ParquetFile(parquet).read_row_group(row_group, columns=["image", "label"])
    for image, label in zip(table.column("image").to_pylist(), table.column("label").to_pylist(), strict=True):
        img = Image.open(io.BytesIO(image["bytes"])).convert("RGB").resize((size, size), Image.BILINEAR)
        yield {"image": np.asarray(img), "label": label}


def litdata_optimize_parquet(parquet: str, dst: str | Path, size: int, workers: int = 2) -> int:
    """Convert a Parquet file of image structs into a litdata optimized directory at `dst`; return the rows."""
    litdata = _import_litdata()
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise SkipConfig(f"pyarrow is not installed in the peers' interpreter: {e}") from e
    meta = pq.ParquetFile(parquet).metadata
    litdata.optimize(
        fn=functools.partial(_row_group_samples, parquet=str(parquet), size=size),
        inputs=list(range(meta.num_row_groups)),
        output_dir=str(dst),
        chunk_bytes="64MB",
        num_workers=workers,
        verbose=False,
        mode="overwrite",
    )
    return meta.num_rows


class _Convert(ConversionEpochs):
    def __init__(self, src: str, size: int, workers: int, count: int, parquet: bool = False):
        _import_litdata()
        self.src, self.size, self.workers, self.parquet = src, size, workers, parquet
        self.items_per_epoch = count
        self.info = {"workers": workers, "source": "parquet" if parquet else "tar"}
        super().__init__("tbl-bench-litdata-convert-", "")

    def convert_into(self, dst: Path) -> int:
        if self.parquet:
            return litdata_optimize_parquet(self.src, dst, self.size, self.workers)
        return litdata_optimize(self.src, dst, self.size, self.workers)


def litdata_convert_parquet(parquet: str, size: int, count: int, workers: int = 2):
    """Workload factory: one `litdata.optimize` of the Parquet file (one input per row group) per epoch."""
    return _Convert(parquet, size, workers, count, parquet=True)


def litdata_convert(tar: str, size: int, count: int, workers: int = 2):
    """Workload factory: one `litdata.optimize` of the TAR per epoch."""
    return _Convert(tar, size, workers, count)


class _Transform:
    """Picklable per-sample transform for StreamingDataset(transform=...)."""

    def __init__(self, size: int, aug: str, seed: int):
        self.size, self.aug, self.seed = size, aug, seed
        self._rng: np.random.Generator | None = None

    def __call__(self, sample: dict):
        from PIL import Image

        if self._rng is None:
            import torch.utils.data

            info = torch.utils.data.get_worker_info()
            self._rng = np.random.default_rng([self.seed, info.seed if info is not None else 0])
        return transform_image(Image.fromarray(sample["image"]), self.size, self.aug, self._rng), sample["label"]


class _Serve(ImageLabelEpochs):
    def __init__(self, path: str, size: int, batch_size: int, aug: str, level: str, workers: int, seed: int):
        litdata = _import_litdata()
        self.level = level
        # A plain local path is read in place; a "local:" URL or a cache_dir would copy the chunks first.
        ds = litdata.StreamingDataset(
            input_dir=str(path), shuffle=True, seed=seed, transform=_Transform(size, aug, seed)
        )
        self.items_per_epoch = len(ds)
        # Persistent workers, as for the PIL baseline: worker start-up is not charged to every epoch.
        self.loader = litdata.StreamingDataLoader(
            ds, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0
        )
        self.info = {"litdata": litdata.__version__, "workers": workers}

    def close(self) -> None:
        self.loader = None


def litdata_serve(path: str, size: int, batch_size: int, aug: str, level: str, workers: int = 2, seed: int = 0):
    """Workload factory: StreamingDataLoader over an optimized directory from `litdata_optimize`."""
    return _Serve(path, size, batch_size, aug, level, workers, seed)
