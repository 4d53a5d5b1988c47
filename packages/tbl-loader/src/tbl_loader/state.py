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
    "pytree_fingerprint_v0_1",
    "settings_fingerprint",
]

STATE_VERSION = 1


class StateMismatchError(ValueError):
    """A saved state does not belong to this loader (other dataset, settings, seed or format)."""


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
            # The generator keys on uint64 seeds and epochs; nothing larger can have been saved.
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
                raise StateMismatchError(f"state[{key!r}] must be an int in [0, 2**64), got {value!r}")
        return cls(state["seed"], state["epoch"], state["consumed"], str(state["dataset"]), str(state["settings"]))

    def check_compatible(self, other: StreamState, *, accepted_datasets: tuple[str, ...] = ()) -> None:
        """Raise :class:`StateMismatchError` naming the first field where ``other`` differs.

        ``accepted_datasets``: further dataset fingerprints that name this state's dataset too.
        """
        if other.dataset != self.dataset and other.dataset not in accepted_datasets:
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
