"""Where the write tasks of a Ray job put their parts, and how the driver publishes them.

This is the one module that knows the destination is a filesystem path
(local, or shared by every node of the cluster): `TblDatasink` only calls
`LocalStaging`, so a backend for remote URLs (``s3://...``) replaces this
class without touching the sink.

Layout: every attempt of write task ``i`` writes its rows into its own part,
``<staging>/task-<i>-<random>``, where ``<staging>`` is a hidden temp folder
next to the destination (``.<name>.tbl-tmp-ray-<random>``, the writer's
temp-name convention, so it is never mistaken for a dataset). A task that
dies midway, or a retried task whose first attempt finished but whose result
was lost, leaves a part that no write result names: only the parts the
driver received are published, and the whole staging folder is removed
afterwards, success or failure. Publishing hard-links the parts' shard files
into the destination (`tbl_format.merge_manifests`: no copy) and writes the
manifest last; a destination without a manifest is not a dataset.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tbl_format

__all__ = ["LocalStaging"]

MANIFEST = "manifest.json"


class LocalStaging:
    """Parts of one write job under a staging folder next to ``dst``; `publish` makes them the dataset ``dst``."""

    def __init__(self, dst: str | os.PathLike[str]) -> None:
        self.dst = Path(os.path.abspath(dst))  # workers need not share the driver's working directory
        self.root = self.dst.parent / f".{self.dst.name}.tbl-tmp-ray-{secrets.token_hex(4)}"

    def check(self) -> None:
        """Refuse a destination that is not a new dataset folder (DestinationError / DestinationExistsError).

        An existing dataset is never replaced: the job publishes by linking its shards and writing a
        manifest, which `merge_manifests` does only where there is none.
        """
        if self.dst.exists() and not self.dst.is_dir():
            raise tbl_format.DestinationExistsError(f"{self.dst} exists and is not a folder; a Ray write makes a "
                                                    "dataset folder")
        tbl_format.check_destination(self.dst, directory=True, overwrite=False)

    def start(self) -> None:
        """On the driver, before any write task: check the destination and create the staging folder."""
        self.check()
        self.dst.parent.mkdir(parents=True, exist_ok=True)
        self.root.mkdir()

    def part_path(self, task_idx: int) -> Path:
        """A fresh path for one attempt of write task ``task_idx`` (on a worker)."""
        if not self.root.is_dir():
            raise FileNotFoundError(
                f"staging folder {self.root} does not exist: the job was not started by write_datasink "
                "(on_write_start), it already ended, or the destination is not on a filesystem this worker shares"
            )
        return self.root / f"task-{task_idx:06d}-{secrets.token_hex(4)}"

    def publish(self, parts: Sequence[str]) -> Path:
        """Join ``parts`` (in this order) into ``dst``; on failure remove what was linked into ``dst``."""
        self.check()  # again: the destination may have changed during the job
        created = not os.path.lexists(self.dst)
        linked = _link_names(parts)
        try:
            tbl_format.merge_manifests(list(parts), self.dst)
        except BaseException:
            if not os.path.lexists(self.dst / MANIFEST):
                for name in linked:
                    (self.dst / name).unlink(missing_ok=True)
                if created:
                    _rmdir_quietly(self.dst)
            raise
        return self.dst

    def publish_empty(self, schema: Any, metadata: dict[str, Any]) -> Path:
        """A dataset of zero rows at ``dst`` (a job whose every block was empty)."""
        self.check()
        tbl_format.write([], self.dst, schema=schema, metadata=metadata, shard_rows=1)
        return self.dst

    def discard(self) -> None:
        """Remove the staging folder and every part in it (published shards are links: they stay)."""
        shutil.rmtree(self.root, ignore_errors=True)


def _link_names(parts: Sequence[str]) -> list[str]:
    """The names `merge_manifests` gives the parts' shard files in the destination (part<n>-<file name>)."""
    names = []
    for n, part in enumerate(parts):
        ds = tbl_format.open(part)
        try:
            names.extend(f"part{n:05d}-{f.name}" for f in ds.files)
        finally:
            ds.close()
    return names


def _rmdir_quietly(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        pass
