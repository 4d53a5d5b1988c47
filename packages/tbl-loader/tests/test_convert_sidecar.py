"""tbl convert --keep-path / --sidecar, and the dataset it makes served with fields, a transform and two crop views.

The end-to-end check of issue 13: an image + caption + boxes + multi-label dataset converted from a
folder with a sidecar file, served with a user transform and two crop views, equal element for
element across prefetch on/off, batch sizes 7 and 64, 1 vs 2 ranks and a mid-epoch resume.
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from convert_images import jpeg_set, run_cli, write_tree
from PIL import Image

from tbl_loader import ImageLoader, PyTreeDataset, RandomResizedCrop, convert
from tbl_loader.errors import SidecarError
from tbl_loader.stream import keys_uniform, numpy_generator

pytest.importorskip("skimage")

N_PER_CLASS = 11
CROPS = [RandomResizedCrop(24, scale=(0.35, 1.0)), RandomResizedCrop(12, scale=(0.05, 0.35))]
FIELDS = ("caption", "boxes", "multi", "path", "orig_size")


def _sidecar_values(names):
    rng = np.random.default_rng(7)
    out = {}
    for k, name in enumerate(names):
        boxes = rng.random((k % 4, 4)).round(3).tolist()  # 0 to 3 boxes per image
        out[name] = {"caption": f"a photo numbered {k}", "boxes": boxes,
                     "multi": (rng.random(6) < 0.4).astype(int).tolist()}
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("sidecar")
    files = {}
    for c, cls in enumerate(("cat", "dog")):
        for k, data in enumerate(jpeg_set(N_PER_CLASS, seed=c, lo=30, hi=90)):
            files[f"{cls}/{k:02d}.jpg"] = data
    src = write_tree(root / "src", files)
    side = _sidecar_values(sorted(files))
    side["cat/unknown.jpg"] = {"caption": "ignored", "boxes": [], "multi": [0] * 6}  # names no image: ignored
    sidecar = root / "side.json"
    sidecar.write_text(json.dumps(side))
    dst = root / "ds"
    convert(src, dst, 32, workers=1, progress=False, shard_rows=8, keep_path=True, sidecar=sidecar)
    return src, dst, side, files


def test_columns_hold_the_path_original_size_and_sidecar_fields(converted):
    src, dst, side, files = converted
    ds = PyTreeDataset(dst)
    schema = ds.schema.leaves
    assert schema["path"].kind == "str" and schema["orig_size"].kind == "array"
    assert schema["caption"].kind == "str"
    assert schema["boxes"].kind == "var_array" and schema["boxes"].dtype == "float32" and schema["boxes"].ndim == 2
    assert schema["multi"].kind == "array" and schema["multi"].shape == (6,) and schema["multi"].dtype == "int64"
    names = sorted(files)
    assert len(ds) == len(names)
    for i, name in enumerate(names):
        row = ds[i]
        assert row["path"] == name and row["label"] == (0 if name.startswith("cat") else 1)
        with Image.open(src / name) as img:
            assert row["orig_size"].tolist() == [img.height, img.width]
        assert row["caption"] == side[name]["caption"]
        assert np.array_equal(row["boxes"], np.asarray(side[name]["boxes"], np.float32).reshape(-1, 4))
        assert row["multi"].tolist() == side[name]["multi"]
    ds.close()


def test_csv_sidecar_and_the_cli(converted, tmp_path):
    src, _, side, files = converted
    table = io.StringIO()
    w = csv.writer(table)
    w.writerow(["path", "caption", "score"])
    for k, name in enumerate(sorted(files)):
        w.writerow([name, side[name]["caption"], k / 4])
    (tmp_path / "side.csv").write_text(table.getvalue())
    result = run_cli(str(src), str(tmp_path / "out.tbl"), "--size", "16", "--workers", "1", "--quiet",
                     "--keep-path", "--sidecar", str(tmp_path / "side.csv"))
    assert result.returncode == 0, result.stderr
    ds = PyTreeDataset(tmp_path / "out.tbl")
    assert ds.schema.leaves["score"].kind == "float" and ds[3]["score"] == 0.75
    assert ds[3]["caption"] == side[sorted(files)[3]]["caption"]
    ds.close()


def test_a_missing_entry_is_refused_and_nothing_is_written(converted, tmp_path):
    src, _, side, files = converted
    partial = dict(side)
    partial.pop(sorted(files)[5])
    (tmp_path / "p.json").write_text(json.dumps(partial))
    with pytest.raises(SidecarError, match="no entry for image 'cat/05.jpg'"):
        convert(src, tmp_path / "x.tbl", 16, workers=1, progress=False, sidecar=tmp_path / "p.json")
    assert not (tmp_path / "x.tbl").exists()
    bad = {name: {"label": 1} for name in files}
    (tmp_path / "r.json").write_text(json.dumps(bad))
    with pytest.raises(SidecarError, match="reserved"):
        convert(src, tmp_path / "y.tbl", 16, workers=1, progress=False, sidecar=tmp_path / "r.json")
    result = run_cli(str(src), str(tmp_path / "z.tbl"), "--size", "16", "--quiet", "--sidecar",
                     str(tmp_path / "p.json"))
    assert result.returncode != 0 and "no entry for image" in result.stderr
    assert not (tmp_path / "z.tbl").exists()


# ---- served: fields, a keyed transform, two views; equal element for element every way -------------

def _np(x):
    return x.numpy() if hasattr(x, "numpy") else np.asarray(x)


def colour_jitter(batch):
    """Per-sample brightness and noise drawn from the sample keys only."""
    gain = (0.7 + 0.6 * keys_uniform(batch.keys, draw=1)).astype(np.float32)
    views = []
    for view in batch.views:
        out = _np(view).astype(np.float32, copy=True) * gain[:, None, None, None]
        for k, key in enumerate(batch.keys):
            out[k] += numpy_generator(key).normal(0.0, 0.05, out.shape[1:]).astype(np.float32)
        views.append(out)
    return batch._replace(views=tuple(views))


def _loader(dst, **kw):
    kw.setdefault("backend", "numpy")
    return ImageLoader(dst, fields=FIELDS, random_resized_crop=CROPS, hflip=0.5, seed=13, transform=colour_jitter,
                       padding="drop", **kw)


def _elements(batches):
    """Every element of every batch, flattened to per-sample records."""
    out = []
    for b in batches:
        for j in range(len(b.indices)):
            out.append((
                [v[j].copy() for v in b.views], _np(b.labels)[j], int(_np(b.indices)[j]), int(b.keys[j]),
                b.fields["caption"][j], np.array(b.fields["boxes"][j]), _np(b.fields["multi"])[j].copy(),
                b.fields["path"][j], _np(b.fields["orig_size"])[j].copy(),
            ))
    return out


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert all(np.array_equal(p, q) for p, q in zip(x[0], y[0], strict=True))
        assert x[1:5] == y[1:5] and x[7] == y[7]
        assert np.array_equal(x[5], y[5]) and np.array_equal(x[6], y[6]) and np.array_equal(x[8], y[8])


def test_served_equal_across_prefetch_batch_size_ranks_and_resume(converted):
    _, dst, side, _ = converted
    straight = _elements(_loader(dst, batch_size=7, prefetch=0))
    assert len(straight) == 2 * N_PER_CLASS
    for rec in straight:  # the fields are the sidecar's, row by row
        assert rec[4] == side[rec[7]]["caption"] and rec[6].tolist() == side[rec[7]]["multi"]
        assert [tuple(v.shape) for v in rec[0]] == [(3, 24, 24), (3, 12, 12)]
    _same(_elements(_loader(dst, batch_size=64, prefetch=2)), straight)
    ranks = [_elements(_loader(dst, batch_size=7, rank=r, world_size=2)) for r in range(2)]
    interleaved = [rec for pair in zip(*ranks, strict=True) for rec in pair]
    _same(interleaved, straight[: len(interleaved)])
    first = _loader(dst, batch_size=7, prefetch=2)
    it = iter(first)
    head = _elements([next(it), next(it)])
    state = first.state_dict()
    first.close()
    resumed = _loader(dst, batch_size=64, prefetch=0)
    resumed.load_state_dict(state)
    _same(head + _elements(resumed), straight)
