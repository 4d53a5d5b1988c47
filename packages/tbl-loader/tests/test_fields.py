"""ImageLoader(fields=...): extra leaves batched by the pytree rules; labels of every kind."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_images

import tbl_format
from tbl_loader import ImageDataset, ImageLoader, Padded, PyTreeDataset

N = 45


def _samples(images, label_kind):
    rng = np.random.default_rng(1)
    for i in range(N):
        s = {"image": images[i],
             "caption": f"photo {i} " + "x" * (i % 5),
             "boxes": rng.random((i % 4, 4)).astype(np.float32),
             "multi": (rng.random(5) < 0.3).astype(np.float32),
             "score": float(i) / 7,
             "meta": {"id": i * 3, "size": np.array([i, i + 1], np.int32)}}
        if label_kind == "int":
            s["label"] = i % 3
        elif label_kind == "float":
            s["label"] = i / 3.0
        elif label_kind == "array":
            s["label"] = np.eye(4, dtype=np.float32)[i % 4]
        yield s


@pytest.fixture(scope="module", params=["int", "float", "array", "none"])
def labelled(request, tmp_path_factory):
    images = make_images(N)
    path = tbl_format.write(_samples(images, request.param), tmp_path_factory.mktemp("f") / "ds",
                            variable=["boxes"], shard_rows=20)
    return request.param, path


FIELDS = ("caption", "boxes", "multi", "score", "meta/id", "meta/size")


@pytest.mark.parametrize("var", ["list", "pad"])
def test_fields_are_the_pytree_batch(labelled, var):
    kind, path = labelled
    ref = PyTreeDataset(path, var=var)
    loader = ImageLoader(path, 8, fields=FIELDS, var=var, backend="numpy", seed=3, prefetch=2)
    assert len(list(loader.dataset.leaf_paths)) == 7 + (kind != "none")
    for batch in loader:
        want = ref.get_batch(np.asarray(batch.indices))
        assert list(batch.fields) == list(FIELDS)
        assert batch.fields["caption"] == want["caption"]
        for key in ("multi", "score"):
            assert np.array_equal(batch.fields[key], want[key])
        assert np.array_equal(batch.fields["meta/id"], want["meta"]["id"])
        assert np.array_equal(batch.fields["meta/size"], want["meta"]["size"])
        boxes = batch.fields["boxes"]
        if var == "pad":
            assert isinstance(boxes, Padded)
            assert np.array_equal(boxes.data, want["boxes"].data)
            assert np.array_equal(boxes.lengths, want["boxes"].lengths)
        else:
            assert all(np.array_equal(a, b) for a, b in zip(boxes, want["boxes"], strict=True))
        if kind == "none":
            assert batch.labels is None
        else:
            assert np.array_equal(batch.labels, want["label"])
            assert batch.labels.dtype == want["label"].dtype
            assert batch.labels.shape == ((len(batch.indices), 4) if kind == "array" else (len(batch.indices),))
    loader.close()
    ref.close()


def test_fields_as_torch_and_in_the_map_style_dataset(labelled):
    torch = pytest.importorskip("torch")
    kind, path = labelled
    loader = ImageLoader(path, 8, fields=("boxes", "multi", "caption"), seed=2)
    ds = ImageDataset.from_loader(loader)
    from tbl_loader import EpochBatchSampler

    plans = list(EpochBatchSampler(loader))
    for batch, plan in zip(loader, plans, strict=True):
        assert isinstance(batch.fields["multi"], torch.Tensor)
        assert all(isinstance(b, torch.Tensor) for b in batch.fields["boxes"])
        twin = ds.get_batch(plan)
        assert torch.equal(twin.fields["multi"], batch.fields["multi"])
        assert twin.fields["caption"] == batch.fields["caption"]
        assert all(torch.equal(a, b) for a, b in zip(twin.fields["boxes"], batch.fields["boxes"], strict=True))
        if kind != "none":
            assert torch.equal(twin.labels, batch.labels)
    loader.close()
    ds.close()


def test_bad_fields_are_refused(labelled):
    _, path = labelled
    with pytest.raises(KeyError, match="nope"):
        ImageLoader(path, 4, fields=("nope",), backend="numpy")
    with pytest.raises(ValueError, match="served as the batch's images"):
        ImageLoader(path, 4, fields=("image",), backend="numpy")
    with pytest.raises(TypeError, match="single string"):
        ImageLoader(path, 4, fields="caption", backend="numpy")
