"""How far TBL's evaluation transform is from torchvision's Resize(R) + CenterCrop(C) on the same pixels.

    python -m tbl_bench.eval_transform DATASET [--rows 1000] [--resize 256] [--crop 224]

DATASET is a variable-size dataset (``tbl convert --max-size N``, raw or JPEG
storage). TBL's side: ``ImageLoader(..., resize=R, center_crop=C,
dtype="uint8")``: one ``resize_crop_images`` call on the windows
`tbl_loader.image.spec.resized_center_crop_windows` gives.

The reference is what torchvision does to a PIL image, on the same decoded
pixels (raw rows as stored; JPEG rows decoded as the loader decodes them at
full scale, simplejpeg ``decode_jpeg(data, "RGB", strict=True)``): ``Resize(R)`` sets the
shorter side to R and the longer to ``int(R * long / short)`` and calls
Pillow's ``Image.resize((w', h'), BILINEAR)`` (returning the image unchanged
when it already has that size); ``CenterCrop(C)`` takes
``top = int(round((h' - C) / 2))``. torchvision itself is not imported (its
wheel must match the torch build exactly); those few lines are its code path
for PIL images. Both sides are then normalized with the ImageNet table.

Printed (JSON): the largest and mean absolute differences in uint8 levels and
in normalized float32 units, the share of values that differ at all and by more
than one level, and, for JPEG storage, how many rows the loader decoded at a
reduced DCT scale (those are not the same decoded pixels; 0 for 256-pixel
storage at R=256, C=224). A second block gives the same figures against
torchvision's tensor path (``interpolate(bilinear, antialias=True)``, rounded
to uint8), for information, when torch imports.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

__all__ = ["main"]


def _resized_size(h: int, w: int, resize: int) -> tuple[int, int]:
    """torchvision's ``_compute_resized_output_size`` for an int size: ``(new_h, new_w)``."""
    short, long_ = (w, h) if w <= h else (h, w)
    new_short, new_long = resize, int(resize * long_ / short)
    return (new_long, new_short) if w <= h else (new_short, new_long)


def _center_crop(image: np.ndarray, crop: int) -> np.ndarray:
    """torchvision's ``center_crop`` of an HWC array (crop <= both sides)."""
    h, w = image.shape[:2]
    top, left = int(round((h - crop) / 2.0)), int(round((w - crop) / 2.0))
    return image[top : top + crop, left : left + crop]


def pil_resize_center_crop(image: np.ndarray, resize: int, crop: int) -> np.ndarray:
    """torchvision's ``Resize(resize)`` + ``CenterCrop(crop)`` on the PIL image of ``image`` (HWC uint8)."""
    from PIL import Image

    h, w = image.shape[:2]
    new_h, new_w = _resized_size(h, w, resize)
    if (new_h, new_w) != (h, w):  # torchvision returns the image itself when no resize is needed
        image = np.asarray(Image.fromarray(image).resize((new_w, new_h), Image.BILINEAR))
    return _center_crop(image, crop)


def tensor_resize_center_crop(image: np.ndarray, resize: int, crop: int) -> np.ndarray:
    """torchvision's tensor path: antialiased bilinear ``interpolate`` in float, rounded to uint8, then the crop."""
    import torch

    h, w = image.shape[:2]
    new_h, new_w = _resized_size(h, w, resize)
    x = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float()
    y = torch.nn.functional.interpolate(x, size=[new_h, new_w], mode="bilinear", align_corners=False, antialias=True)
    y = y.round_().clamp_(0, 255).to(torch.uint8)[0].permute(1, 2, 0).numpy()
    return _center_crop(y, crop)


def _figures(ours: np.ndarray, theirs: np.ndarray, table: np.ndarray) -> dict[str, Any]:
    """Differences of two (n, C, C, 3) uint8 stacks, in levels and in normalized units."""
    chan = np.arange(3)[None, None, None, :]
    diff_u8 = np.abs(ours.astype(np.int16) - theirs.astype(np.int16))
    diff_f = np.abs(table[chan, ours] - table[chan, theirs])
    return {
        "max_abs_diff_u8": int(diff_u8.max()), "mean_abs_diff_u8": float(diff_u8.mean()),
        "share_differing": float((diff_u8 > 0).mean()), "share_over_1_level": float((diff_u8 > 1).mean()),
        "rows_differing": int((diff_u8.reshape(len(diff_u8), -1) > 0).any(axis=1).sum()),
        "max_abs_diff_normalized": float(diff_f.max()), "mean_abs_diff_normalized": float(diff_f.mean()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tbl_bench.eval_transform", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--rows", type=int, default=1000)
    p.add_argument("--resize", type=int, default=256)
    p.add_argument("--crop", type=int, default=224)
    args = p.parse_args(argv)

    import tbl_format
    from tbl_kernels import normalization_table
    from tbl_loader import IMAGENET_MEAN, IMAGENET_STD, ImageLoader

    ds = tbl_format.open(args.dataset)
    rows = min(args.rows, len(ds))
    loader = ImageLoader(ds, batch_size=64, shuffle=False, resize=args.resize, center_crop=args.crop,
                         dtype="uint8", layout="HWC", backend="numpy")
    ours = []
    for batch in loader:
        ours.append(batch.images.copy())
        if sum(len(b) for b in ours) >= rows:
            break
    loader.close()
    ours_u8 = np.concatenate(ours)[:rows]

    ids = list(range(rows))
    heights = np.array(ds.values("height", ids), np.int64)
    widths = np.array(ds.values("width", ids), np.int64)
    jpeg = ds.schema.leaves["image"].kind == "encoded_image"
    stored = ds.values("image", ids)
    if jpeg:
        import simplejpeg  # the loader's serve-time decoder (tbl-loader's jpeg extra)

        pixels = [simplejpeg.decode_jpeg(blob, "RGB", strict=True) for blob in stored]
        # The loader decodes at DCT scale 1/k (k >= 2) where the crop window is at least k times the
        # output on both axes; the window is crop * side / resized side, so that is side >= 2 * resized side.
        resized = np.array([_resized_size(int(h), int(w), args.resize) for h, w in zip(heights, widths, strict=True)])
        reduced = int(((heights >= 2 * resized[:, 0]) & (widths >= 2 * resized[:, 1])).sum())
    else:
        pixels, reduced = [np.asarray(v) for v in stored], 0
    ds.close()

    table = normalization_table(IMAGENET_MEAN, IMAGENET_STD, "float32")
    pil = np.stack([pil_resize_center_crop(img, args.resize, args.crop) for img in pixels])
    report: dict[str, Any] = {
        "rows": rows, "resize": args.resize, "crop": args.crop, "storage": "jpeg" if jpeg else "raw",
        "rows_decoded_at_reduced_dct_scale": reduced,
        "vs_pil_resize_center_crop": _figures(ours_u8, pil, table),
    }
    try:
        tensor = np.stack([tensor_resize_center_crop(img, args.resize, args.crop) for img in pixels])
    except ImportError:
        report["vs_tensor_path"] = None
    else:
        report["vs_tensor_path"] = _figures(ours_u8, tensor, table)
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
