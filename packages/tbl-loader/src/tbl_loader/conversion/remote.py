"""`tbl convert SRC URL`: convert into a private local folder, upload the shards, publish the manifest last.

The local copy lives in a temporary folder (``TMPDIR``) and is removed after the
upload, whatever happens. Nothing reaches the URL before the conversion has
finished and every shard was checked; the manifest is uploaded after every shard
(:func:`tbl_loader.source.upload.upload_dataset`), so a reader never sees a partial
dataset. A URL ending in ``/`` receives a dataset directory (use
``--shard-rows`` or ``--shards``); one ending in ``.tbl`` a single file.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..source.storage import open_store, redact
from ..source.upload import upload_dataset

__all__ = ["convert_to_url"]


def convert_to_url(convert: Any, src: Any, url: str, *args: Any, storage_options: dict[str, Any] | None = None,
                   **kwargs: Any) -> Any:
    """``convert(src, <local temporary dst>, *args, **kwargs)``, then upload it to ``url``; returns the report."""
    directory = url.endswith("/")
    if not directory and not url.lower().endswith(".tbl"):
        raise ValueError(f"{redact(url)}: a URL destination ends in '/' (a dataset directory) or '.tbl' (one file)")
    if directory and kwargs.get("shard_rows") is None and kwargs.get("shards") is None:
        raise ValueError(f"{redact(url)}: a directory URL needs --shard-rows or --shards")
    open_store(url, storage_options)  # no storage library: refused now, before converting anything
    if kwargs.get("report") is None:
        kwargs["report"] = False  # the default report path would be beside the URL
    workdir = Path(tempfile.mkdtemp(prefix="tbl-convert-"))
    try:
        local = workdir / ("dataset" if directory else url.rpartition("/")[2])
        report = convert(src, local, *args, **kwargs)
        upload_dataset(local, url, storage_options=storage_options)
        return report
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
