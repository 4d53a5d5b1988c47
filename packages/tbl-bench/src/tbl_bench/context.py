"""Benchmark data, prepared once per data directory and reused across runs.

Every artefact is keyed by the parameters that produced it (a stamp file
records them); an artefact whose stamp differs is rebuilt, never silently
reused. Preparation runs in the parent process (a peer tool's data: in the
peer interpreter) and is not timed: conversion speed is measured by the
convert suite, in its own subprocesses.

A preparation step that cannot run here (a package not installed, a module not
written yet) raises `DataUnavailable` with the reason, and the configurations
that needed it are reported as skipped with that reason.
"""

from __future__ import annotations

import json
import pickle
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tbl_bench.data import ARRAY_ROWS, SCALAR_ROWS, array_rows, make_image_tar, scalar_rows
from tbl_bench.runner import call_in
from tbl_bench.user_data import UserData

__all__ = ["BenchContext", "DataUnavailable", "Sizes"]


class DataUnavailable(Exception):
    """A benchmark input cannot be prepared on this installation; the message says why."""


@dataclass(frozen=True)
class Sizes:
    """How big each workload is. `quick` proves the pipeline; the full sizes are what reports quote."""

    images: int
    classes: int
    image_size: int
    batch_size: int
    scalar_rows: int
    array_rows: int
    warmup: int
    epochs: int

    @classmethod
    def for_mode(cls, quick: bool) -> Sizes:
        if quick:
            return cls(images=1000, classes=100, image_size=160, batch_size=64,
                       scalar_rows=20_000, array_rows=100_000, warmup=1, epochs=2)
        return cls(images=10_000, classes=100, image_size=160, batch_size=64,
                   scalar_rows=SCALAR_ROWS, array_rows=ARRAY_ROWS, warmup=1, epochs=5)


