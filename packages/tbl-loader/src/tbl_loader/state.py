"""Resumable stream position: the tiny ``state_dict`` every loader saves and checks.

A state is five facts: the seed, the epoch, the number of global positions of the
epoch's permutation already consumed (by all ranks together), a fingerprint of
the dataset and a fingerprint of the settings that change the stream (which
samples, in which order, with which augmentation draws). Batch size, prefetch,
thread count, output dtype / layout and world size are deliberately left out: a
run may resume with any of them changed and still yields exactly the rest of the
epoch.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from .order import ORDER_VERSION

__all__ = [
    "STATE_VERSION",
    "StateMismatchError",
    "StreamState",
    "dataset_fingerprint",
    "settings_fingerprint",
]

STATE_VERSION = 1


class StateMismatchError(ValueError):
    """A saved state does not belong to this loader (other dataset, settings, seed or format)."""


def _digest(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def dataset_fingerprint(dataset: Any) -> str:
    """Fingerprint of an open dataset from its public description.

    Covers the row count, the rows per shard, the schema, the metadata (class
    names and preprocessing parameters live there) and, when the dataset exposes
    them, every shard's header checksum: from ``dataset.shard_entries`` (the
    manifest's record, so no shard is mapped) or else ``dataset.shard(k).header_crc32``.
    Both give the same checksums, hence the same fingerprint. Uses
    ``dataset.fingerprint`` instead when the dataset provides one (a string or a
    method returning one).
    """
    own = getattr(dataset, "fingerprint", None)
    if callable(own):
        own = own()
    if isinstance(own, str):
        return _digest({"dataset": own})
    schema = getattr(dataset, "schema", None)
    if schema is not None and hasattr(schema, "fingerprint"):
        schema_id = schema.fingerprint() if callable(schema.fingerprint) else schema.fingerprint
    elif schema is not None and hasattr(schema, "to_json"):
        schema_id = schema.to_json()
    else:
        schema_id = repr(schema)
    segment_rows = list(getattr(dataset, "segment_rows", []))
    headers = None
    entries = getattr(dataset, "shard_entries", None)
    if entries is not None:
        headers = [entry.get("header_crc32") for entry in entries]
    elif callable(getattr(dataset, "shard", None)):
        headers = [getattr(dataset.shard(k), "header_crc32", None) for k in range(len(segment_rows))]
    return _digest(
        {
            "rows": len(dataset),
            "segment_rows": segment_rows,
            "shard_headers": headers,
            "schema": schema_id,
            "metadata": getattr(dataset, "metadata", None),
        }
    )


def settings_fingerprint(settings: dict[str, Any]) -> str:
    """Fingerprint of the stream-changing settings (plus the order generator's version)."""
    return _digest({"order_version": ORDER_VERSION, **settings})


@dataclass(frozen=True)
class StreamState:
    """Where a stream stands: ``consumed`` global positions into epoch ``epoch``."""

    seed: int
    epoch: int
    consumed: int
    dataset: str
    settings: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "seed": self.seed,
            "epoch": self.epoch,
            "consumed": self.consumed,
            "dataset": self.dataset,
            "settings": self.settings,
        }

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
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StateMismatchError(f"state[{key!r}] must be a non-negative int, got {value!r}")
        return cls(state["seed"], state["epoch"], state["consumed"], str(state["dataset"]), str(state["settings"]))

    def check_compatible(self, other: StreamState) -> None:
        """Raise :class:`StateMismatchError` naming the first field where ``other`` differs."""
        if self.dataset != other.dataset:
            raise StateMismatchError(
                f"state was saved for another dataset (fingerprint {other.dataset}, this loader's is {self.dataset})"
            )
        if self.settings != other.settings:
            raise StateMismatchError(
                "state was saved with other stream settings (shuffle, flip, crop, drop_last, padding "
                f"or order version): fingerprint {other.settings}, this loader's is {self.settings}"
            )
        if self.seed != other.seed:
            raise StateMismatchError(f"state was saved with seed {other.seed}, this loader uses seed {self.seed}")
