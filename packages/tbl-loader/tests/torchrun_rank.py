"""One rank under torchrun (test_torchrun.py): a variable-size JPEG dataset at an s3:// URL served through
ImageDataset + EpochBatchSampler + a torch DataLoader with 2 fork workers; the rank and world size come
from the process group torchrun set up. Writes its batches to OUT-rank{r}.npz."""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import torch.distributed as dist
from torch.utils.data import DataLoader

from tbl_loader import EpochBatchSampler, ImageDataset, ImageLoader, RandomResizedCrop, collate_identity


def main(url: str, cache_dir: str, storage_options: str, out: str, epochs: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    options = json.loads(storage_options) if storage_options != "-" else None
    extra = {} if options is None else {"cache_dir": cache_dir, "storage_options": options}
    loader = ImageLoader(url, batch_size=8, seed=11, hflip=0.5, random_resized_crop=RandomResizedCrop(24),
                         padding="drop", backend="numpy", fields=("caption",), **extra)  # rank, world: the group's
    assert (loader.rank, loader.world_size) == (rank, 2)
    data = DataLoader(ImageDataset.from_loader(loader), batch_sampler=EpochBatchSampler(loader),
                      collate_fn=collate_identity, num_workers=2, multiprocessing_context="fork", timeout=300)
    rows, images, captions = [], [], []
    start = time.perf_counter()
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for batch in data:
            rows.append(np.asarray(batch.indices))
            images.append(np.asarray(batch.images))
            captions += list(batch.fields["caption"])
    seconds = time.perf_counter() - start
    np.savez(f"{out}-rank{rank}.npz", rows=np.stack(rows), images=np.stack(images), captions=np.array(captions))
    with open(f"{out}-rank{rank}.json", "w") as f:
        json.dump({"seconds": seconds, "batches": len(rows)}, f)
    dist.barrier()
    dist.destroy_process_group()
    loader.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
