"""How far TBL's evaluation transform is from torchvision's Resize(R) + CenterCrop(C) on the same pixels.

    python -m tbl_bench.eval_transform DATASET [--rows 1000] [--resize 256] [--crop 224]

DATASET is a variable-size raw dataset (``tbl convert --max-size N``). TBL's
side: ``ImageLoader(..., resize=R, center_crop=C, dtype="uint8")``, one
crop-resize of the box `tbl_loader.image_spec.resized_center_crop_boxes` gives.
torchvision's side, on the same stored pixels: its tensor path, written out
with torch so that it runs with any torch build (torchvision's own wheel must
match the torch build exactly): ``Resize(R)`` sets the shorter side to R and
the longer to ``int(R * long / short)``, resamples with
``torch.nn.functional.interpolate(mode="bilinear", antialias=True,
align_corners=False)`` and rounds to uint8; ``CenterCrop(C)`` takes
``top = int(round((h - C) / 2))``. Both are then normalized with the ImageNet
table. Printed: the largest and mean absolute differences in uint8 levels and
in normalized float32 units, and the share of values that differ by more than
one level.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

__all__ = ["main"]


def _torchvision_resize_center_crop(image: np.ndarray, resize: int, crop: int) -> np.ndarray:
    import torch

    h, w = image.shape[:2]
    short, long_ = (h, w) if h <= w else (w, h)
    new_short, new_long = resize, int(resize * long_ / short)
    new_h, new_w = (new_short, new_long) if h <= w else (new_long, new_short)
    x = torch.from_numpy(np.array(image)).permute(2, 0, 1)[None].float()
    y = torch.nn.functional.interpolate(x, size=[new_h, new_w], mode="bilinear", align_corners=False, antialias=True)
    y = y.round_().clamp_(0, 255).to(torch.uint8)[0]
    top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
    return y[:, top : top + crop, left : left + crop].numpy()


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
                         dtype="uint8", backend="numpy")
    ours = []
    for batch in loader:
        ours.append(batch.images.copy())
        if sum(len(b) for b in ours) >= rows:
            break
    loader.close()
    ours_u8 = np.concatenate(ours)[:rows]
    theirs_u8 = np.stack([_torchvision_resize_center_crop(img, args.resize, args.crop)
                          for img in ds.values("image", list(range(rows)))])
    ds.close()
    table = normalization_table(IMAGENET_MEAN, IMAGENET_STD, "float32")
    chan = np.arange(3)[None, :, None, None]
    diff_u8 = np.abs(ours_u8.astype(np.int16) - theirs_u8.astype(np.int16))
    diff_f = np.abs(table[chan, ours_u8] - table[chan, theirs_u8])
    print(json.dumps({
        "rows": rows, "resize": args.resize, "crop": args.crop,
        "max_abs_diff_u8": int(diff_u8.max()), "mean_abs_diff_u8": float(diff_u8.mean()),
        "share_over_1_level": float((diff_u8 > 1).mean()),
        "max_abs_diff_normalized": float(diff_f.max()), "mean_abs_diff_normalized": float(diff_f.mean()),
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