class BenchContext:
    """Data directory + sizes + options, and the lazily prepared inputs of every suite.

    `peer_python`: the interpreter that runs the peer tools' configurations and
    prepares their data (default: this one, with the `[peers]` extra installed).
    `user`: the user's dataset and settings (`tbl_bench.user_data`), or None.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        quick: bool = False,
        peers: bool = False,
        peer_python: str | None = None,
        seed: int = 0,
        sizes: Sizes | None = None,
        user: UserData | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.quick = quick
        self.peers = peers
        self.peer_python = peer_python or sys.executable
        self.seed = seed
        self.sizes = sizes if sizes is not None else Sizes.for_mode(quick)
        # The user's own dataset and settings (`--data`); suites that take one measure it instead.
        self.user = user

    # -- artefacts -----------------------------------------------------------------------------
    def artifact(self, name: str, key: dict[str, Any], build: Callable[[Path], object]) -> Path:
        """`data_dir/name`, built by `build(path)` unless a stamp says it was built with the same `key`."""
        path = self.data_dir / name
        stamp = path.with_name(path.name + ".stamp.json")
        if path.exists() and stamp.exists() and json.loads(stamp.read_text()) == key:
            return path
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
        build(path)
        stamp.write_text(json.dumps(key, sort_keys=True))
        return path

    def peer_call(self, target: str, kwargs: dict[str, Any]) -> Any:
        """`target(**kwargs)` under the peer interpreter (RuntimeError when it fails)."""
        return call_in(self.peer_python, target, kwargs)

    def peer_artifact(self, name: str, key: dict[str, Any], target: str, kwargs: dict[str, Any]) -> Path:
        """An artefact a peer tool writes, built by `target(dst=path, **kwargs)` under the peer interpreter."""

        def build(path: Path) -> None:
            try:
                call_in(self.peer_python, target, {**kwargs, "dst": str(path)})
            except RuntimeError as e:
                raise DataUnavailable(f"{target} could not prepare {name}: {e}") from e

        return self.artifact(name, {**key, "peer_python": self.peer_python}, build)

    # -- images --------------------------------------------------------------------------------
    def image_tar(self) -> Path:
        s = self.sizes
        key = {"kind": "image_tar", "n": s.images, "classes": s.classes, "min": 250, "max": 500, "seed": self.seed}
        return self.artifact(f"photos-{s.images}.tar", key, lambda path: make_image_tar(
            path, s.images, num_classes=s.classes, seed=self.seed, progress=True))

    def tbl_images(self, size: int | None = None, mode: str = "squash") -> Path:
        size = size or self.sizes.image_size
        tar = self.image_tar()
        try:
            from tbl_loader import convert
        except ImportError as e:
            raise DataUnavailable(f"tbl_loader.convert is not importable: {e}") from e
        key = {"kind": "tbl_images", "tar": tar.name, "size": size, "mode": mode}
        return self.artifact(f"photos-{self.sizes.images}-{size}-{mode}.tbl", key, lambda path: convert(
            tar, path, size, mode=mode, report=False, progress=True))

    def turbo_images(self, size: int | None = None) -> Path:
        """The TAR through TurboLoader's `preprocess_to_tbl` (in the peer interpreter)."""
        size = size or self.sizes.image_size
        tar = self.image_tar()
        return self.peer_artifact(f"photos-{self.sizes.images}-{size}-turboloader.tbl",
                                  {"kind": "turbo_images", "tar": tar.name, "size": size},
                                  "tbl_bench.peers.turbo:turbo_preprocess", {"tar": str(tar), "size": size})

    def litdata_images(self, size: int | None = None) -> Path:
        """The TAR through `litdata.optimize` (in the peer interpreter)."""
        size = size or self.sizes.image_size
        tar = self.image_tar()
        return self.peer_artifact(f"photos-{self.sizes.images}-{size}-litdata",
                                  {"kind": "litdata_images", "tar": tar.name, "size": size},
                                  "tbl_bench.peers.litdata_peer:litdata_optimize", {"tar": str(tar), "size": size})

    def mosaic_images(self, size: int | None = None) -> Path:
        """The TAR as Mosaic streaming MDS shards (in the peer interpreter)."""
        size = size or self.sizes.image_size
        tar = self.image_tar()
        return self.peer_artifact(f"photos-{self.sizes.images}-{size}-mds",
                                  {"kind": "mosaic_images", "tar": tar.name, "size": size},
                                  "tbl_bench.peers.mosaic_peer:mosaic_write", {"tar": str(tar), "size": size})

    def webdataset_images(self, size: int | None = None) -> Path:
        """The TAR as webdataset shards (in the peer interpreter)."""
        size = size or self.sizes.image_size
        tar = self.image_tar()
        return self.peer_artifact(f"photos-{self.sizes.images}-{size}-wds",
                                  {"kind": "webdataset_images", "tar": tar.name, "size": size},
                                  "tbl_bench.peers.webdataset_peer:webdataset_write",
                                  {"tar": str(tar), "size": size, "count": self.sizes.images})

    def ffcv_images(self, size: int | None = None) -> Path:
        """The TAR as an FFCV .beton (in the peer interpreter; DataUnavailable where ffcv does not import)."""
        size = size or self.sizes.image_size
        try:
            reason = self.peer_call("tbl_bench.peers.ffcv_peer:ffcv_unavailable_reason", {})
        except RuntimeError as e:
            reason = str(e)
        if reason is not None:
            raise DataUnavailable(reason)
        tar = self.image_tar()
        return self.peer_artifact(f"photos-{self.sizes.images}-{size}.beton",
                                  {"kind": "ffcv_images", "tar": tar.name, "size": size},
                                  "tbl_bench.peers.ffcv_peer:ffcv_write", {"tar": str(tar), "size": size})

    # -- pytrees -------------------------------------------------------------------------------
    def _rows(self, kind: str):
        if kind == "scalar":
            return self.sizes.scalar_rows, scalar_rows(self.sizes.scalar_rows, seed=self.seed)
        if kind == "array":
            return self.sizes.array_rows, array_rows(self.sizes.array_rows, seed=self.seed)
        raise ValueError(f"pytree kind must be scalar or array, got {kind!r}")

    def tbl_rows(self, kind: str) -> Path:
        try:
            from tbl_format import write
        except ImportError as e:
            raise DataUnavailable(f"tbl_format.write is not available: {e}") from e
        n, rows = self._rows(kind)
        key = {"kind": "tbl_rows", "rows": kind, "n": n, "seed": self.seed}
        return self.artifact(f"rows-{kind}-{n}.tbl", key, lambda path: write(rows, path))

    def pickled_rows(self, kind: str) -> Path:
        """The same rows as one pickle of a list of dicts: the all-in-RAM Python reference."""
        n, rows = self._rows(kind)

        def build(path: Path) -> None:
            with open(path, "wb") as f:
                pickle.dump(list(rows), f, protocol=pickle.HIGHEST_PROTOCOL)

        return self.artifact(f"rows-{kind}-{n}.pkl", {"kind": "pickled_rows", "rows": kind, "n": n,
                                                       "seed": self.seed}, build)
