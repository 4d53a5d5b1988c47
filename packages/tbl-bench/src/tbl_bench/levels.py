"""The two consumption levels every loader is measured at, with the same consumer for all.

produce: touch one element of the batch. Measures how fast batches are handed
         over; a loader that defers work (lazy views) looks fast here.
consume: reduce every element (np.sum / torch.sum). Every byte of the batch is
         read once, so deferred work is paid and batches can be compared.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["LEVELS", "consume_batch"]

LEVELS = ("produce", "consume")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def consume_batch(images: Any, level: str) -> float:
    """Apply `level` to one batch of images (numpy array or torch tensor); returns a scalar."""
    if level == "produce":
        if _is_torch(images):
            return float(images.reshape(-1)[0].item())
        return float(np.asarray(images).reshape(-1)[0])
    if level == "consume":
        if _is_torch(images):
            import torch

            return float(torch.sum(images).item())
        return float(np.sum(images))
    raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
