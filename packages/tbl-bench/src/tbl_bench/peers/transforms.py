"""Image transforms of the on-the-fly PyTorch + PIL pipeline, written with PIL and numpy.

They follow torchvision's definitions (Resize, RandomResizedCrop,
RandomHorizontalFlip, ToTensor + Normalize) so the baseline costs what the
usual torchvision pipeline costs; torchvision itself is not a dependency.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

__all__ = ["AUGMENTATIONS", "EVAL", "EVAL_CROP_RATIO", "IMAGENET_MEAN", "IMAGENET_STD", "normalize_chw", "random_resized_crop_box", "transform_image"]

# plain: resize only; flip: + horizontal flip p=0.5; crop: RandomResizedCrop + flip p=0.5.
AUGMENTATIONS = ("plain", "flip", "crop")

# The evaluation transform, served by the tools that have one (TBL, FFCV) and named apart from the training
# augmentations above: torchvision's Resize(round(size / EVAL_CROP_RATIO)) + CenterCrop(size), 256 -> 224 for
# 224 px. FFCV's CenterCropRGBImageDecoder(ratio=EVAL_CROP_RATIO) crops the same centre square of the photo.
EVAL = "eval"
EVAL_CROP_RATIO = 224 / 256

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def random_resized_crop_box(
    width: int,
    height: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> tuple[int, int, int, int]:
    """(left, top, w, h) drawn as torchvision's RandomResizedCrop.get_params draws it."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target_area * aspect))
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return left, top, w, h
    # Fallback: the central crop with the ratio clamped into range.
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def normalize_chw(img: Image.Image, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> np.ndarray:
    """uint8 HWC -> float32 CHW, (x / 255 - mean) / std per channel (ToTensor + Normalize)."""
    a = np.asarray(img, dtype=np.float32) * np.float32(1 / 255)
    a -= np.asarray(mean, dtype=np.float32)
    a /= np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def transform_image(img: Image.Image, size: int, aug: str, rng: np.random.Generator) -> np.ndarray:
    """One sample through the pipeline for augmentation `aug` ("plain", "flip" or "crop")."""
    if aug not in AUGMENTATIONS:
        raise ValueError(f"aug must be one of {AUGMENTATIONS}, got {aug!r}")
    if aug == "crop":
        left, top, w, h = random_resized_crop_box(img.width, img.height, rng)
        img = img.crop((left, top, left + w, top + h))
    img = img.resize((size, size), Image.BILINEAR)
    if aug in ("flip", "crop") and rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    return normalize_chw(img)
