"""Resumable stream position: the tiny ``state_dict`` every loader saves and checks.

A state is five facts: the seed, the epoch, the number of global positions of the
epoch's permutation already consumed (by all ranks together), a fingerprint of
the dataset and a fingerprint of the settings that change the stream (which
samples, in which order, with which augmentation draws). The settings themselves
ride along (``"stream_settings"``, JSON values) so that a refused state can say
which setting differs; the fingerprint stays the authority, and states without
them (tbl-loader 0.1.0's) load as before. Batch size, prefetch,
thread count, output dtype / layout and world size are deliberately left out: a
run may resume with any of them changed and still yields exactly the rest of the
epoch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ..errors import StateMismatchError
from .order import ORDER_VERSION

MAX_EPOCH = 2**64 - 2
"""The last epoch a stream runs: the state saved after it (epoch ``MAX_EPOCH + 1``, a uint64 still) reloads,
and running that one is refused by name, so no loader ever reaches a position it could not save."""

__all__ = [
    "MAX_EPOCH",
    "STATE_VERSION",
    "StreamState",
    "pytree_fingerprint_v0_1",
    "settings_differences",
    "settings_fingerprint",
    "settings_record",
]

STATE_VERSION = 1


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def pytree_fingerprint_v0_1(dataset: Any) -> str:
    """The dataset fingerprint that tbl-loader 0.1.0's ``PyTreeLoader`` saved in its state dicts.

    Loaders now record ``tbl_format.Dataset.fingerprint``; a state of that
    release names the same dataset by this value, so ``PyTreeLoader`` still
    accepts it. Reads the manifest's record only (no shard is mapped).
    """
    body = {"schema": dataset.schema.fingerprint, "metadata": dataset.metadata, "rows": dataset.segment_rows,
            "header_crc32": [entry["header_crc32"] for entry in dataset.shard_entries]}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return _digest({"dataset": hashlib.sha256(text.encode("utf-8")).hexdigest()})


def settings_fingerprint(settings: dict[str, Any]) -> str:
    """Fingerprint of the stream-changing settings (plus the order generator's version)."""
    return _digest({"order_version": ORDER_VERSION, **settings})


def settings_record(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings :func:`settings_fingerprint` hashes, as JSON values (what a ``state_dict`` stores).

    Serialized exactly as the fingerprint serializes them (tuples become lists,
    other objects their ``str``), so a saved record equals today's record
    whenever the two fingerprints are equal.
    """
    text = json.dumps({"order_version": ORDER_VERSION, **settings}, sort_keys=True, default=str)
    return json.loads(text)


_ABSENT = object()


def settings_differences(saved: dict[str, Any], current: dict[str, Any], prefix: str = "") -> list[str]:
    """One sentence per setting that differs between a saved record and this loader's, in name order.

    Nested settings are named by their path (``crop.random_resized.scale``) where both
    sides hold a dict there, and compared whole otherwise (``crop`` when one side has none).
    """
    lines = []
    for key in sorted(set(saved) | set(current)):
        name = f"{prefix}{key}"
        was, now = saved.get(key, _ABSENT), current.get(key, _ABSENT)
        if was == now:
            continue
        if isinstance(was, dict) and isinstance(now, dict):
            lines.extend(settings_differences(was, now, f"{name}."))
            continue
        said = f"state was saved without {name}" if was is _ABSENT else f"state was saved with {name}={was!r}"
        has = f"this loader has no {name}" if now is _ABSENT else f"this loader has {name}={now!r}"
        lines.append(f"{said}, {has}")
    return lines


@dataclass(frozen=True)
class StreamState:
    """Where a stream stands: ``consumed`` global positions into epoch ``epoch``."""

    seed: int
    epoch: int
    consumed: int
    dataset: str
    settings: str
    stream_settings: dict[str, Any] | None = None
    """The settings behind the ``settings`` fingerprint (:func:`settings_record`); None in old states."""

    def to_dict(self) -> dict[str, Any]:
        state = {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "dataset": self.dataset,
            "settings": self.settings,
        }
        if self.stream_settings is not None:
            state["stream_settings"] = self.stream_settings
        return state

    @classmethod
    def from_dict(cls, state: Any) -> StreamState:
        if not isinstance(state, dict):
            raise StateMismatchError(f"a loader state is a dict, got {type(state).__name__}")
        version = state.get("version")
        if version != STATE_VERSION:
            raise StateMismatchError(f"state version {version!r} is not supported (expected {STATE_VERSION})")
        missing = [k for k in ("seed", "epoch", "consumed", "dataset", "settings") if k not in state]
        if missing:
            raise StateMismatchError(f"state is missing {missing}")
        for key in ("seed", "epoch", "consumed"):
            value = state[key]
            # The generator keys on uint64 seeds and epochs; nothing larger can have been saved.
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
                raise StateMismatchError(f"state[{key!r}] must be an int in [0, 2**64), got {value!r}")
        record = state.get("stream_settings")  # absent in states of tbl-loader 0.1.0
        if record is not None and not isinstance(record, dict):
            raise StateMismatchError(f"state['stream_settings'] must be a dict, got {type(record).__name__}")
        return cls(state["seed"], state["epoch"], state["consumed"], str(state["dataset"]), str(state["settings"]),
                   record)

    def check_compatible(self, other: StreamState, *, accepted_datasets: tuple[str, ...] = ()) -> None:
        """Raise :class:`StateMismatchError` naming the first field where ``other`` differs.

        ``accepted_datasets``: further dataset fingerprints that name this state's dataset too.
        """
        if other.dataset != self.dataset and other.dataset not in accepted_datasets:
            raise StateMismatchError(
                f"state was saved for another dataset (fingerprint {other.dataset}, this loader's is {self.dataset})"
            )
        if self.settings != other.settings:
            # The fingerprint decides; the recorded settings only say which one differs.
            if other.stream_settings is not None and self.stream_settings is not None:
                differences = settings_differences(other.stream_settings, self.stream_settings)
                if differences:
                    raise StateMismatchError("stream settings differ: " + "; ".join(differences))
            raise StateMismatchError(
                "state was saved with other stream settings (shuffle, flip, crop, drop_last, padding "
                f"or order version): fingerprint {other.settings}, this loader's is {self.settings}"
            )
        if self.seed != other.seed:
            raise StateMismatchError(f"state was saved with seed {other.seed}, this loader uses seed {self.seed}")
