"""TBL on Ray Data (the ``ray`` extra: ``pip install 'tbl-loader[ray]'``).

- `TblDatasink`: ``dataset.write_datasink(TblDatasink(path, shard_rows=...))``
  writes a Ray dataset as a TBL dataset directory; workers write the shards,
  the driver publishes the manifest once every write succeeded.
- `read_tbl`: a TBL dataset (file or directory) as a Ray dataset, one read
  task per shard (or per row range of a large shard).
- `convert`: ``tbl convert --engine ray``: decode and resize as Ray tasks;
  the rows equal the single-machine `tbl_loader.convert`'s, in the same order.

Without Ray installed, importing this package raises `RayUnavailableError`
(an ImportError) naming the pip command.
"""

from __future__ import annotations

from ..errors import DecoderMismatchError, OrderError, RayUnavailableError

PIP_COMMAND = "pip install 'tbl-loader[ray]'"

try:
    import ray
    import ray.data  # noqa: F401
except ImportError as _e:  # the core install has no Ray: say how to get it
    raise RayUnavailableError(
        f"tbl_loader.ray needs Ray Data, which is not installed ({_e}); install it with: {PIP_COMMAND}"
    ) from _e

from .convert import convert  # noqa: E402
from .sink import TblDatasink  # noqa: E402
from .source import TblDatasource, read_tbl  # noqa: E402

__all__ = [
    "DecoderMismatchError",
    "OrderError",
    "PIP_COMMAND",
    "RayUnavailableError",
    "TblDatasink",
    "TblDatasource",
    "convert",
    "read_tbl",
]
