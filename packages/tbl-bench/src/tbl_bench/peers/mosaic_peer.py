"""Mosaic streaming (`mosaicml-streaming` 0.13): `MDSWriter` (convert) and `StreamingDataset` (serve).

The MDS shards hold each image decoded and resized (`decoded.py`) as a
fixed-shape uint8 ndarray column, plus its label. Serving reads them from the
local directory (no remote, nothing copied) through a PyTorch DataLoader with
2 worker processes, and applies the PIL baseline's augmentation and
normalization, like the litdata peer.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

from tbl_bench.config import SkipConfig
from tbl_bench.peers.decoded import SampleTransform, decoded_images
from tbl_bench.peers.epochs import ImageLabelEpochs

__all__ = ["mosaic_serve", "mosaic_write"]

PIP = "pip install 'tbl-bench[peers]' (mosaicml-streaming)"


def _base_only(error: Exception):
    """`streaming.base` without the package's `__init__`, which also imports streaming.vision and so
    torchvision. A torchvision whose compiled ops do not load against the installed torch (PyPI's CUDA
    torchvision beside a CPU-only torch) breaks `import streaming` although the MDS reader and writer
    never use it; the classes measured are the same either way. The workload records which import ran."""
    spec = importlib.util.find_spec("streaming")
    if spec is None or not spec.submodule_search_locations:
        raise SkipConfig(f"mosaicml-streaming is not installed ({PIP})") from error
    package = types.ModuleType("streaming")
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules["streaming"] = package
    package.base = importlib.import_module("streaming.base")
    package.__version__ = importlib.import_module("streaming._version").__version__
    package.import_note = f"streaming.base only: import streaming failed: {type(error).__name__}: {error}"
    return package


def _import_streaming():
    try:
        import streaming
    except ImportError as e:
        if importlib.util.find_spec("streaming") is None:
            raise SkipConfig(f"mosaicml-streaming is not installed ({PIP}): {e}") from e
        return _base_only(e)
    except RuntimeError as e:  # torchvision's ops failing to register raise RuntimeError
        return _base_only(e)
    return streaming


def mosaic_write(tar: str, dst: str, size: int) -> int:
    """Write the TAR's images as MDS shards into `dst`; return the sample count."""
    streaming = _import_streaming()
    columns = {"image": f"ndarray:uint8:{size},{size},3", "label": "int"}
    n = 0
    with streaming.base.MDSWriter(out=str(dst), columns=columns, size_limit="64mb", progress_bar=False) as out:
        for image, label in decoded_images(tar, size):
            out.write({"image": image, "label": label})
            n += 1
    return n


def _dataset_class(streaming):
    class _Dataset(streaming.base.StreamingDataset):
        def __init__(self, transform: SampleTransform, **kwargs):
            super().__init__(**kwargs)
            self.transform = transform

        def __getitem__(self, idx: int):
            sample = super().__getitem__(idx)
            return self.transform(sample["image"]), sample["label"]

    return _Dataset


class _Serve(ImageLabelEpochs):
    def __init__(self, path: str, size: int, batch_size: int, aug: str, level: str, workers: int, seed: int):
        streaming = _import_streaming()
        import torch.utils.data

        # StreamingDataset coordinates its workers through named shared memory; a round that
        # crashed earlier may have left some behind.
        streaming.base.util.clean_stale_shared_memory()
        self.level = level
        self.dataset = _dataset_class(streaming)(
            SampleTransform(size, aug, seed), local=str(path), shuffle=True, shuffle_seed=seed,
            batch_size=batch_size)
        self.items_per_epoch = len(self.dataset)
        self.loader = torch.utils.data.DataLoader(self.dataset, batch_size=batch_size, num_workers=workers,
                                                  persistent_workers=workers > 0)
        self.info = {"mosaicml-streaming": streaming.__version__, "workers": workers,
                     "import": getattr(streaming, "import_note", "import streaming")}

    def close(self) -> None:
        self.loader = None
        self.dataset = None


def mosaic_serve(path: str, size: int, batch_size: int, aug: str, level: str, workers: int = 2, seed: int = 0):
    """Workload factory: StreamingDataset over MDS shards from `mosaic_write`, in a 2-worker DataLoader."""
    if not Path(path).is_dir():
        raise SkipConfig(f"no MDS dataset at {path!r}")
    return _Serve(path, size, batch_size, aug, level, workers, seed)
