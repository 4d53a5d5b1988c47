"""Which source `tbl convert` reads, detected from the path or named (``source_format=``, ``--from``).

==============  =========================================================  ===========================================
format          source                                                     detected when
==============  =========================================================  ===========================================
``tar``         ImageNet-layout TAR (`tbl_loader.conversion.sources`)       any other file
``folder``      class-folder tree (`tbl_loader.conversion.sources`)         any other folder
``webdataset``  WebDataset shards (`tbl_loader.conversion.webdataset`)      a brace pattern, a list of paths with
                                                                           ``source_format``, a folder of ``.tar`` only
``parquet``     Parquet (`tbl_loader.conversion.tables`)                    a ``.parquet`` file, a folder of them only
``arrow``       Arrow IPC (`tbl_loader.conversion.tables`)                  a ``.arrow`` / ``.feather`` file
``hf``          HuggingFace `datasets` (`tbl_loader.conversion.tables`)     a `datasets.Dataset`, a ``save_to_disk``
                                                                           folder
``manifest``    CSV / JSONL of paths (`tbl_loader.conversion.manifest`)     a ``.jsonl``, ``.csv`` or ``.tsv`` file
==============  =========================================================  ===========================================

A Python list of ``(path, label)`` pairs stays the list source. A single
``.tar`` is an ImageNet-layout TAR unless named ``webdataset``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from ..errors import SourceError
from .manifest import MANIFEST_SUFFIXES, read_manifest
from .records import RecordSink
from .sources import Listing, open_source
from .tables import is_hf_dataset, is_hf_folder, read_arrow, read_hf, read_parquet
from .webdataset import expand_shards, read_webdataset

__all__ = ["FORMATS", "RECORD_FORMATS", "detect_format", "open_any_source"]

FORMATS: Final = ("tar", "folder", "webdataset", "parquet", "arrow", "hf", "manifest")
RECORD_FORMATS: Final = ("webdataset", "parquet", "arrow", "hf", "manifest")


def _only(folder: Path, suffix: str) -> bool:
    """Whether the folder's visible entries are all files ending in ``suffix`` (and there is one)."""
    names = [e for e in os.scandir(folder) if not e.name.startswith(".")]
    return bool(names) and all(e.is_file() and e.name.endswith(suffix) for e in names)


def detect_format(src: object) -> str | None:
    """The record format ``src`` is in (see the module docstring); None for a TAR, folder or list source."""
    if is_hf_dataset(src):
        return "hf"
    if not isinstance(src, (str, os.PathLike)):
        return None
    text = os.fspath(src)
    if "{" in text and "}" in text:
        return "webdataset"
    path = Path(text)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".arrow", ".feather"):
        return "arrow"
    if suffix in MANIFEST_SUFFIXES:
        return "manifest"
    if path.is_dir():
        if is_hf_folder(path):
            return "hf"
        if _only(path, ".parquet"):
            return "parquet"
        if _only(path, ".tar"):
            return "webdataset"
    return None


def _where(src: object) -> str:
    if isinstance(src, (str, os.PathLike)):
        return f"source {os.fspath(src)!r}"
    return "the dataset" if is_hf_dataset(src) else "the shard list"


@contextmanager
def open_any_source(
    src: Any,
    *,
    source_format: str | None = None,
    label_file: str | os.PathLike[str] | None = None,
    scratch_dir: str | os.PathLike[str] | None = None,
    image_key: str | None = None,
    label_key: str | None = None,
    on_error: str = "fail",
    max_bytes: int,
) -> Iterator[Listing]:
    """List any source (`open_source` for a TAR, folder or list; a `RecordSink` for a record format).

    Args:
        src: the source (a path, a shard list, a `datasets.Dataset`, a list of (path, label)).
        source_format: one of `FORMATS`, or None to detect it (`detect_format`).
        label_file: a TAR or folder source's label file.
        scratch_dir: where scratch files go (a decompressed TAR, a record source's image bytes).
        image_key: a record source's image member / column.
        label_key: a record source's label member / column.
        on_error: "fail" or "skip", for samples a record source cannot give.
        max_bytes: the cap on one image's encoded size.
    """
    if source_format is not None and source_format not in FORMATS:
        raise ValueError(f"source format must be one of {FORMATS}, got {source_format!r}")
    fmt = source_format or detect_format(src)
    if fmt not in RECORD_FORMATS:
        for name, value in (("image_key", image_key), ("label_key", label_key)):
            if value is not None:
                raise ValueError(f"{name} applies to a record source ({', '.join(RECORD_FORMATS)}), not to a TAR "
                                 "or folder source")
        with open_source(src, label_file=label_file, scratch_dir=scratch_dir) as listing:
            if fmt is not None and listing.kind != fmt:
                raise SourceError(f"{_where(src)} is a {listing.kind} source, not {fmt}")
            yield listing
        return
    if label_file is not None:
        raise ValueError("label_file applies to a TAR or folder source; a record source's labels are its "
                         "label_key field")
    default_label = "cls" if fmt == "webdataset" else "label"
    sink = RecordSink(fmt, _where(src), label_key=label_key or default_label, on_error=on_error,
                      max_bytes=max_bytes, scratch_dir=scratch_dir)
    try:
        classes = None
        if fmt == "webdataset":
            read_webdataset(expand_shards(_shard_source(src)), sink, image_key=image_key, label_key=label_key)
        elif fmt == "hf":
            classes = read_hf(src, sink, image_key=image_key, label_key=label_key)
        else:
            if not isinstance(src, (str, os.PathLike)):
                raise SourceError(f"a {fmt} source is a path, got {type(src).__name__}")
            path = Path(os.path.abspath(src))
            if not path.exists():
                raise SourceError(f"{_where(src)} does not exist")
            reader = {"parquet": read_parquet, "arrow": read_arrow, "manifest": read_manifest}[fmt]
            reader(path, sink, image_key=image_key, label_key=label_key)
        yield sink.listing(classes)
    finally:
        sink.close()


def _shard_source(src: Any) -> str | os.PathLike[str] | Sequence[str | os.PathLike[str]]:
    if isinstance(src, (str, os.PathLike)):
        return src
    shards = list(src)
    if not all(isinstance(s, (str, os.PathLike)) for s in shards):
        raise SourceError("a WebDataset source is a pattern, a folder, or a list of shard paths")
    return shards
