"""GPU-resident image loaders (tbl-resident): the dataset lives on the device, batches never cross PCIe.

Runs on CUDA or MPS when torch sees one; otherwise on tbl-resident's CPU device
(which measures the same code path without an accelerator and says so in the
report). Same data, batch size and consumer as the images suite; the
baseline is ImageLoader with its batches copied to the same device.

    tbl bench --suite resident [--quick]
"""

from __future__ import annotations

from tbl_bench.config import Config, SkipConfig
from tbl_bench.context import BenchContext, DataUnavailable
from tbl_bench.levels import LEVELS, consume_batch

NAME = "resident"
TITLE = "GPU-resident loaders"
UNIT = "images/s"
COMPARE_ON = ("level", "aug")


def pick_device() -> str:
    """"cuda", "mps" or "cpu": the accelerator torch sees, else the CPU device."""
    try:
        import torch
    except ImportError:
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def _resident_loader_class():
    try:
        import tbl_resident
    except ImportError as e:
        raise SkipConfig(f"tbl_resident is not importable: {e}") from e
    cls = getattr(tbl_resident, "ResidentImageLoader", None)
    if cls is None:
        raise SkipConfig(f"tbl_resident {getattr(tbl_resident, '__version__', '?')} exports no ResidentImageLoader")
    return cls


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


class _Resident:
    def __init__(self, path: str, batch_size: int, aug: str, level: str, size: int, device: str, seed: int):
        cls = _resident_loader_class()
        kwargs = {}
        if aug in ("flip", "crop"):
            kwargs["hflip"] = 0.5
        if aug == "crop":
            from tbl_bench.suites.images import _crop_spec

            kwargs["random_resized_crop"] = _crop_spec(size)
        self.device, self.level = device, level
        self.loader = cls(path, batch_size, shuffle=True, seed=seed, device=device, **kwargs)
        import tbl_format

        ds = tbl_format.open(path)
        self.items_per_epoch = len(ds)
        ds.close()
        self.info = {"device": device}

    def run_epoch(self, epoch: int) -> int:
        self.loader.set_epoch(epoch)
        n = 0
        for batch in self.loader:
            consume_batch(batch.images, self.level)
            n += batch.images.shape[0]
        _sync(self.device)
        return n

    def close(self) -> None:
        self.loader.close()


def resident_serve(path: str, batch_size: int, aug: str, level: str, size: int, device: str, seed: int = 0):
    """Workload factory: tbl_resident.ResidentImageLoader on `device`."""
    return _Resident(path, batch_size, aug, level, size, device, seed)


def configurations(ctx: BenchContext) -> list[Config]:
    s = ctx.sizes
    common = {"warmup": s.warmup, "epochs": s.epochs, "unit": UNIT}
    try:
        path, skip = str(ctx.tbl_images(mode="squash")), None
    except DataUnavailable as e:
        path, skip = "", str(e)
    device = pick_device()
    configs = []
    # The CPU device runs the same code without an accelerator: it proves the path, one level is enough.
    for level in LEVELS if device != "cpu" else ("consume",):
        for aug in ("plain", "crop"):
            configs.append(Config(NAME, f"imageloader-{device}/{level}/{aug}", "tbl",
                                  "tbl_bench.suites.images:tbl_serve",
                                  {"path": path, "batch_size": s.batch_size, "aug": aug, "level": level,
                                   "size": s.image_size, "device": None if device == "cpu" else device},
                                  role="baseline", skip=skip, **common))
            configs.append(Config(NAME, f"resident-{device}/{level}/{aug}", "tbl-resident",
                                  "tbl_bench.suites.resident:resident_serve",
                                  {"path": path, "batch_size": s.batch_size, "aug": aug, "level": level,
                                   "size": s.image_size, "device": device}, skip=skip, **common))
    return configs
