"""FFCV 1.0.2: `DatasetWriter` (convert) and `Loader` (serve), when it imports.

FFCV builds from its sdist against OpenCV, libjpeg-turbo and pkg-config
(Debian: `apt-get install -y libopencv-dev libturbojpeg0-dev pkg-config`, then
`pip install numba ffcv==1.0.2` beside torch==2.13.0). Where it does not import,
its configurations are skipped with the import error as the reason.

The .beton stores each image decoded and resized (`decoded.py`) as raw
pixels (`RGBImageField(write_mode="raw")`), the same pixels the other
converted formats store. Serving uses FFCV's own CPU pipeline: decode
(RandomResizedCrop inside the decoder for "crop"), horizontal flip,
normalization to float32 through a lookup table, then a torch NCHW view;
2 worker threads, random order.
"""

from __future__ import annotations

from pathlib import Path

from tbl_bench.config import SkipConfig
from tbl_bench.conversions import ConversionEpochs
from tbl_bench.peers.decoded import decoded_images
from tbl_bench.peers.epochs import ImageLabelEpochs
from tbl_bench.peers.transforms import AUGMENTATIONS, EVAL, EVAL_CROP_RATIO, IMAGENET_MEAN, IMAGENET_STD

__all__ = ["ffcv_convert", "ffcv_serve", "ffcv_unavailable_reason", "ffcv_write", "ffcv_write_photos"]


def ffcv_unavailable_reason() -> str | None:
    """None when ffcv imports, else the reason it does not."""
    try:
        import ffcv  # noqa: F401
        from ffcv.loader import Loader  # noqa: F401
        from ffcv.writer import DatasetWriter  # noqa: F401
    except Exception as e:  # any import-time failure (missing cv2, libturbojpeg, ABI mismatch) means "not here"
        return (f"ffcv does not import: {type(e).__name__}: {e} (needs the OpenCV and libturbojpeg development "
                "packages and pkg-config, then pip install numba ffcv==1.0.2; see the tbl-bench README)")
    return None


def _require_ffcv() -> None:
    reason = ffcv_unavailable_reason()
    if reason is not None:
        raise SkipConfig(reason)


class _Images:
    """Indexable (image, label) pairs, as DatasetWriter reads them."""

    def __init__(self, tar: str, size: int):
        self.items = list(decoded_images(tar, size))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return self.items[i]


def ffcv_write(tar: str, dst: str, size: int, workers: int = 2) -> int:
    """Write the TAR's images into the .beton `dst`; return the sample count."""
    _require_ffcv()
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    images = _Images(tar, size)
    writer = DatasetWriter(str(dst), {"image": RGBImageField(write_mode="raw", max_resolution=size),
                                      "label": IntField()}, num_workers=workers)
    writer.from_indexed_dataset(images)
    return len(images)


class _Serve(ImageLabelEpochs):
    def __init__(self, path: str, size: int, batch_size: int, aug: str, level: str, workers: int, seed: int):
        _require_ffcv()
        import numpy as np
        from ffcv.fields.basics import IntDecoder
        from ffcv.fields.rgb_image import (
            CenterCropRGBImageDecoder,
            RandomResizedCropRGBImageDecoder,
            SimpleRGBImageDecoder,
        )
        from ffcv.loader import Loader, OrderOption
        from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage

        if aug not in (*AUGMENTATIONS, EVAL):
            raise ValueError(f"aug must be one of {(*AUGMENTATIONS, EVAL)}, got {aug!r}")
        if aug == "crop":
            decoder = RandomResizedCropRGBImageDecoder((size, size))
        elif aug == EVAL:  # FFCV's validation decoder: the centre square, ratio of the shorter side, resized
            decoder = CenterCropRGBImageDecoder((size, size), ratio=EVAL_CROP_RATIO)
        else:
            decoder = SimpleRGBImageDecoder()
        image_pipeline = [decoder]
        if aug in ("flip", "crop"):
            image_pipeline.append(RandomHorizontalFlip(0.5))
        image_pipeline += [NormalizeImage(np.array(IMAGENET_MEAN) * 255, np.array(IMAGENET_STD) * 255, np.float32),
                           ToTensor(), ToTorchImage()]
        self.level = level
        self.loader = Loader(path, batch_size=batch_size, num_workers=workers, order=OrderOption.RANDOM,
                             seed=seed, drop_last=False,
                             pipelines={"image": image_pipeline, "label": [IntDecoder(), ToTensor()]})
        self.items_per_epoch = int(self.loader.reader.num_samples)  # numpy uint64: not JSON
        self.info = {"workers": workers}

    def close(self) -> None:
        self.loader = None


def ffcv_serve(path: str, size: int, batch_size: int, aug: str, level: str, workers: int = 2, seed: int = 0):
    """Workload factory: ffcv.loader.Loader over a .beton from `ffcv_write`."""
    return _Serve(path, size, batch_size, aug, level, workers, seed)


class _Photos:
    """Indexable (full decoded photo, label) pairs read lazily from the TAR, as DatasetWriter reads them.

    The photo goes in at its own size: FFCV's RGBImageField caps it at `max_resolution` itself."""

    def __init__(self, tar: str):
        from tbl_bench.peers.pil import index_tar

        self.tar = tar
        self.spans, self.labels = index_tar(tar)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, i: int):
        import io

        import numpy as np
        from PIL import Image

        offset, nbytes = self.spans[i]
        with open(self.tar, "rb") as f:  # one handle per call: the writer reads from worker processes
            f.seek(offset)
            data = f.read(nbytes)
        return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")), self.labels[i]


def ffcv_write_photos(tar: str, dst: str, write_mode: str, max_resolution: int, workers: int = 2) -> int:
    """Write the TAR's photos into the .beton `dst` as FFCV stores variable-size images; return the count.

    `write_mode`: "jpg" (FFCV resizes to `max_resolution` and re-encodes) or "raw" (decoded pixels of each
    photo's capped size), FFCV's two modes to compare with TBL's `--store jpeg` / `--store raw --max-size`."""
    _require_ffcv()
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    if write_mode not in ("jpg", "raw"):
        raise ValueError(f"write_mode must be 'jpg' or 'raw', got {write_mode!r}")
    photos = _Photos(tar)
    writer = DatasetWriter(str(dst), {"image": RGBImageField(write_mode=write_mode, max_resolution=max_resolution),
                                      "label": IntField()}, num_workers=workers)
    writer.from_indexed_dataset(photos)
    return len(photos)


class _Convert(ConversionEpochs):
    """One `ffcv_write_photos` of the TAR per epoch into a fresh .beton (the convert suite)."""

    def __init__(self, tar: str, size: int, write_mode: str, workers: int):
        from tbl_bench.peers.pil import index_tar

        _require_ffcv()
        self.tar, self.size, self.write_mode, self.workers = tar, size, write_mode, workers
        self.items_per_epoch = len(index_tar(tar)[0])
        self.info = {"workers": workers, "write_mode": write_mode, "max_resolution": size}
        super().__init__("tbl-bench-ffcv-convert-", ".beton")

    def convert_into(self, dst: Path) -> int:
        return ffcv_write_photos(self.tar, str(dst), self.write_mode, self.size, self.workers)


def ffcv_convert(tar: str, size: int, write_mode: str, workers: int = 2):
    """Workload factory: FFCV's DatasetWriter over the TAR's photos at max_resolution=size, per epoch."""
    return _Convert(tar, size, write_mode, workers)
