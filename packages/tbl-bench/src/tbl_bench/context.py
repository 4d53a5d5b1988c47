"""Benchmark data, prepared once per data directory and reused across runs.

Every artefact is keyed by the parameters that produced it (a stamp file
records them); an artefact whose stamp differs is rebuilt, never silently
reused. Preparation runs in the parent process and is not timed: conversion
speed is measured by the convert suite, in its own subprocesses.

A preparation step that cannot run here (a package not installed, a module not
written yet) raises `DataUnavailable` with the reason, and the configurations
that needed it are reported as skipped with that reason.
"""

from __future__ import annotations

import json
import pickle
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tbl_bench import data

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
                   scalar_rows=data.SCALAR_ROWS, array_rows=data.ARRAY_ROWS, warmup=1, epochs=5)


class BenchContext:
    """Data directory + sizes + options, and the lazily prepared inputs of every suite."""

    def __init__(
        self,
        data_dir: str | Path,
        *,
        quick: bool = False,
        peers: bool = False,
        seed: int = 0,
        sizes: Sizes | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.quick = quick
        self.peers = peers
        self.seed = seed
        self.sizes = sizes if sizes is not None else Sizes.for_mode(quick)

    # -- stamps --------------------------------------------------------------------------------
    def _fresh(self, path: Path, key: dict[str, Any]) -> bool:
        stamp = path.with_name(path.name + ".stamp.json")
        return path.exists() and stamp.exists() and json.loads(stamp.read_text()) == key

    def _stamp(self, path: Path, key: dict[str, Any]) -> None:
        path.with_name(path.name + ".stamp.json").write_text(json.dumps(key, sort_keys=True))

    def _clear(self, path: Path) -> None:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)

    # -- images --------------------------------------------------------------------------------
    def image_tar(self) -> Path:
        s = self.sizes
        path = self.data_dir / f"photos-{s.images}.tar"
        key = {"kind": "image_tar", "n": s.images, "classes": s.classes, "min": 250, "max": 500, "seed": self.seed}
        if not self._fresh(path, key):
            data.make_image_tar(path, s.images, num_classes=s.classes, seed=self.seed, progress=True)
            self._stamp(path, key)
        return path

    def tbl_images(self, size: int | None = None, mode: str = "squash") -> Path:
        size = size or self.sizes.image_size
        tar = self.image_tar()
        try:
            from tbl_loader import convert
        except ImportError as e:
            raise DataUnavailable(f"tbl_loader.convert is not importable: {e}") from e
        path = self.data_dir / f"photos-{self.sizes.images}-{size}-{mode}.tbl"
        key = {"kind": "tbl_images", "tar": tar.name, "size": size, "mode": mode}
        if not self._fresh(path, key):
            self._clear(path)
            convert(tar, path, size, mode=mode, report=False, progress=True)
            self._stamp(path, key)
        return path

    def turbo_images(self, size: int | None = None) -> Path:
        size = size or self.sizes.image_size
        tar = self.image_tar()
        try:
            import turboloader
        except ImportError as e:
            raise DataUnavailable(f"turboloader is not installed (pip install 'tbl-bench[peers]'): {e}") from e
        path = self.data_dir / f"photos-{self.sizes.images}-{size}-turboloader.tbl"
        key = {"kind": "turbo_images", "tar": tar.name, "size": size, "version": turboloader.__version__}
        if not self._fresh(path, key):
            self._clear(path)
            turboloader.preprocess_to_tbl(str(tar), str(path), image_size=size, num_workers=2)
            self._stamp(path, key)
        return path

    def litdata_images(self, size: int | None = None) -> Path:
        size = size or self.sizes.image_size
        tar = self.image_tar()
        from tbl_bench.harness import SkipConfig
        from tbl_bench.peers.litdata_peer import litdata_optimize

        path = self.data_dir / f"photos-{self.sizes.images}-{size}-litdata"
        key = {"kind": "litdata_images", "tar": tar.name, "size": size}
        if not self._fresh(path, key):
            self._clear(path)
            try:
                litdata_optimize(tar, path, size)
            except SkipConfig as e:
                raise DataUnavailable(str(e)) from e
            self._stamp(path, key)
        return path

    # -- pytrees -------------------------------------------------------------------------------
    def _rows(self, kind: str):
        if kind == "scalar":
            return self.sizes.scalar_rows, data.scalar_rows(self.sizes.scalar_rows, seed=self.seed)
        if kind == "array":
            return self.sizes.array_rows, data.array_rows(self.sizes.array_rows, seed=self.seed)
        raise ValueError(f"pytree kind must be scalar or array, got {kind!r}")

    def tbl_rows(self, kind: str) -> Path:
        try:
            import tbl_format
            write = tbl_format.write
        except (ImportError, AttributeError) as e:
            raise DataUnavailable(f"tbl_format.write is not available: {e}") from e
        n, rows = self._rows(kind)
        path = self.data_dir / f"rows-{kind}-{n}.tbl"
        key = {"kind": "tbl_rows", "rows": kind, "n": n, "seed": self.seed}
        if not self._fresh(path, key):
            self._clear(path)
            write(rows, path)
            self._stamp(path, key)
        return path

    def pickled_rows(self, kind: str) -> Path:
        """The same rows as one pickle of a list of dicts: the all-in-RAM Python reference."""
        n, rows = self._rows(kind)
        path = self.data_dir / f"rows-{kind}-{n}.pkl"
        key = {"kind": "pickled_rows", "rows": kind, "n": n, "seed": self.seed}
        if not self._fresh(path, key):
            with open(path, "wb") as f:
                pickle.dump(list(rows), f, protocol=pickle.HIGHEST_PROTOCOL)
            self._stamp(path, key)
        return path
