"""The convert suite's TAR rewritten in the layouts `tbl convert` also reads: WebDataset, Parquet, datasets, manifest.

Every layout holds the TAR's images (the same encoded bytes) and labels, in
the TAR's sorted order, so converting any of them does the same decoding work
as converting the TAR: the difference is what reading the layout costs.
Labels are class indices (the sorted class folders). Each writer writes under
a temporary name and renames into place, so an interrupted run leaves nothing
under ``dst``.

- WebDataset: shards of ``SHARD_SAMPLES`` keys (``.jpg`` + ``.cls``), written
  with plain `tarfile` in WebDataset's layout.
- Parquet: one file, HuggingFace-style ``{bytes, path}`` image structs, row
  groups of ``ROW_GROUP_ROWS`` rows (pyarrow).
- datasets: ``Dataset.from_dict`` cast to ``Image`` and ``ClassLabel``, saved
  with ``save_to_disk`` (the `datasets` library).
- manifest: the images extracted into a folder, with ``train.jsonl`` of paths
  and labels beside them.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["LAYOUTS", "ROW_GROUP_ROWS", "SHARD_SAMPLES", "layout_path", "tar_samples", "write_atomically",
           "write_layout"]

SHARD_SAMPLES = 1000  # keys per WebDataset shard (img2dataset's default is 10,000: larger shards, same reading)
ROW_GROUP_ROWS = 256  # rows per Parquet row group (~30 MiB of 250-500 px JPEGs)
LAYOUTS = ("webdataset", "parquet", "hf", "manifest")


def tar_samples(tar: str | os.PathLike[str]) -> list[tuple[str, int, bytes]]:
    """(name, label, bytes) of the TAR's images in sorted name order; label: index of the sorted class folder."""
    with tarfile.open(os.fspath(tar)) as tf:
        found = [(m.name, tf.extractfile(m).read()) for m in tf if m.isfile()]  # type: ignore[union-attr]
    found.sort()
    classes = sorted({n.rsplit("/", 2)[-2] for n, _ in found})
    index = {c: i for i, c in enumerate(classes)}
    return [(n, index[n.rsplit("/", 2)[-2]], data) for n, data in found]


def _webdataset(samples: list[tuple[str, int, bytes]], out: Path) -> None:
    out.mkdir()
    for shard, start in enumerate(range(0, len(samples), SHARD_SAMPLES)):
        with tarfile.open(out / f"{shard:06d}.tar", "w") as tf:
            for k in range(start, min(start + SHARD_SAMPLES, len(samples))):
                _, label, data = samples[k]
                for ext, payload in (("jpg", data), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{k:08d}.{ext}")
                    info.size = len(payload)
                    tf.addfile(info, io.BytesIO(payload))


def _parquet(samples: list[tuple[str, int, bytes]], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image": [{"bytes": d, "path": n} for n, _, d in samples],
                      "label": pa.array([y for _, y, _ in samples], pa.int64())})
    pq.write_table(table, out, row_group_size=ROW_GROUP_ROWS)


def _hf(samples: list[tuple[str, int, bytes]], out: Path) -> None:
    import datasets

    names = [str(i) for i in range(max(y for _, y, _ in samples) + 1)]
    ds = datasets.Dataset.from_dict({"image": [{"bytes": d, "path": None} for _, _, d in samples],
                                     "label": [y for _, y, _ in samples]})
    ds = ds.cast_column("image", datasets.Image()).cast_column("label", datasets.ClassLabel(names=names))
    ds.save_to_disk(str(out))


def _manifest(samples: list[tuple[str, int, bytes]], out: Path) -> None:
    for name, _, data in samples:
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (out / "train.jsonl").write_text("".join(json.dumps({"path": n, "label": y}) + "\n" for n, y, _ in samples))


_WRITERS: dict[str, Callable[[list[tuple[str, int, bytes]], Path], None]] = {
    "webdataset": _webdataset, "parquet": _parquet, "hf": _hf, "manifest": _manifest}


def layout_path(layout: str, written: Path) -> Path:
    """What `tbl convert` is given for a layout written at ``written`` (the manifest file for a manifest)."""
    return written / "train.jsonl" if layout == "manifest" else written


def write_layout(tar: str | os.PathLike[str], layout: str, dst: str | os.PathLike[str]) -> None:
    """Write the images and labels of the ImageNet-layout ``tar`` in ``layout`` (one of `LAYOUTS`) at ``dst``.

    Args:
        tar: the source TAR.
        layout: "webdataset", "parquet", "hf" or "manifest".
        dst: the folder (the Parquet file) to write; it must not exist.
    """
    def write(tmp: Path) -> None:
        if layout == "manifest":
            tmp.mkdir()
        _WRITERS[layout](tar_samples(tar), tmp)

    write_atomically(Path(dst), write)


def write_atomically(dst: Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` (a file or a folder) under a temporary name beside ``dst``, renamed to ``dst`` once
    whole: an interrupted run leaves nothing under ``dst`` (the temporary is removed)."""
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, dst)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp)
        else:
            tmp.unlink(missing_ok=True)
        raise
    return dst
