"""The baseline users have today: a PyTorch DataLoader decoding JPEGs from a TAR with PIL every epoch.

Workers read each member by its offset in the TAR (indexed once), decode with
PIL, apply the torchvision-equivalent transforms of `transforms.py` and collate
float32 CHW batches. Two workers by default, like a small training box.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np

from tbl_bench.config import SkipConfig
from tbl_bench.peers.epochs import ImageLabelEpochs
from tbl_bench.peers.transforms import transform_image

__all__ = ["PilTarDataset", "index_tar", "pil_loader"]


def index_tar(path: str | Path) -> tuple[list[tuple[int, int]], list[int]]:
    """(offset, size) of every JPEG in the TAR, in order, and its class from the nXXXXXXXX/ directory."""
    spans, labels = [], []
    with tarfile.open(path) as tar:
        for m in tar:
            if m.isfile():
                spans.append((m.offset_data, m.size))
                labels.append(int(m.name.split("/", 1)[0][1:]))
    return spans, labels


class PilTarDataset:
    """Map-style dataset: index -> (float32 CHW array, label). Opens the TAR lazily in each worker."""

    def __init__(self, path: str | Path, size: int, aug: str, seed: int = 0) -> None:
        self.path = str(path)
        self.size = size
        self.aug = aug
        self.seed = seed
        self.spans, self.labels = index_tar(path)
        self._file = None
        self._rng: np.random.Generator | None = None

    def __len__(self) -> int:
        return len(self.spans)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_file"] = None  # each worker opens its own handle
        state["_rng"] = None
        return state

    def _worker_rng(self) -> np.random.Generator:
        if self._rng is None:
            import torch.utils.data

            info = torch.utils.data.get_worker_info()
            self._rng = np.random.default_rng([self.seed, info.seed if info is not None else 0])
        return self._rng

    def __getitem__(self, i: int):
        from PIL import Image

        if self._file is None:
            self._file = open(self.path, "rb")
        offset, size = self.spans[i]
        self._file.seek(offset)
        img = Image.open(io.BytesIO(self._file.read(size))).convert("RGB")
        return transform_image(img, self.size, self.aug, self._worker_rng()), self.labels[i]


class _PilWorkload(ImageLabelEpochs):
    def __init__(self, tar: str, size: int, batch_size: int, aug: str, level: str, workers: int, seed: int):
        try:
            import torch
            import torch.utils.data
        except ImportError as e:
            raise SkipConfig(f"torch is not importable: {e}") from e
        self._torch = torch
        self.level = level
        self.dataset = PilTarDataset(tar, size, aug, seed)
        self.items_per_epoch = len(self.dataset)
        gen = torch.Generator()
        gen.manual_seed(seed)
        self.loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
            generator=gen,
        )
        self.info = {"workers": workers}

    def close(self) -> None:
        # Persistent workers stop when the iterator is collected; drop every reference now.
        self.loader = None


def pil_loader(tar: str, size: int, batch_size: int, aug: str, level: str, workers: int = 2, seed: int = 0):
    """Workload factory: DataLoader(PilTarDataset, shuffle, `workers` processes)."""
    return _PilWorkload(tar, size, batch_size, aug, level, workers, seed)
