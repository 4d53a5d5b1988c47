"""End-to-end training steps of a small CNN on the CPU: loader overhead against the compute ceiling.

Each epoch runs forward, backward and an SGD step on every batch. The ceiling is
the same CNN fed from a tensor preloaded in RAM (no loader at all): an epoch
cannot be faster than that, so median / ceiling median is what the loader costs
on top of the compute. Loader and model share the same cores, as on a real
training box.
"""

from __future__ import annotations

from tbl_bench.config import Config, SkipConfig
from tbl_bench.context import BenchContext, DataUnavailable

NAME = "train"
TITLE = "Training step, small CNN on the CPU"
UNIT = "images/s"
COMPARE_ON = ("aug",)


def _torch():
    try:
        import torch
    except ImportError as e:
        raise SkipConfig(f"torch is not importable: {e}") from e
    return torch


def small_cnn(num_classes: int):
    """Three strided 3x3 convolutions, global pooling, one linear layer (about 10 MFLOP forward at 160 px).

    Small on purpose: on a 2-core CPU a bigger model hides any loader behind its compute.
    """
    torch = _torch()
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(inplace=True),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(inplace=True),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, num_classes),
    )


class _Trainer:
    """Shared training step; subclasses provide `batches(epoch)` yielding (images, labels) tensors."""

    def __init__(self, num_classes: int, seed: int):
        torch = _torch()
        torch.manual_seed(seed)
        self.torch = torch
        self.model = small_cnn(num_classes)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss = torch.nn.CrossEntropyLoss()
        self.info = {"torch_threads": torch.get_num_threads()}

    def step(self, images, labels) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(self.model(images), labels)
        loss.backward()
        self.opt.step()

    def run_epoch(self, epoch: int) -> int:
        n = 0
        for images, labels in self.batches(epoch):
            self.step(images, labels)
            n += images.shape[0]
        return n

    def close(self) -> None:
        pass


class _Preloaded(_Trainer):
    """The ceiling: random normalized images already in RAM as one float32 tensor."""

    def __init__(self, count: int, size: int, batch_size: int, num_classes: int, seed: int):
        super().__init__(num_classes, seed)
        g = self.torch.Generator().manual_seed(seed)
        self.images = self.torch.randn(count, 3, size, size, generator=g)
        self.labels = self.torch.randint(0, num_classes, (count,), generator=g)
        self.batch_size = batch_size
        self.items_per_epoch = count

    def batches(self, epoch: int):
        g = self.torch.Generator().manual_seed(epoch)
        order = self.torch.randperm(self.items_per_epoch, generator=g)
        for start in range(0, self.items_per_epoch, self.batch_size):
            idx = order[start : start + self.batch_size]
            yield self.images[idx], self.labels[idx]


def preloaded(count: int, size: int, batch_size: int, num_classes: int, seed: int = 0):
    """Workload factory: the compute ceiling (no loader)."""
    return _Preloaded(count, size, batch_size, num_classes, seed)


class _TblFed(_Trainer):
    def __init__(self, path: str, size: int, batch_size: int, aug: str, num_classes: int, seed: int):
        super().__init__(num_classes, seed)
        from tbl_bench.suites.images import tbl_serve

        self.serve = tbl_serve(path, batch_size, aug, "produce", size, seed)
        self.items_per_epoch = self.serve.items_per_epoch

    def batches(self, epoch: int):
        self.serve.loader.set_epoch(epoch)
        for b in self.serve.loader:
            yield b.images, self.torch.as_tensor(b.labels).long()

    def close(self) -> None:
        self.serve.close()


def tbl_fed(path: str, size: int, batch_size: int, aug: str, num_classes: int, seed: int = 0):
    """Workload factory: the CNN fed by tbl_loader.ImageLoader."""
    return _TblFed(path, size, batch_size, aug, num_classes, seed)


class _PilFed(_Trainer):
    def __init__(self, tar: str, size: int, batch_size: int, aug: str, num_classes: int, seed: int, workers: int):
        super().__init__(num_classes, seed)
        from tbl_bench.peers.pil import pil_loader

        self.serve = pil_loader(tar, size, batch_size, aug, "produce", workers, seed)
        self.items_per_epoch = self.serve.items_per_epoch
        self.info["workers"] = workers

    def batches(self, epoch: int):
        yield from self.serve.loader

    def close(self) -> None:
        self.serve.close()


def pil_fed(tar: str, size: int, batch_size: int, aug: str, num_classes: int, seed: int = 0, workers: int = 2):
    """Workload factory: the CNN fed by the PyTorch DataLoader + PIL pipeline."""
    return _PilFed(tar, size, batch_size, aug, num_classes, seed, workers)


class _TurboFed(_Trainer):
    def __init__(self, path: str, tar: str, batch_size: int, aug: str, num_classes: int, seed: int):
        super().__init__(num_classes, seed)
        from tbl_bench.data import read_tar_labels
        from tbl_bench.peers.turbo import turbo_serve

        self.serve = turbo_serve(path, batch_size, aug, "produce", seed)
        # preprocess_to_tbl keeps TAR order, so sample i has the label of TAR member i.
        self.labels = self.torch.tensor(read_tar_labels(tar)[1])
        self.items_per_epoch = self.serve.items_per_epoch

    def batches(self, epoch: int):
        self.serve.loader.set_epoch(epoch)
        for images, meta in self.serve.loader:
            yield self.torch.from_numpy(images), self.labels[self.torch.from_numpy(meta["indices"])]

    def close(self) -> None:
        self.serve.close()


def turbo_fed(path: str, tar: str, batch_size: int, aug: str, num_classes: int, seed: int = 0):
    """Workload factory: the CNN fed by TurboLoader's TblRawImageLoader (labels by sample index)."""
    return _TurboFed(path, tar, batch_size, aug, num_classes, seed)


def configurations(ctx: BenchContext) -> list[Config]:
    s = ctx.sizes
    # The ceiling holds the whole dataset in RAM as float32 (1.9 GiB at 10,000 images of 160 px).
    common = {"warmup": 1, "epochs": min(s.epochs, 3), "unit": UNIT}
    base = {"batch_size": 64, "num_classes": s.classes}
    tar = str(ctx.image_tar())
    configs = [
        Config(NAME, "preloaded", "ceiling", "tbl_bench.suites.train:preloaded",
               {"count": s.images, "size": s.image_size, **base}, role="ceiling", **common),
    ]
    try:
        tbl_path, skip = str(ctx.tbl_images(mode="squash")), None
    except DataUnavailable as e:
        tbl_path, skip = "", str(e)
    for aug in ("plain", "crop"):
        configs.append(Config(NAME, f"tbl/{aug}", "tbl", "tbl_bench.suites.train:tbl_fed",
                              {"path": tbl_path, "size": s.image_size, "aug": aug, **base}, skip=skip, **common))
        configs.append(Config(NAME, f"pil/{aug}", "pil", "tbl_bench.suites.train:pil_fed",
                              {"tar": tar, "size": s.image_size, "aug": aug, **base}, role="baseline", **common))
    if ctx.peers:
        try:
            tl_path, tl_skip = str(ctx.turbo_images()), None
        except DataUnavailable as e:
            tl_path, tl_skip = "", str(e)
        for aug in ("plain", "crop"):
            configs.append(Config(NAME, f"turboloader/{aug}", "turboloader", "tbl_bench.suites.train:turbo_fed",
                                  {"path": tl_path, "tar": tar, "aug": aug, **base}, skip=tl_skip, peer=True,
                                  **common))
    return configs
