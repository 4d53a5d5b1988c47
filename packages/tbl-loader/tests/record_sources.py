"""The same real photos with captions and labels written in every record layout a conversion reads, each with
that layout's own tools: WebDataset shards (webdataset's ShardWriter), Parquet with HF-style image structs
(pyarrow), a `datasets` folder (save_to_disk) and a JSONL manifest beside the image files.

Shared by the local conversion tests and the Ray engine's; each writer skips the test when its library is
missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from convert_images import jpeg_set, write_tree

CLASSES = ("cat", "dog", "fox")


def samples(per_class: int = 17) -> list[tuple[str, int, str, bytes]]:
    """(name, class index, caption, JPEG bytes) in the folder source's order (sorted names)."""
    out = []
    for c, cls in enumerate(CLASSES):
        for k, data in enumerate(jpeg_set(per_class, seed=c, lo=40, hi=110)):
            out.append((f"{cls}/{k:02d}.jpg", c, f"a {cls}, photo {k}: {'x' * (k % 5)}", data))
    return sorted(out)


def write_webdataset(folder: Path, rows: list, maxcount: int = 20) -> list[Path]:
    wds = pytest.importorskip("webdataset")
    folder.mkdir(parents=True, exist_ok=True)
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=maxcount, verbose=0) as sink:
        for i, (_, label, caption, data) in enumerate(rows):
            sink.write({"__key__": f"s{i:05d}", "jpg": data, "cls": label, "txt": caption})
    return sorted(folder.glob("shard-*.tar"))


def write_parquet(path: Path, rows: list, row_group_size: int = 16) -> Path:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({
        "image": [{"bytes": data, "path": name} for name, _, _, data in rows],
        "label": pa.array([label for _, label, _, _ in rows], pa.int64()),
        "caption": [caption for _, _, caption, _ in rows],
    })
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def hf_dataset(rows: list):
    """A `datasets.Dataset` of the rows with an ``Image`` feature and ``ClassLabel`` labels."""
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_dict({
        "image": [{"bytes": data, "path": None} for _, _, _, data in rows],
        "label": [label for _, label, _, _ in rows],
        "caption": [caption for _, _, caption, _ in rows],
    }).cast_column("image", datasets.Image()).cast_column("label", datasets.ClassLabel(names=list(CLASSES)))


def write_manifest(folder: Path, rows: list) -> Path:
    """The image files under ``folder`` and a JSONL manifest of them (labels as class names) in it."""
    write_tree(folder, {name: data for name, _, _, data in rows})
    manifest = folder / "train.jsonl"
    manifest.write_text("".join(json.dumps({"path": name, "label": CLASSES[label], "caption": caption}) + "\n"
                                for name, label, caption, _ in rows))
    return manifest
