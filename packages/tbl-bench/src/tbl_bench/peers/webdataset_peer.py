"""webdataset 1.0: `ShardWriter` (convert) and `WebDataset` in a PyTorch DataLoader (serve).

The TAR shards hold each image decoded and resized (`decoded.py`) as a `.npy`
member plus its label (`.cls`): the same pixels the other converted formats
store. Serving shuffles shards and samples (a 1,000-sample buffer, webdataset's
usual pattern), decodes the `.npy`, applies the PIL baseline's augmentation and
normalization in 2 worker processes, and batches in the DataLoader. Shards are
split between workers, so there are several per worker.
"""

from __future__ import annotations

import math
from pathlib import Path

from tbl_bench.config import SkipConfig
from tbl_bench.peers.decoded import SampleTransform, decoded_images
from tbl_bench.peers.epochs import ImageLabelEpochs

__all__ = ["webdataset_serve", "webdataset_write"]

PIP = "pip install 'tbl-bench[peers]' (webdataset)"
SHARDS = 8  # at least 4 per worker of the 2-worker loader
SHUFFLE_BUFFER = 1000


def _import_webdataset():
    try:
        import webdataset
    except ImportError as e:
        raise SkipConfig(f"webdataset is not installed ({PIP}): {e}") from e
    return webdataset


def webdataset_write(tar: str, dst: str, size: int, count: int) -> int:
    """Write the TAR's images as SHARDS webdataset shards into the directory `dst`; return the sample count."""
    wds = _import_webdataset()
    Path(dst).mkdir(parents=True, exist_ok=True)
    n = 0
    with wds.ShardWriter(str(Path(dst) / "shard-%04d.tar"), maxcount=math.ceil(count / SHARDS),
                         verbose=0) as sink:
        for image, label in decoded_images(tar, size):
            sink.write({"__key__": f"{n:08d}", "npy": image, "cls": label})
            n += 1
    return n


def _to_pair(sample: dict, transform: SampleTransform):
    return transform(sample["npy"]), int(sample["cls"])


class _Serve(ImageLabelEpochs):
    def __init__(self, path: str, size: int, batch_size: int, aug: str, level: str, workers: int, seed: int,
                 count: int):
        wds = _import_webdataset()
        import functools

        import torch.utils.data

        shards = sorted(str(p) for p in Path(path).glob("shard-*.tar"))
        if not shards:
            raise SkipConfig(f"no webdataset shards in {path!r}")
        self.level = level
        transform = SampleTransform(size, aug, seed)
        dataset = (wds.WebDataset(shards, shardshuffle=len(shards), seed=seed, empty_check=False)
                   .shuffle(SHUFFLE_BUFFER, seed=seed)
                   .decode()
                   .map(functools.partial(_to_pair, transform=transform)))
        self.items_per_epoch = count
        self.loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers,
                                                  persistent_workers=workers > 0)
        self.info = {"webdataset": getattr(wds, "__version__", None), "workers": workers, "shards": len(shards)}

    def close(self) -> None:
        self.loader = None


def webdataset_serve(path: str, size: int, batch_size: int, aug: str, level: str, count: int, workers: int = 2,
                     seed: int = 0):
    """Workload factory: WebDataset over the shards of `webdataset_write`, in a 2-worker DataLoader.

    `count` is the number of samples the shards hold (an iterable dataset has no length)."""
    return _Serve(path, size, batch_size, aug, level, workers, seed, count)
