"""Publish a local dataset to a URL: every shard first, the manifest last.

A reader opens a remote dataset through its manifest, so until the manifest
object is written no reader sees the new dataset, and after it is written every
shard it names is already in place: a reader never sees a partial dataset.
Each local shard is checked (header and tables, ``tbl_format.open``) before it
is uploaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tbl_format

from .storage import open_store

__all__ = ["upload_dataset"]


def upload_dataset(source: str | os.PathLike[str], url: str, *,
                   storage_options: dict[str, Any] | None = None) -> int:
    """Upload local dataset ``source`` (a dataset directory, or one ``.tbl`` file) to ``url``; returns bytes sent.

    A directory goes to ``url`` as a prefix (``s3://bucket/prefix/``): its shards
    under their manifest names, then ``manifest.json``. A single file goes to
    ``url`` itself when it ends in ``.tbl``, else under its own name below it.
    """
    source = Path(source)
    ds = tbl_format.open(source)  # the whole dataset's headers checked before anything is sent
    try:
        files = ds.files
        single = not source.is_dir()
    finally:
        ds.close()
    if single:
        if url.lower().endswith(".tbl") and not url.endswith("/"):
            base, _, name = url.rpartition("/")
        else:
            base, name = url, source.name
        store = open_store(base, storage_options)
        store.upload(name, source)
        return source.stat().st_size
    store = open_store(url, storage_options)
    sent = 0
    for path in files:
        name = path.relative_to(source).as_posix()
        store.upload(name, path)
        sent += path.stat().st_size
    manifest = (source / "manifest.json").read_bytes()
    store.put_bytes("manifest.json", manifest)  # last: publishes the dataset
    return sent + len(manifest)
