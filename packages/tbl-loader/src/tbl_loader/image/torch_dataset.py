"""Map-style access to an image dataset, for torch's ``DataLoader`` and samplers.

:class:`ImageDataset` serves the samples an :class:`~tbl_loader.ImageLoader`
serves (same normalization, flips, crops, dtype, layout and subset), by
position: ``len(ds)``, ``ds[i]`` (one ``(image, label)`` pair), and
``ds.get_batch(positions)`` / ``__getitems__`` (one :class:`~tbl_loader.Batch`
made by the same kernel calls as the loader's batches, bit for bit). Build it
with ``ImageDataset.from_loader(loader)`` or ``ImageDataset(path, **image_options)``.
Fixed-size and variable-size images (``tbl convert --max-size``, raw or JPEG, with
``fields=`` and several crop views) alike: the batch source is made by the loader's
own binding (:func:`tbl_loader.image.loader.bind_source`). The twin of a loader that
decodes on the GPU (``decode_device``) is refused: its workers would decode on the CPU.

Augmentation draws depend on the epoch (a pure function of ``(seed, epoch,
row)``). :class:`EpochBatchSampler` yields the loader's batches of the current
epoch as :class:`EpochBatch` lists of positions that carry their epoch, so
worker processes (spawn or fork, persistent or not) draw exactly what the
loader draws; a plain list of positions uses ``ds.epoch`` (``ds.set_epoch``).

torch's DataLoader::

    ds = ImageDataset.from_loader(loader)
    DataLoader(ds, batch_sampler=EpochBatchSampler(loader), collate_fn=collate_identity,
               num_workers=2, multiprocessing_context="spawn")

``collate_identity`` yields the dataset's ``Batch`` (one kernel call per batch);
torch's default collate also works (it stacks ``ds[i]`` samples row by row: ``(image, label)``, followed by
``{path: value}`` of the fields when the dataset serves ``fields``).

Processes: pickling keeps the path, the options and the dataset's fingerprint;
the copy opens the dataset on first use and raises
``tbl_format.DatasetChangedError`` if it changed meanwhile.

URLs (``s3://bucket/prefix/``, ``gs://``, ``az://``, ``http(s)://``; needs
``tbl-loader[remote]``): each process opens a
:class:`~tbl_loader.source.remote.RemoteDataset` on the same ``cache_dir``
(the shard cache the loader uses: checked downloads under a per-shard file
lock, so the node's processes, DataLoader workers and ranks alike, download
each shard once), and a batch maps the shards it reads before reading them.
The batches of :class:`EpochBatchSampler` carry their place in the pass
(:class:`PassPlan`): at its first batch of a pass, a worker hands its
dataset's background fetcher the rows of the batches torch will give it, so
their shards are downloaded ahead, as ImageLoader's are.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

import tbl_format

from ..errors import UnsupportedCombinationError
from ..host.output import OutputSpec
from ..pytree.dataset import CollatedBatch, as_indices
from ..source.local import LocalShards
from ..source.storage import is_url
from ..source.verify import verify_mode
from ..stream.order import BatchPlan, EpochOrder
from ..stream.subset import resolve_rows
from .loader import Batch, bind_source
from .spec import ImageSpec

__all__ = ["EpochBatch", "EpochBatchSampler", "ImageDataset", "PassPlan"]


def _worker_slot() -> tuple[int, int]:
    """(this DataLoader worker's id, the worker count), or (0, 1) outside a worker."""
    torch = sys.modules.get("torch")  # a worker has imported it; never imported here for this
    info = None if torch is None else torch.utils.data.get_worker_info()
    return (0, 1) if info is None else (int(info.id), int(info.num_workers))


class EpochBatch(list):
    """A batch of dataset positions (a list of ints) tagged with the ``epoch`` its augmentation belongs to.

    ``plan``: where the batch sits in its pass (:class:`PassPlan`), which lets the process that reads it
    download ahead the shards of a URL dataset its next batches read; None for a batch of its own."""

    def __init__(self, positions: Any, epoch: int, plan: PassPlan | None = None) -> None:
        super().__init__(positions)
        self.epoch = int(epoch)
        self.plan = plan


@dataclass(frozen=True)
class PassPlan:
    """Batch ``number`` of the pass that the order ``order`` (an EpochOrder without its shards' rows, which
    the reading process takes from its own dataset) cut into batches of ``batch_size``: a few numbers, so
    that every batch carries it to a DataLoader worker at no cost."""

    order: dict[str, Any]
    batch_size: int
    drop_last: bool
    number: int

    def batches_of_worker(self, shard_rows: Any, worker: int, workers: int) -> np.ndarray:
        """The positions of the pass's batches from this one on that torch's DataLoader hands ``worker`` of
        ``workers`` (batch ``k`` to worker ``k % workers``), in the order they come."""
        order = EpochOrder(**self.order, shard_rows=tuple(shard_rows) if self.order["shuffle"] == "block" else None)
        ids, size = order.indices, self.batch_size
        first = self.number + (worker - self.number) % workers
        mine = [ids[k * size : (k + 1) * size] for k in range(first, order.num_batches(size, self.drop_last), workers)]
        return np.concatenate(mine) if mine else np.empty(0, np.int64)


class EpochBatchSampler:
    """The batches of ``loader``'s current epoch on its rank, from its current position, as :class:`EpochBatch`.

    Iterating does not move the loader; ``len()`` is a whole epoch's batches, as ``len(loader)``, and
    :attr:`batches_left` what one iteration yields.
    """

    def __init__(self, loader: Any) -> None:
        self.cursor = loader.cursor

    def __len__(self) -> int:
        return self.cursor.num_batches()

    @property
    def batches_left(self) -> int:
        """Batches the next iteration yields: the rest of the loader's epoch from its position."""
        return self.cursor.batches_left()

    def __iter__(self) -> Iterator[EpochBatch]:
        order = self.cursor.epoch_order()
        options = self.cursor.options
        positions = order.indices
        size = options.batch_size
        described = {f.name: getattr(order, f.name) for f in dataclasses.fields(order) if f.name not in ("shard_rows", "rows")}
        for k in range(order.num_batches(size, options.drop_last)):
            yield EpochBatch(positions[k * size : (k + 1) * size].tolist(), order.epoch,
                             PassPlan(described, size, options.drop_last, k))


def _signature(shards: Any, bound: Any, spec: ImageSpec, fields: tuple[str, ...], var: str,
               backend: str) -> dict[str, Any]:
    """What every batch of a dataset holds, beyond its values: per view the sample shape, the dtype, the
    backend, the label's kind and the fields' kinds. Sources whose batches are joined (Mix) must agree on it."""
    leaves = shards.schema.leaves
    label = None if bound.columns.labels is None and not bound.columns.label_field else str(leaves[spec.label_key])
    shapes = [list(bound.columns.out_shape(spec.layout))]
    shapes += [list(shape) for _, _, _, shape in bound.source.extra_views]
    return {"views": shapes, "dtype": spec.dtype, "backend": backend, "label": label,
            "fields": {p: str(leaves[p]) for p in fields}, "var": var if fields else None}


def _row(value: Any) -> Any:
    """The one row of a one-sample batch value: an array's row, a list's item, a Padded / Masked pair's rows."""
    if isinstance(value, tuple):  # Padded or Masked: a named tuple of per-row values
        return type(value)(*(_row(part) for part in value))
    return value[0]


class ImageDataset:
    """Map-style image dataset (see the module docstring).

    ``path``: a ``.tbl`` file, a dataset directory or a TurboLoader v2 file.
    ``image_options``: ImageLoader's image keywords (``mean``, ``std``, ``hflip``,
    ``random_resized_crop``, ``center_crop``, ``dtype``, ``layout``, ``image_key``,
    ``label_key``), or ``spec``: an :class:`~tbl_loader.image.ImageSpec` holding them. ``fields``,
    ``var``, ``seed``,
    ``rows``, ``subsample``, ``backend``, ``jpeg_dct``, ``verify`` as in ImageLoader; ``epoch``: the epoch whose
    draws plain position lists get. ``path`` may be a URL: ``cache_dir``, ``cache_limit``
    and ``storage_options`` as in ImageLoader (see the module docstring).
    """

    def __init__(self, path: str | os.PathLike[str], *, seed: int = 0, rows: Any = None,
                 subsample: float | None = None, backend: str | None = None, epoch: int = 0,
                 spec: ImageSpec | None = None, fields: Any = (), var: str = "list", cache_dir: Any = None,
                 cache_limit: Any = None, storage_options: dict[str, Any] | None = None,
                 jpeg_dct: str = "accurate", verify: str | bool = "never", **image_options: Any) -> None:
        if spec is not None and image_options:
            raise TypeError(f"pass spec= or image options, not both (got {sorted(image_options)})")
        self.verify = verify_mode(verify)
        self.path = path
        self.remote_options = {"cache_dir": cache_dir, "cache_limit": cache_limit, "storage_options": storage_options}
        self.spec = spec if spec is not None else ImageSpec(**image_options)
        self.seed = int(seed)
        self.fields, self.var = tuple(fields), var
        self.jpeg_dct = jpeg_dct
        self.output = OutputSpec.create(backend)
        self.epoch = int(epoch)
        self._state: tuple[Any, Any, list[Any]] | None = None  # (shard source, batch source, closers)
        self._state_pid = os.getpid()  # the process that opened _state
        self._fetch_plan: tuple[Any, int] | None = None  # (the pass scheduled for fetching, its last batch)
        dataset, _ = self._ensure()
        self.fingerprint = dataset.fingerprint
        try:
            self.rows = resolve_rows(self._source_rows, rows, subsample)
        except BaseException:
            self.close()
            raise
        self._len = self._source_rows if self.rows is None else int(self.rows.shape[0])

    @classmethod
    def from_loader(cls, loader: Any) -> ImageDataset:
        """The map-style twin of an ImageLoader: its dataset, image settings, seed, subset and backend."""
        if loader.gpu_decode:
            raise UnsupportedCombinationError(
                "ImageDataset.from_loader of a loader with decode_device: the map-style dataset decodes on the "
                "CPU (in DataLoader workers), which gives other pixels than nvJPEG; make the loader without "
                "decode_device, or iterate the loader itself")
        where = loader.remote_options if is_url(loader.path) else {}
        path = loader.path if isinstance(loader.path, (str, os.PathLike)) else loader.dataset.path
        ds = cls(path, seed=loader.seed, backend=loader.output.backend, epoch=loader.epoch, spec=loader.spec,
                 fields=loader.fields, var=loader.var, jpeg_dct=loader.jpeg_dct, verify=loader.verify, **where)
        ds.rows = loader.cursor.rows
        ds._len = loader.num_samples
        return ds

    # ---- opening --------------------------------------------------------------------------------
    def _ensure(self) -> tuple[Any, Any]:
        if self._state is not None and self._state_pid != os.getpid():
            # Inherited through fork (a DataLoader worker): the parent's maps, fetcher threads and storage
            # client belong to the parent. Dropped here, never closed (closing would act on the parent's).
            self._state = None
        if self._state is None:
            self._state_pid = os.getpid()
            closers: list[Any] = []
            shards = self._open()
            closers.append(shards.close)
            try:
                expected = getattr(self, "fingerprint", None)
                if expected is not None and shards.fingerprint != expected:
                    raise tbl_format.DatasetChangedError(
                        f"{self.path}: the dataset changed since this ImageDataset was created")
                # The loader's own binding: fixed-size, or variable-size raw / JPEG images, and the fields
                bound = bind_source(shards, self.spec, seed=self.seed, verify=self.verify, closers=closers,
                                    fields=self.fields, var=self.var, jpeg_dct=self.jpeg_dct)
            except BaseException:
                for close in closers:
                    close()
                raise
            self._source_rows = bound.columns.num_samples
            self.signature = _signature(shards, bound, self.spec, self.fields, self.var, self.output.backend)
            self._state = (shards, bound.source, closers)
        return self._state[:2]

    def _open(self) -> Any:
        """The shard source: LocalShards over the file, or a RemoteDataset over the shard cache for a URL."""
        if not is_url(self.path):
            return LocalShards(tbl_format.open(self.path, verify=self.verify == "open"))
        from ..source.remote import RemoteDataset

        remote = RemoteDataset(self.path, **self.remote_options, verify_data=self.verify == "open")
        # Copies in DataLoader workers open the dataset this one opened, without reading the manifest again
        # (in a forked worker that would start a storage helper process per worker).
        if "manifest" in remote.options:
            self.remote_options["manifest"] = remote.options["manifest"]
        return remote

    @property
    def dataset(self) -> Any:
        """The open dataset (a ``tbl_format.Dataset``, or a RemoteDataset for a URL); opened if needed."""
        return self._ensure()[0].dataset

    def close(self) -> None:
        """Unmap the dataset; the next access maps it again."""
        state, self._state = self._state, None
        if state is not None:
            for close in state[2]:
                close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"], state["_fetch_plan"] = None, None
        return state

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose augmentation draws plain position lists get."""
        self.epoch = int(epoch)

    # ---- samples --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._len

    def get_batch(self, positions: Any, epoch: int | None = None) -> Batch:
        """Positions ``positions`` as one :class:`Batch` (fresh arrays, the loader's values bit for bit).

        ``epoch``: the draws' epoch; default ``positions.epoch`` for an :class:`EpochBatch`, else ``self.epoch``.
        """
        if epoch is None:
            epoch = getattr(positions, "epoch", self.epoch)
        shards, source = self._ensure()
        plan = getattr(positions, "plan", None)
        if plan is not None:
            self._fetch_ahead(shards, plan)
        pos = as_indices(positions, self._len)
        rows = pos if self.rows is None else np.ascontiguousarray(self.rows[pos])
        n = rows.shape[0]
        buffers = source.allocate(max(n, 1), self.output)
        plan = BatchPlan(int(epoch), 0, rows, 0, False)
        payload = source.fill({k: v.kernel for k, v in buffers.items()}, plan)
        outputs = {name: a.export(n, self.output) for name, a in buffers.items()}
        return source.batch(outputs, payload, plan, self.output.backend, None)

    def _read_ahead(self, positions: np.ndarray, epochs: np.ndarray | None = None) -> None:
        """The positions the next reads take, in order: over a URL their shards download ahead of the reads
        (what a Mix of streamed sources calls); a local dataset has nothing to do. ``epochs``: unused (which rows
        a position reads does not depend on the epoch)."""
        if not is_url(self.path):
            return
        shards, _ = self._ensure()
        pos = as_indices(positions, self._len)
        shards.schedule(pos if self.rows is None else self.rows[pos])

    def _fetch_ahead(self, shards: Any, plan: PassPlan) -> None:
        """A URL dataset read batch by batch (a DataLoader worker's): at the first batch of a pass, hand the
        fetcher the rows of the pass's batches this process will read, in order, so that their shards are
        downloaded ahead as ImageLoader's are. Which batches those are is torch's rule (batch ``k`` to worker
        ``k % num_workers``); were it wrong, shards would only come early or late, never change a batch."""
        worker, workers = _worker_slot()
        key = (tuple(sorted(plan.order.items())), plan.batch_size, plan.drop_last, worker, workers)
        if self._fetch_plan is not None and self._fetch_plan[0] == key and plan.number > self._fetch_plan[1]:
            self._fetch_plan = (key, plan.number)
            return  # the same pass, further on: scheduled already
        self._fetch_plan = (key, plan.number)
        positions = plan.batches_of_worker(shards.segment_rows, worker, workers)
        shards.schedule(positions if self.rows is None else self.rows[positions])

    def __getitems__(self, positions: Any) -> CollatedBatch:
        """torch DataLoader's batched fetch: a CollatedBatch (``collate_identity`` gives ``get_batch``)."""
        return CollatedBatch(self, positions)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, (list, tuple, range, np.ndarray, slice)):
            if isinstance(i, slice):
                i = range(*i.indices(self._len))
            return self.get_batch(i)
        return self.collate_row([i], 0)

    def collate_row(self, positions: Any, k: int) -> Any:
        """Sample ``positions[k]`` as ``(image, label)`` (the image alone without a label leaf), followed by
        ``{path: value}`` of its ``fields`` when the dataset serves fields, with the draws of
        ``positions.epoch`` (an :class:`EpochBatch`) or ``self.epoch``. torch's default collate stacks these
        into ``[images, labels, {path: values}]``."""
        batch = self.get_batch([positions[k]], epoch=getattr(positions, "epoch", self.epoch))
        parts = [batch.images[0]] + ([] if batch.labels is None else [batch.labels[0]])
        if self.fields:
            parts.append({path: _row(value) for path, value in batch.fields.items()})
        return parts[0] if len(parts) == 1 else tuple(parts)

    def __repr__(self) -> str:
        return f"ImageDataset({str(self.path)!r}, rows={self._len})"
