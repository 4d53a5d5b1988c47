"""State dicts saved by tbl-loader 0.1.0 still resume exactly (vectors/v0.1.0, made by make_state_vectors.py).

Each vector holds a dataset, a state dict saved mid-epoch by that release and
everything the rest of that epoch held (sample rows, and for the image loader
every output element). Today's loaders load the state and must yield exactly
that remainder, augmentations included.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tbl_loader import ImageLoader, PyTreeLoader, RandomResizedCrop
from tbl_loader.errors import StateMismatchError

VECTORS = Path(__file__).parent / "vectors" / "v0.1.0"
STATES = json.loads((VECTORS / "states.json").read_text())


def test_image_loader_resumes_a_saved_state_exactly():
    vector = STATES["image"]
    kw = vector["kwargs"]
    want = np.load(VECTORS / "image_rest.npz")
    with ImageLoader(VECTORS / "images", kw["batch_size"], seed=kw["seed"], hflip=kw["hflip"],
                     random_resized_crop=RandomResizedCrop(kw["random_resized_crop"]), backend="numpy",
                     prefetch=1) as loader:
        loader.load_state_dict(vector["state"])
        batches = list(loader)
        assert loader.epoch == vector["state"]["epoch"] + 1
    assert np.array_equal(np.concatenate([b.indices for b in batches]), want["indices"])
    assert np.array_equal(np.concatenate([b.labels for b in batches]), want["labels"])
    assert np.array_equal(np.concatenate([b.images for b in batches]), want["images"])


def test_image_loader_state_dict_is_unchanged_for_the_same_position():
    vector = STATES["image"]
    kw = vector["kwargs"]
    with ImageLoader(VECTORS / "images", 3, seed=kw["seed"], hflip=kw["hflip"],
                     random_resized_crop=RandomResizedCrop(kw["random_resized_crop"]), backend="numpy") as loader:
        loader.load_state_dict(vector["state"])
        state = loader.state_dict()
        # Batch size is not part of the state; today's states add the settings behind the fingerprint.
        assert {k: v for k, v in state.items() if k != "stream_settings"} == vector["state"]
        assert state["stream_settings"]["hflip"] == kw["hflip"]


def test_an_old_state_with_other_settings_is_refused_by_its_fingerprint():
    vector = STATES["image"]
    kw = vector["kwargs"]
    assert "stream_settings" not in vector["state"]
    with ImageLoader(VECTORS / "images", 3, seed=kw["seed"], hflip=not kw["hflip"],
                     random_resized_crop=RandomResizedCrop(kw["random_resized_crop"]), backend="numpy") as loader:
        with pytest.raises(StateMismatchError, match="other stream settings"):
            loader.load_state_dict(vector["state"])


def test_pytree_loader_resumes_a_saved_state_exactly():
    vector = STATES["pytree"]
    kw = vector["kwargs"]
    want = np.load(VECTORS / "pytree_rest_indices.npy")
    with PyTreeLoader(VECTORS / "rows.tbl", kw["batch_size"], seed=kw["seed"], backend="numpy",
                      return_indices=True) as loader:
        loader.load_state_dict(vector["state"])
        rest = list(loader)
    assert np.array_equal(np.concatenate([indices for _, indices in rest]), want)
    ids = np.concatenate([batch["id"] for batch, _ in rest])
    assert np.array_equal(ids, want)  # row i holds id i
    names = [name for batch, _ in rest for name in batch["name"]]
    assert names == [f"row-{i}" for i in want]


def test_a_saved_state_of_another_dataset_is_still_refused():
    state = dict(STATES["pytree"]["state"], dataset="0" * 32)
    with PyTreeLoader(VECTORS / "rows.tbl", 4, seed=11, backend="numpy") as loader:
        with pytest.raises(StateMismatchError, match="another dataset"):
            loader.load_state_dict(state)
