"""torchdata's StatefulDataLoader over ImageDataset + EpochBatchSampler: a resumed run is the straight run.

StatefulDataLoader saves how many batches it handed out; on load it skips that many plans of the
batch sampler. EpochBatchSampler's plans are a pure function of the loader's ``(seed, epoch)`` and
position, so the skipped plans are exactly the ones the first run consumed.
"""

from __future__ import annotations

import numpy as np
import pytest

from tbl_loader import EpochBatchSampler, ImageDataset, ImageLoader, RandomResizedCrop, collate_identity

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")

CROP = RandomResizedCrop(8, scale=(0.25, 1.0))


def _parts(path):
    loader = ImageLoader(path, batch_size=9, seed=3, hflip=0.5, random_resized_crop=CROP, prefetch=0)
    return loader, ImageDataset.from_loader(loader)


def _dataloader(ds, loader, workers):
    kw = {"multiprocessing_context": "fork"} if workers else {}
    return stateful.StatefulDataLoader(ds, batch_sampler=EpochBatchSampler(loader), collate_fn=collate_identity,
                                       num_workers=workers, **kw)


def _arrays(batch):
    return batch.images.numpy().copy(), batch.labels.numpy().copy(), batch.indices.numpy().copy()


def _epochs(path, workers, stop=None, state=None):
    """Two epochs through a StatefulDataLoader; stop after ``stop`` batches (returning the state)."""
    loader, ds = _parts(path)
    out = []
    try:
        for epoch in range(2):
            loader.set_epoch(epoch)
            dl = _dataloader(ds, loader, workers)
            if state is not None and epoch == 0:
                dl.load_state_dict(state)
            for k, batch in enumerate(dl):
                out.append(_arrays(batch))
                if stop is not None and epoch == 0 and k + 1 == stop:
                    return out, dl.state_dict()
            del dl
        return out, None
    finally:
        ds.close()
        loader.close()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [1, 5])
def test_resumed_stateful_dataloader_equals_the_straight_run(dataset_path, workers, stop):
    straight, _ = _epochs(dataset_path, workers)
    assert len(straight) == 2 * -(-101 // 9)
    head, state = _epochs(dataset_path, workers, stop=stop)
    tail, _ = _epochs(dataset_path, workers, state=state)
    assert len(head) + len(tail) == len(straight)
    for got, want in zip(head + tail, straight, strict=True):
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a, b)
