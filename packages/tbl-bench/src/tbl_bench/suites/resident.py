"""GPU-resident image loaders (tbl-resident): the dataset lives on the device, batches never cross PCIe.

Runs on CUDA or MPS when torch sees one; otherwise on tbl-resident's CPU device
(which measures the same code path without an accelerator and says so in the
report). Same data, batch size and consumer as the images suite; the
baseline is ImageLoader with its batches copied to the same device.

Standalone: ``python -m tbl_bench.suites.resident [--quick] [--devices cpu,cuda]``
writes a synthetic dataset (random images) to a temporary folder, runs every
configuration (ImageLoader and ResidentImageLoader per device, level and
augmentation) in its own subprocess through the suite runner, prints a table
with each resident result next to its ImageLoader baseline, and prints the
results as JSON on the last line of stdout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile

from tbl_bench.context import BenchContext, DataUnavailable
from tbl_bench.harness import Config, SkipConfig
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


# ---- standalone -----------------------------------------------------------------------------------


def _available_devices() -> list[str]:
    found = ["cpu"]
    device = pick_device()
    if device != "cpu":
        found.append(device)
    return found


def _synthetic_dataset(root: str, count: int, size: int, seed: int) -> str:
    """``count`` random ``size`` x ``size`` RGB images with labels, written as one .tbl file."""
    import numpy as np

    import tbl_format

    rng = np.random.default_rng(seed)
    block = rng.integers(0, 256, (min(count, 512), size, size, 3), dtype=np.uint8)
    samples = ({"image": block[i % len(block)], "label": np.int64(i % 1000)} for i in range(count))
    return str(tbl_format.write(samples, f"{root}/resident-bench.tbl"))


def standalone_configs(path: str, devices: list[str], levels, augs, *, batch_size: int, size: int,
                       warmup: int, epochs: int) -> list[Config]:
    """ImageLoader baseline and ResidentImageLoader subject for every device, level and augmentation."""
    common = {"warmup": warmup, "epochs": epochs, "unit": UNIT}
    configs = []
    for device in devices:
        for level in levels:
            for aug in augs:
                params = {"path": path, "batch_size": batch_size, "aug": aug, "level": level, "size": size}
                configs.append(Config(NAME, f"imageloader-{device}/{level}/{aug}", "tbl",
                                      "tbl_bench.suites.images:tbl_serve",
                                      {**params, "device": None if device == "cpu" else device},
                                      role="baseline", **common))
                configs.append(Config(NAME, f"resident-{device}/{level}/{aug}", "tbl-resident",
                                      "tbl_bench.suites.resident:resident_serve",
                                      {**params, "device": device}, **common))
    return configs


def main(argv: list[str] | None = None) -> int:
    from tbl_bench.runner import run_config

    p = argparse.ArgumentParser(prog="python -m tbl_bench.suites.resident", description=TITLE)
    p.add_argument("--quick", action="store_true", help="small dataset and few epochs (proves the pipeline)")
    p.add_argument("--devices", default=None, help="comma-separated; default: cpu plus the accelerator if any")
    p.add_argument("--images", type=int, default=None, help="dataset size (default 20000; quick 1000)")
    p.add_argument("--size", type=int, default=None, help="image side in px (default 160; quick 64)")
    p.add_argument("--batch-size", type=int, default=None, help="default 256; quick 64")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs (default 3; quick 2)")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--levels", default=",".join(LEVELS))
    p.add_argument("--augs", default="plain,flip,crop")
    p.add_argument("--data-dir", default=None, help="where the synthetic dataset goes (default: a temp dir)")
    args = p.parse_args(argv)

    devices = args.devices.split(",") if args.devices else _available_devices()
    count = args.images or (1000 if args.quick else 20_000)
    size = args.size or (64 if args.quick else 160)
    batch_size = args.batch_size or (64 if args.quick else 256)
    epochs = args.epochs or (2 if args.quick else 3)
    root = tempfile.mkdtemp(prefix="tbl-bench-resident-", dir=args.data_dir)
    try:
        path = _synthetic_dataset(root, count, size, seed=0)
        configs = standalone_configs(path, devices, args.levels.split(","), args.augs.split(","),
                                     batch_size=batch_size, size=size, warmup=args.warmup, epochs=epochs)
        results = []
        print(f"{count} images {size}x{size}, batch {batch_size}, {epochs} timed epochs after {args.warmup} warm-up; "
              f"each configuration in its own subprocess", file=sys.stderr)
        for config in configs:
            result = run_config(config)
            results.append(result)
            rate = result.get("throughput")
            line = f"{config.name:<34} {result.get('status', '?'):<8}"
            line += f" {rate:>12,.0f} {UNIT}" if rate else f" {result.get('reason') or ''}"[:200]
            if config.role != "baseline" and rate:
                base = results[-2].get("throughput")
                if base:
                    line += f"   {rate / base:6.2f}x ImageLoader"
            print(line, file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps({"suite": NAME, "images": count, "size": size, "batch_size": batch_size, "results": results}))
    return 0 if all(r.get("status") != "failed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
