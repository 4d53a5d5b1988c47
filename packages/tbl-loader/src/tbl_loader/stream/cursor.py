"""Where a stream stands: epoch, position, order, rank split and the resumable ``state_dict``.

A :class:`StreamCursor` knows nothing about what a sample is or how batches are
made; every loader (host or device) composes one with a pipeline that makes the
batches the cursor plans.

Position and epochs. The cursor stands at ``(epoch, consumed)``, ``consumed``
counting global positions of the epoch's permutation taken by all ranks (see
:mod:`tbl_loader.stream.order`). :meth:`StreamCursor.start_pass` plans the rest of the
current epoch from that position, so a pass interrupted by ``break`` continues
where it stopped at the next pass, and a pass started after ``load_state_dict``
is the exact rest of the saved epoch. A pipeline calls :meth:`advance` when it
hands a batch out (batches produced ahead but never handed out do not count);
after the last batch of an epoch the cursor moves to ``(epoch + 1, 0)`` by
itself, so a plain ``for epoch in ...: for batch in loader`` sees a new
permutation every epoch. ``set_epoch(e)`` (as with torch's DistributedSampler)
jumps to the start of epoch ``e``; calling it with the current epoch keeps the
position, so the usual ``set_epoch(epoch)`` at the top of a resumed loop does not
discard the resumed remainder.

Jumps. ``set_epoch`` to another epoch and ``load_state_dict`` call every
function registered with :meth:`StreamCursor.on_jump` first: pipelines register
the stop of their running pass there, since that pass belongs to the old
position.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import StateMismatchError
from .distributed import resolve_rank_world
from .order import DEFAULT_BLOCK_WINDOW, PADDING_MODES, SHUFFLE_MODES, BatchPlan, EpochOrder
from .state import MAX_EPOCH, StreamState, settings_fingerprint, settings_record
from .subset import subset_fingerprint

__all__ = ["Resumable", "StreamCursor", "StreamOptions"]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class StreamOptions:
    """The settings of a stream that every loader takes, validated once.

    ``rank`` / ``world_size`` are resolved at construction: given values, else an
    initialized torch.distributed process group's, else ``(0, 1)``. ``padding``
    ("wrap" or "drop") evens out the ranks' shards.
    """

    batch_size: int
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = False
    rank: int | None = None
    world_size: int | None = None
    padding: str = "wrap"
    block_window: int = DEFAULT_BLOCK_WINDOW

    def __post_init__(self) -> None:
        object.__setattr__(self, "batch_size", _check_int("batch_size", self.batch_size, 1))
        if self.shuffle not in SHUFFLE_MODES:
            raise ValueError(f'shuffle must be True, False or "block", got {self.shuffle!r}')
        object.__setattr__(self, "block_window", _check_int("block_window", self.block_window, 1))
        if self.padding not in PADDING_MODES:
            raise ValueError(f"padding must be one of {PADDING_MODES}, got {self.padding!r}")
        EpochOrder(0, self.seed, 0)  # validates the seed with the generator's own rule
        rank, world_size = resolve_rank_world(self.rank, self.world_size)
        for name, value in (("seed", int(self.seed)),
                            ("shuffle", "block" if self.shuffle == "block" else bool(self.shuffle)),
                            ("drop_last", bool(self.drop_last)), ("rank", rank), ("world_size", world_size)):
            object.__setattr__(self, name, value)

    def stream_settings(self) -> dict[str, Any]:
        """The options that change which samples come in which order (fingerprinted by ``state_dict``).

        Batch size, rank and world size are left out on purpose: a run may resume with any of them changed.
        """
        settings = {"shuffle": self.shuffle, "drop_last": self.drop_last, "padding": self.padding}
        if self.shuffle == "block":
            settings["block_window"] = self.block_window
        return settings


class StreamCursor:
    """The position of one rank's stream over ``num_samples`` samples (see the module docstring).

    ``dataset_fingerprint`` identifies the data (``tbl_format.Dataset.fingerprint``);
    ``settings`` are the loader's own stream-changing settings (augmentation,
    keys), fingerprinted together with the options' into every ``state_dict``.
    ``accepted_dataset_fingerprints`` are older fingerprints of the same dataset
    that saved states may still carry. ``rows`` (from :func:`tbl_loader.stream.subset.resolve_rows`):
    the stream runs over these dataset rows only; ``num_samples`` is then their count, order
    and sharding work on positions in ``rows`` and batch plans carry the dataset rows.
    ``shard_rows`` (rows per shard file) is needed by ``shuffle="block"``, which
    does not combine with ``rows`` yet.
    """

    def __init__(self, num_samples: int, options: StreamOptions, *, dataset_fingerprint: str,
                 settings: dict[str, Any] | None = None,
                 accepted_dataset_fingerprints: tuple[str, ...] = (),
                 rows: np.ndarray | None = None, shard_rows: list[int] | None = None) -> None:
        if not isinstance(options, StreamOptions):
            raise TypeError(f"options must be a StreamOptions, got {type(options).__name__}")
        self.num_samples = _check_int("num_samples", num_samples, 0)
        self.options = options
        self.shard_rows = None if shard_rows is None else tuple(int(r) for r in shard_rows)
        if options.shuffle == "block" and rows is not None:
            raise ValueError('shuffle="block" does not combine with rows= / subsample= yet: '
                             "use shuffle=True (or False) for a subset")
        if options.shuffle == "block" and (self.shard_rows is None or sum(self.shard_rows) != self.num_samples):
            raise ValueError('shuffle="block" needs the rows of every shard (shard_rows adding up to num_samples)')
        self._dataset_fp = dataset_fingerprint
        self._accepted = (dataset_fingerprint, *accepted_dataset_fingerprints)
        settings = {**options.stream_settings(), **(settings or {})}
        if rows is not None:
            if rows.shape[0] != self.num_samples:
                raise ValueError(f"rows holds {rows.shape[0]} rows, num_samples is {self.num_samples}")
            settings["subset"] = subset_fingerprint(rows)  # only when set: whole-dataset states stay valid
        self.rows = rows
        self._settings_fp = settings_fingerprint(settings)
        self._settings_record = settings_record(settings)  # saved too, so a mismatch can name the setting
        self._epoch = 0
        self._consumed = 0
        self._jump_listeners: list[Callable[[], Any]] = []

    # ---- position ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def consumed(self) -> int:
        """Global samples of the current epoch consumed so far (all ranks together)."""
        return self._consumed

    def on_jump(self, listener: Callable[[], Any]) -> None:
        """Call ``listener()`` before every jump of the position (it must not reference the loader)."""
        self._jump_listeners.append(listener)

    def _jump(self, epoch: int, consumed: int) -> None:
        for listener in self._jump_listeners:
            listener()
        self._epoch, self._consumed = epoch, consumed

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch`` (no-op when already in ``epoch``: keeps a resumed position)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or not 0 <= epoch < 2**64:
            raise ValueError(f"epoch must be an int in [0, 2**64), got {epoch!r}")
        if int(epoch) != self._epoch:
            self._jump(int(epoch), 0)

    def advance(self, plan: BatchPlan) -> None:
        """Record that ``plan``'s batch was handed out."""
        if plan.last:
            self._epoch, self._consumed = plan.epoch + 1, 0
        else:
            self._consumed = plan.consumed

    # ---- state ------------------------------------------------------------------------------

    def _state(self, epoch: int, consumed: int) -> StreamState:
        return StreamState(self.options.seed, epoch, consumed, self._dataset_fp, self._settings_fp,
                           self._settings_record)

    def state_dict(self) -> dict[str, Any]:
        """Seed, epoch, global samples consumed, dataset and settings fingerprints and the settings (a small dict)."""
        return self._state(self._epoch, self._consumed).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position; raises StateMismatchError if it belongs to another stream."""
        saved = StreamState.from_dict(state)
        self._state(saved.epoch, saved.consumed).check_compatible(saved, accepted_datasets=self._accepted)
        if saved.consumed > self.num_samples:
            raise StateMismatchError(f"state consumed {saved.consumed} samples of a {self.num_samples}-sample dataset")
        self._jump(saved.epoch, saved.consumed)

    # ---- planning ---------------------------------------------------------------------------

    def num_batches(self) -> int:
        """Batches of one full epoch on this rank."""
        o = self.options
        n, w = self.num_samples, o.world_size
        per_rank = -(-n // w) if o.padding == "wrap" else n // w
        return per_rank // o.batch_size if o.drop_last else -(-per_rank // o.batch_size)

    def batches_left(self) -> int:
        """Batches the next pass yields on this rank: the rest of the current epoch from the current position
        (a full epoch at its start, the remainder after a resume or a ``break``)."""
        o = self.options
        remaining, w = self.num_samples - self._consumed, o.world_size
        per_rank = -(-remaining // w) if o.padding == "wrap" else remaining // w
        return per_rank // o.batch_size if o.drop_last else -(-per_rank // o.batch_size)

    def epoch_order(self) -> EpochOrder:
        """The rest of the current epoch for this rank, from the current position."""
        o = self.options
        return EpochOrder(self.num_samples, o.seed, self._epoch, shuffle=o.shuffle, world_size=o.world_size,
                          rank=o.rank, padding=o.padding, start=self._consumed,
                          shard_rows=self.shard_rows if o.shuffle == "block" else None, block_window=o.block_window,
                          rows=self.rows)

    def start_pass(self) -> tuple[EpochOrder, Iterator[BatchPlan]] | None:
        """The rest of the current epoch and its batch plans, or None (after moving to the next
        epoch) when nothing of this epoch is left on this rank."""
        if self._epoch > MAX_EPOCH:
            raise ValueError(f"epoch {self._epoch} is past the last epoch a stream runs ({MAX_EPOCH}): the one after "
                             "it would not fit the generator's 64-bit epoch")
        order = self.epoch_order()
        o = self.options
        if order.num_batches(o.batch_size, o.drop_last) == 0:
            self._epoch, self._consumed = self._epoch + 1, 0
            return None
        plans = order.batches(o.batch_size, o.drop_last)
        if self.rows is not None:
            plans = (plan._replace(sample_ids=self.rows_of(plan.sample_ids)) for plan in plans)
        return order, plans

    def rows_of(self, positions: np.ndarray) -> np.ndarray:
        """Dataset rows of stream positions (the positions themselves without a subset)."""
        return positions if self.rows is None else np.ascontiguousarray(self.rows[positions])


class Resumable:
    """The position API every loader offers, answered by its ``cursor`` (a :class:`StreamCursor`).

    A loader sets ``self.cursor`` in its constructor; everything else here follows.
    """

    cursor: StreamCursor

    epoch = property(lambda self: self.cursor.epoch, doc="The current epoch.")
    consumed = property(lambda self: self.cursor.consumed,
                        doc="Global samples of the current epoch consumed so far (all ranks together).")
    num_samples = property(lambda self: self.cursor.num_samples, doc="Samples in the dataset.")
    batch_size = property(lambda self: self.cursor.options.batch_size, doc="Samples per batch.")
    seed = property(lambda self: self.cursor.options.seed, doc="Seed of every random draw.")
    rank = property(lambda self: self.cursor.options.rank, doc="This process's rank.")
    world_size = property(lambda self: self.cursor.options.world_size, doc="Ranks sharing the stream.")

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of ``epoch`` (no-op when already in ``epoch``: keeps a resumed position)."""
        self.cursor.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Seed, epoch, global samples consumed, dataset and settings fingerprints and the settings (a small dict)."""
        return self.cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position; raises StateMismatchError if it belongs to another stream."""
        self.cursor.load_state_dict(state)

    def epoch_order(self) -> EpochOrder:
        """The rest of the current epoch for this rank, from the current position."""
        return self.cursor.epoch_order()

    def __len__(self) -> int:
        """Batches of one whole epoch on this rank, wherever the loader stands.

        Training frameworks read ``len(loader)`` as the epoch's length and count resumed steps into it
        (Lightning ends an epoch early otherwise); what the next pass still yields is :attr:`batches_left`."""
        return self.cursor.num_batches()

    @property
    def batches_left(self) -> int:
        """Batches the next ``iter(loader)`` yields on this rank: ``len(loader)`` at an epoch's start, the
        rest of the epoch after a resume or a ``break`` (what a progress bar of this pass should show)."""
        return self.cursor.batches_left()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError
