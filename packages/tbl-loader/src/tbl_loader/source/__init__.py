"""Where a dataset's bytes come from: a local map or a remote shard cache, page-cache advice, verification.

``storage`` is the one object-store client (the ``remote`` extra), ``cache``
the local shard cache, ``fetcher`` its read-ahead, ``remote`` a dataset at a
URL served from that cache, ``advice`` the page-cache hints of out-of-core
reading, ``verify`` when data checksums are checked, ``upload`` publishing a
local dataset to a URL.
"""

from __future__ import annotations

from .remote import open_remote
from .storage import is_url
from .upload import upload_dataset
from .verify import VERIFY_MODES

__all__ = [
    "VERIFY_MODES",
    "is_url",
    "open_remote",
    "upload_dataset",
]
