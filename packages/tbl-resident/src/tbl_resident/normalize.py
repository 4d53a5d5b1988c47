"""uint8 pixels to the output tensor: the normative normalization table, looked up on the device.

The value of byte ``v`` in channel ``c`` is ``table[c, v]`` from
``tbl_kernels.normalization_table`` (float64 math rounded once to the output
type), so a lookup reproduces the CPU kernels' bits exactly; computing
``(v / 255 - mean) / std`` on the device in float32 would not. The ``(C, 256)``
table is uploaded once, flattened; a batch is looked up in two passes: one
kernel widens the bytes to int32 flat-table indices ``c * 256 + v`` while
writing them in the output layout, one ``index_select`` reads the table.
"""

from __future__ import annotations

import numpy as np
import torch

import tbl_kernels

__all__ = ["Normalizer", "OUTPUT_DTYPES"]

OUTPUT_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "uint8": torch.uint8,
}


def _table_tensor(mean, std, dtype: str) -> torch.Tensor:
    table = tbl_kernels.normalization_table(mean, std, dtype)
    if dtype == "bfloat16":  # returned as uint16 bit patterns; torch has no uint16 view to bfloat16 on every build
        return torch.from_numpy(np.ascontiguousarray(table).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(table))


class Normalizer:
    """Writes ``(B, H, W, C)`` uint8 views (any strides) as ``dtype`` batches in ``layout``.

    ``layout="CHW"`` gives contiguous ``(B, C, H, W)``, ``"HWC"`` contiguous
    ``(B, H, W, C)``; ``channels_last=True`` (CHW only) gives ``(B, C, H, W)``
    tensors in ``torch.channels_last`` memory format (the HWC bytes, viewed as
    NCHW). ``dtype="uint8"`` skips the table (raw bytes, mean/std unused).
    """

    def __init__(self, mean, std, dtype: str, layout: str, channels_last: bool, channels: int,
                 device: torch.device) -> None:
        if dtype not in OUTPUT_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(OUTPUT_DTYPES)}, got {dtype!r}")
        self.dtype = dtype
        self.layout = layout
        self.channels_last = channels_last
        self.table: torch.Tensor | None = None
        if dtype != "uint8":
            if len(mean) != channels or len(std) != channels:
                raise ValueError(
                    f"mean and std need one value per channel ({channels}), got {len(mean)} and {len(std)}"
                )
            self.table = _table_tensor(mean, std, dtype).reshape(-1).to(device)
        offsets = torch.arange(channels, dtype=torch.int32) * 256
        self.offsets_hwc = offsets.to(device)
        self.offsets_chw = offsets.view(channels, 1, 1).to(device)

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """The batch for ``pixels`` (B, H, W, C) uint8, as a new tensor."""
        hwc = self.layout == "HWC" or self.channels_last
        if self.table is None:
            # ``pixels`` is always a fresh gather (never a view of the resident dataset), so a
            # contiguous one can be handed out as it is.
            out = pixels.contiguous() if hwc else pixels.permute(0, 3, 1, 2).contiguous()
        else:
            b, h, w, c = pixels.shape
            if hwc:
                index = torch.empty((b, h, w, c), dtype=torch.int32, device=pixels.device)
                torch.add(pixels, self.offsets_hwc, out=index)
            else:
                index = torch.empty((b, c, h, w), dtype=torch.int32, device=pixels.device)
                torch.add(pixels.permute(0, 3, 1, 2), self.offsets_chw, out=index)
            out = self.table.index_select(0, index.view(-1)).view(index.shape)
        if self.channels_last:
            return out.permute(0, 3, 1, 2)  # NCHW shape over HWC bytes: torch.channels_last
        return out
