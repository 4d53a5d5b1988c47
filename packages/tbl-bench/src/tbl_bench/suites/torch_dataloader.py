"""torch.utils.data.DataLoader integration: a .tbl dataset used as a map-style Dataset.

What a user gets by dropping a `tbl_format` dataset into their existing
DataLoader (per-sample reads, per-sample normalization, default collate, 0 or
2 worker processes - the dataset is pickled into each worker), against
ImageLoader's batched path and the PIL baseline. Consume level, no augmentation.
"""

from __future__ import annotations

import numpy as np

from tbl_bench.config import Config, SkipConfig
from tbl_bench.context import BenchContext, DataUnavailable
from tbl_bench.levels import consume_batch
from tbl_bench.peers.transforms import IMAGENET_MEAN, IMAGENET_STD

NAME = "torch"
TITLE = "torch DataLoader integration"
UNIT = "images/s"
COMPARE_ON = ()


class TblImageDataset:
    """Map-style dataset over a converted .tbl: index -> (float32 CHW array, label)."""

    def __init__(self, path: str) -> None:
        import tbl_format

        self.ds = tbl_format.open(path)  # picklable: each worker maps the file again
        v = np.arange(256, dtype=np.float64) / 255
        self.table = ((v[None, :] - np.array(IMAGENET_MEAN)[:, None]) / np.array(IMAGENET_STD)[:, None]).astype(
            np.float32
        )

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        sample = self.ds[i]
        img = sample["image"]  # (H, W, 3) uint8 view into the map
        out = np.empty((3, *img.shape[:2]), dtype=np.float32)
        for c in range(3):
            np.take(self.table[c], img[..., c], out=out[c])
        return out, int(sample["label"])


class _TorchDL:
    def __init__(self, path: str, batch_size: int, workers: int, seed: int):
        try:
            import torch
            import torch.utils.data
        except ImportError as e:
            raise SkipConfig(f"torch is not importable: {e}") from e
        try:
            dataset = TblImageDataset(path)
        except ImportError as e:
            raise SkipConfig(f"tbl_format is not importable: {e}") from e
        self.items_per_epoch = len(dataset)
        g = torch.Generator().manual_seed(seed)
        self.loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
            persistent_workers=workers > 0, generator=g,
        )
        self.info = {"workers": workers}

    def run_epoch(self, epoch: int) -> int:
        n = 0
        for images, _labels in self.loader:
            consume_batch(images, "consume")
            n += images.shape[0]
        return n

    def close(self) -> None:
        self.loader = None


def tbl_in_torch_dataloader(path: str, batch_size: int, workers: int, seed: int = 0):
    """Workload factory: DataLoader(TblImageDataset(path), shuffle, `workers` processes)."""
    return _TorchDL(path, batch_size, workers, seed)


def configurations(ctx: BenchContext) -> list[Config]:
    s = ctx.sizes
    common = {"warmup": s.warmup, "epochs": s.epochs, "unit": UNIT}
    try:
        path, skip = str(ctx.tbl_images(mode="squash")), None
    except DataUnavailable as e:
        path, skip = "", str(e)
    configs = [
        Config(NAME, f"tbl-dataset/workers={w}", "tbl+torch", "tbl_bench.suites.torch_dataloader:tbl_in_torch_dataloader",
               {"path": path, "batch_size": s.batch_size, "workers": w}, skip=skip, **common)
        for w in (0, 2)
    ]
    configs.append(Config(NAME, "tbl-imageloader", "tbl", "tbl_bench.suites.images:tbl_serve",
                          {"path": path, "batch_size": s.batch_size, "aug": "plain", "level": "consume",
                           "size": s.image_size}, skip=skip, **common))
    configs.append(Config(NAME, "pil/workers=2", "pil", "tbl_bench.peers.pil:pil_loader",
                          {"tar": str(ctx.image_tar()), "size": s.image_size, "batch_size": s.batch_size,
                           "aug": "plain", "level": "consume"}, role="baseline", **common))
    return configs
