"""One rank of the DataLoader test in test_remote_dataloader.py: a spawned process (world_size=2) that serves
its epochs of an s3:// dataset through ImageDataset + EpochBatchSampler + a torch DataLoader with 2 spawned
workers, every process of the node on one shard cache. Importable by the spawned processes (the test
folder is on their sys.path)."""

from __future__ import annotations

import json

import numpy as np


def collate_with_downloads(batch):
    """collate_identity, plus which worker made the batch and how many shards that worker downloaded so far."""
    from torch.utils.data import get_worker_info

    from tbl_loader import collate_identity

    dataset = batch.dataset
    return collate_identity(batch), get_worker_info().id, dataset.dataset.cache.downloads


def run_rank(rank: int, url: str, cache_dir: str, storage_options: dict, epochs: int, out: str) -> None:
    from torch.utils.data import DataLoader

    from tbl_loader import EpochBatchSampler, ImageDataset, ImageLoader

    loader = ImageLoader(url, batch_size=8, shuffle="block", seed=3, rank=rank, world_size=2, padding="drop",
                         backend="numpy", dtype="uint8", layout="HWC", cache_dir=cache_dir,
                         storage_options=storage_options)
    dataset = ImageDataset.from_loader(loader)
    data = DataLoader(dataset, batch_sampler=EpochBatchSampler(loader), collate_fn=collate_with_downloads,
                      num_workers=2, multiprocessing_context="spawn", persistent_workers=True)
    indices, images, labels, workers, downloads = [], [], [], set(), {}
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch, worker, count in data:
            indices.append(np.asarray(batch.indices))
            images.append(np.asarray(batch.images))
            labels.append(np.asarray(batch.labels))
            workers.add(worker)
            downloads[worker] = max(downloads.get(worker, 0), count)  # a worker's count only grows
    del data  # the workers exit
    downloads["rank"] = loader.dataset.cache.downloads  # the rank's own process (it binds the columns)
    loader.close()
    np.savez(out, indices=np.stack(indices), images=np.stack(images), labels=np.stack(labels))
    with open(out + ".json", "w") as f:
        json.dump({"workers": sorted(workers), "downloads": {str(k): v for k, v in downloads.items()}}, f)
