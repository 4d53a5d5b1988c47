"""Writes the committed resume vectors: datasets, state dicts saved mid-epoch, and what the rest of each epoch held.

Run once, with the tbl-loader whose state dicts must keep resuming (these were
made by tbl-loader 0.1.0, tree 5dd8c5b); ``test_state_vectors.py`` replays them
against the current code. Never regenerate them with newer code: that would
test nothing.

    python make_state_vectors.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import tbl_format
from tbl_loader import ImageLoader, PyTreeLoader, RandomResizedCrop


def _image_dataset(out: Path) -> Path:
    rng = np.random.default_rng(20261202)
    images = rng.integers(0, 256, (37, 9, 7, 3), dtype=np.uint8)
    samples = [{"image": images[i], "label": np.int64(i * 13 % 5)} for i in range(37)]
    return tbl_format.write(samples, out / "images", shard_rows=16, metadata={"classes": list("abcde")})


def _pytree_dataset(out: Path) -> Path:
    samples = [{"id": i, "score": i / 8, "vec": np.arange(4, dtype=np.float32) + i, "name": f"row-{i}"}
               for i in range(45)]
    return tbl_format.write(samples, out / "rows.tbl")


def _rest_of_image_epoch(loader: ImageLoader) -> dict[str, np.ndarray]:
    images, labels, indices = [], [], []
    for batch in loader:
        images.append(batch.images.copy())
        labels.append(batch.labels.copy())
        indices.append(batch.indices.copy())
    return {"images": np.concatenate(images), "labels": np.concatenate(labels), "indices": np.concatenate(indices)}


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=False)
    record = {}

    image_path = _image_dataset(out)
    crop = RandomResizedCrop(6)
    loader = ImageLoader(image_path, 5, seed=7, hflip=0.5, random_resized_crop=crop, backend="numpy", prefetch=0)
    loader.set_epoch(3)
    it = iter(loader)
    for _ in range(3):
        next(it)
    del it
    record["image"] = {"state": loader.state_dict(), "kwargs": {"batch_size": 5, "seed": 7, "hflip": 0.5,
                                                               "random_resized_crop": 6}}
    np.savez(out / "image_rest.npz", **_rest_of_image_epoch(loader))
    loader.close()

    rows_path = _pytree_dataset(out)
    loader = PyTreeLoader(rows_path, 4, seed=11, backend="numpy", prefetch=0, return_indices=True)
    loader.set_epoch(2)
    it = iter(loader)
    for _ in range(4):
        next(it)
    del it
    record["pytree"] = {"state": loader.state_dict(), "kwargs": {"batch_size": 4, "seed": 11}}
    rest = [indices for _, indices in loader]
    np.save(out / "pytree_rest_indices.npy", np.concatenate(rest))
    loader.close()

    (out / "states.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
