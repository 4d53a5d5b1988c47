"""The converted form every peer stores: each JPEG of the TAR decoded and resized to size x size.

This is what TBL, TurboLoader and litdata store too (PIL bilinear squash to a
uint8 HWC array, plus the class label), so the serving comparisons read the
same pixels. `SampleTransform` then gives every peer the same augmentation and
normalization as the PIL baseline (`transforms.py`), with a random generator
per DataLoader worker.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np

from tbl_bench.peers.pil import index_tar
from tbl_bench.peers.transforms import transform_image

__all__ = ["SampleTransform", "decode_resize", "decoded_images"]


def decode_resize(data: bytes, size: int) -> np.ndarray:
    """One JPEG's bytes -> uint8 (size, size, 3), PIL bilinear."""
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB").resize((size, size), Image.BILINEAR)
    return np.asarray(img)


def decoded_images(tar: str, size: int) -> Iterator[tuple[np.ndarray, int]]:
    """(uint8 HWC image, label) for every JPEG of an ImageNet-layout TAR, in TAR order."""
    spans, labels = index_tar(tar)
    with open(tar, "rb") as f:
        for (offset, nbytes), label in zip(spans, labels, strict=True):
            f.seek(offset)
            yield decode_resize(f.read(nbytes), size), label


class SampleTransform:
    """Picklable: uint8 HWC array -> float32 CHW through the PIL baseline's augmentation `aug`."""

    def __init__(self, size: int, aug: str, seed: int):
        self.size, self.aug, self.seed = size, aug, seed
        self._rng: np.random.Generator | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_rng": None}  # each worker draws from its own generator

    def __call__(self, image: np.ndarray) -> np.ndarray:
        from PIL import Image

        if self._rng is None:
            import torch.utils.data

            info = torch.utils.data.get_worker_info()
            self._rng = np.random.default_rng([self.seed, info.seed if info is not None else 0])
        return transform_image(Image.fromarray(image), self.size, self.aug, self._rng)
