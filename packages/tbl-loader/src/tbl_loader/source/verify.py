"""When a loader checks the data-block checksums of what it serves.

``verify`` on every loader is one of:

- ``"never"`` (the default): headers and tables are checked at every open, as
  always; data blocks only by ``tbl verify``.
- ``"open"``: every data block of the dataset is checked once, when the loader
  opens it (a full read of the data: seconds per GB).
- ``"lazy"``: each data block is checked the first time a batch touches it,
  on the producer thread, before its rows are gathered
  (``tbl_format.Dataset.verify_rows``); a corrupt block raises
  ``tbl_format.DataChecksumError`` naming the file, the block and the rows, in
  the consumer's ``next()``. After every block was seen once (about one epoch)
  a batch costs one early return.

``True`` and ``False`` mean ``"open"`` and ``"never"`` (the older boolean form).
"""

from __future__ import annotations

from typing import Any

__all__ = ["VERIFY_MODES", "verify_mode"]

VERIFY_MODES = ("never", "open", "lazy")


def verify_mode(verify: Any) -> str:
    """``verify`` as one of :data:`VERIFY_MODES` (ValueError otherwise)."""
    if verify is True or verify is False:
        return "open" if verify else "never"
    if verify not in VERIFY_MODES:
        raise ValueError(f"verify must be one of {VERIFY_MODES} (or a bool), got {verify!r}")
    return verify
