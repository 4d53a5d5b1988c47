"""Map-style access to a token stream: the windows (or packed rows) of :class:`~tbl_loader.TokenLoader` by number.

:class:`TokenDataset` serves what a TokenLoader with the same settings serves: ``len(ds)`` is the number of
windows (or packed rows, or the subset's size), ``ds.get_batch(positions)`` (also ``ds[list]``,
``__getitems__``) one :class:`~tbl_loader.tokens.TokenBatch` of those windows, filled by the loader's own
batch source (the same slice copies, the same boundary fields), and ``ds[i]`` one window: its ``(T + 1,)``
tokens, or ``{"tokens": ..., "position_ids": ..., ...}`` with the boundary fields. Build it with
``TokenDataset.from_loader(loader)`` or ``TokenDataset(path, seq_len, **options)``.

Windows are addressable by position because window ``j`` of epoch ``e`` starts at stream offset
``o_e + j * T`` (:mod:`tbl_loader.tokens.loader`): the only thing a window depends on besides its number is
the epoch's offset. So, as for :class:`~tbl_loader.ImageDataset`, a batch of positions carries its epoch
(:class:`~tbl_loader.EpochBatch`, which :class:`~tbl_loader.EpochBatchSampler` yields); a plain list of
positions uses ``ds.epoch`` (``ds.set_epoch``). Packed rows are a pure function of the document index and
the settings (:mod:`tbl_loader.tokens.packing`), computed once here, so they are addressable too (and
the same in every epoch).

torch's DataLoader::

    ds = TokenDataset.from_loader(loader)
    DataLoader(ds, batch_sampler=EpochBatchSampler(loader), collate_fn=collate_identity,
               num_workers=2, multiprocessing_context="fork")

yields the loader's batches (``collate_identity``: one ``get_batch`` per batch); torch's default collate
stacks ``ds[i]`` rows instead (the same values). :class:`~tbl_loader.Mix` takes a TokenDataset, or a
TokenLoader (replaced by this twin), as a source.

Processes: pickling keeps the path, the settings, the document index, the packing plan and the dataset's
fingerprint; a process opens the dataset at its first batch (a forked worker drops what it inherited:
the parent's maps, and for a URL the parent's storage client) and raises
``tbl_format.DatasetChangedError`` if it changed meanwhile. A URL's copies read shards through the same
``cache_dir`` (one download per shard on the node).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

import tbl_format

from ..host.output import OutputSpec
from ..pytree.dataset import CollatedBatch, as_indices
from ..source.storage import is_url
from ..stream.order import BatchPlan
from ..stream.subset import resolve_rows
from .batch import TokenBatch
from .documents import BOUNDARY_FIELDS
from .loader import TokenStream, open_token_dataset

__all__ = ["TokenDataset"]


class TokenDataset:
    """Map-style token windows (see the module docstring).

    ``path``, ``seq_len``, ``shuffle`` (the per-epoch offset and the packing's document order), ``seed``,
    ``dtype``, ``boundaries``, ``pack``, ``pack_buffer``, ``rows`` / ``subsample``, ``backend``, ``cache_dir``,
    ``cache_limit``, ``storage_options``: as in :class:`~tbl_loader.TokenLoader`. ``epoch``: the epoch whose
    offset plain position lists get.
    """

    def __init__(self, path: Any, seq_len: int, *, shuffle: bool = True, seed: int = 0, dtype: str | None = None,
                 boundaries: bool = False, pack: str | None = None, pack_buffer: int = 64, rows: Any = None,
                 subsample: float | None = None, backend: str | None = None, epoch: int = 0,
                 cache_dir: Any = None, cache_limit: Any = None,
                 storage_options: dict[str, Any] | None = None) -> None:
        self.path = path
        self.remote_options: dict[str, Any] = {"cache_dir": cache_dir, "cache_limit": cache_limit,
                                               "storage_options": storage_options}
        self.output = OutputSpec.create(backend)
        self.epoch = int(epoch)
        self._state: tuple[Any, Any] | None = None  # (open dataset, batch source) of the process _pid
        self._pid = os.getpid()
        dataset = self._open()
        try:
            self.fingerprint: str = dataset.fingerprint
            self.stream = TokenStream.describe(dataset, path, seq_len, boundaries=boundaries, pack=pack,
                                               pack_buffer=pack_buffer, seed=int(seed), shuffle=bool(shuffle),
                                               dtype=dtype)
            self.rows = resolve_rows(self.stream.windows, rows, subsample)
        except BaseException:
            dataset.close()
            raise
        self._state = (dataset, self.stream.source(dataset, map_all=not is_url(path)))
        self._len = self.stream.windows if self.rows is None else int(self.rows.shape[0])

    @classmethod
    def from_loader(cls, loader: Any) -> TokenDataset:
        """The map-style twin of a TokenLoader: its dataset, window settings, seed, subset and backend."""
        stream = loader.stream
        where = loader.remote_options if is_url(loader.path) else {}
        ds = cls.__new__(cls)
        ds.path = loader.path
        ds.remote_options = dict(where) or {"cache_dir": None, "cache_limit": None, "storage_options": None}
        ds.output = OutputSpec.create(loader.output.backend)
        ds.epoch = loader.epoch
        ds._state = None  # opened by this process at the first batch (the loader's maps stay the loader's)
        ds._pid = os.getpid()
        ds.fingerprint = loader.dataset.fingerprint
        ds.stream = stream  # the loader's description: document index and packing plan are not recomputed
        ds.rows = loader.cursor.rows
        ds._len = loader.num_samples
        if is_url(loader.path):
            from ..source.remote import streamed_manifest

            ds.remote_options["manifest"] = streamed_manifest(loader.dataset)
        return ds

    # ---- opening --------------------------------------------------------------------------------
    def _open(self) -> Any:
        return open_token_dataset(self.path, **self.remote_options)

    def _source(self) -> Any:
        if self._state is not None and self._pid != os.getpid():
            # Inherited through fork (a DataLoader worker): the parent's maps and storage client are the
            # parent's. Dropped, never closed (closing would act on the parent's).
            self._state = None
        if self._state is None:
            self._pid = os.getpid()
            dataset = self._open()
            try:
                if dataset.fingerprint != self.fingerprint:
                    raise tbl_format.DatasetChangedError(
                        f"{self.path}: the dataset changed since this TokenDataset was created")
                if is_url(self.path) and "manifest" not in self.remote_options:
                    # Later copies (DataLoader workers) open this one's manifest without asking the store.
                    from ..source.remote import streamed_manifest

                    self.remote_options["manifest"] = streamed_manifest(dataset)
                source = self.stream.source(dataset, map_all=not is_url(self.path))
            except BaseException:
                dataset.close()
                raise
            self._state = (dataset, source)
        return self._state[1]

    def close(self) -> None:
        """Unmap the dataset; the next batch maps it again."""
        state, self._state = self._state, None
        if state is not None and self._pid == os.getpid():
            state[0].close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_state"] = None
        return state

    def __enter__(self) -> TokenDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- windows --------------------------------------------------------------------------------
    @property
    def seq_len(self) -> int:
        return self.stream.seq_len

    @property
    def signature(self) -> dict[str, Any]:
        """What every batch holds beyond its values (row width, dtype, backend, boundary fields): the token
        sources of a Mix must agree on it."""
        fields = self.stream.boundaries or self.stream.plan is not None
        return {"seq_len": self.stream.seq_len, "dtype": str(self.stream.out_dtype),
                "backend": self.output.backend, "boundaries": fields}

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose window offset plain position lists get."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self._len

    def get_batch(self, positions: Any, epoch: int | None = None) -> TokenBatch:
        """Positions ``positions`` as one :class:`TokenBatch` (fresh arrays; the loader's values bit for bit).

        ``epoch``: the windows' epoch; default ``positions.epoch`` for an :class:`~tbl_loader.EpochBatch`,
        else ``self.epoch``.
        """
        if epoch is None:
            epoch = getattr(positions, "epoch", self.epoch)
        source = self._source()
        pos = as_indices(positions, self._len)
        rows = pos if self.rows is None else np.ascontiguousarray(self.rows[pos])
        n = rows.shape[0]
        buffers = source.allocate(max(n, 1), self.output)
        source.fill({k: v.kernel for k, v in buffers.items()}, BatchPlan(int(epoch), 0, rows, 0, False))
        outputs = {name: a.export(n, self.output) for name, a in buffers.items()}
        indices = rows.copy()
        if self.output.backend == "torch":
            import torch  # a torch batch

            indices = torch.from_numpy(indices)
        fields = {name: outputs[name] for name in BOUNDARY_FIELDS if name in outputs}
        return TokenBatch(outputs["tokens"], indices, **fields)

    def _read_ahead(self, positions: np.ndarray, epochs: np.ndarray) -> None:
        """The positions the next reads take, in order, each with its epoch: over a URL their shards download
        ahead of the reads (what a Mix of streamed sources calls); a local dataset has nothing to do."""
        if not is_url(self.path):
            return
        source = self._source()
        pos = as_indices(positions, self._len)
        rows = pos if self.rows is None else self.rows[pos]
        epochs = np.asarray(epochs, np.int64)
        shards: list[int] = []
        for e in dict.fromkeys(epochs.tolist()):  # the epochs in the order the reads reach them
            shards += source.shards_read(e, rows[epochs == e])
        source.dataset.read_ahead(list(dict.fromkeys(shards)))

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
        """Window ``positions[k]`` (with the epoch of ``positions`` or ``self.epoch``): its ``(T + 1,)`` tokens,
        or a dict of them and its boundary fields when the dataset serves them."""
        batch = self.get_batch([positions[k]], epoch=getattr(positions, "epoch", self.epoch))
        if batch.position_ids is None:
            return batch.tokens[0]
        return {"tokens": batch.tokens[0], **{name: getattr(batch, name)[0] for name in BOUNDARY_FIELDS}}

    def __repr__(self) -> str:
        return f"TokenDataset({str(self.path)!r}, seq_len={self.stream.seq_len}, windows={self._len})"
