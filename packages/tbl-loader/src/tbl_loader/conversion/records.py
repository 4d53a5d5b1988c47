"""What every record source (WebDataset, Parquet / Arrow, HF `datasets`, manifest) hands to the conversion.

A record source reads samples of its own layout, each an image (encoded
bytes, or a file path for a manifest), a label value and named fields, and
gives them to a `RecordSink`, which makes the `Listing` the one conversion
reads (`tbl_loader.conversion.images`): the same names, labels, locators and
class names as a TAR or folder, plus the fields (stored as a sidecar's are,
`tbl_loader.conversion.extra_columns`).

Image bytes are copied, in source order, into one scratch file beside the
destination (``.tbl-convert-*.records``); locators are ``(offset, size)``
into it, read by the workers as TAR members are. The copy is one sequential
write of the encoded bytes, small next to decoding them, and it lets any
source, local shards or Arrow columns, feed workers that read their own
bytes. The file is deleted when the conversion ends. An image over
``max_bytes`` is not copied at all: its locator still names its size, and the
worker refuses it unread (`ImageTooLargeError`, a bad image).

Labels follow the label-file rule (`labels_from_values`: all non-negative
integers used as given, or all class-name strings sorted), unless the source
names its classes (a `datasets` ``ClassLabel``). A sample without the label
field is refused by name (`SourceError`): ``label_key`` names another field.

A sample the source cannot give (a WebDataset key without an image, a second
sample under a key already seen, an unreadable Parquet row group) is
``on_error``'s to decide: ``"fail"`` raises `SourceError` naming it before
anything is written, ``"skip"`` leaves it out and lists it in the report
(`Listing.skipped`).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ..errors import SourceError
from .sources import Listing, Locator, labels_from_values

__all__ = ["RecordSink"]


class RecordSink:
    """Collects a record source's samples into a `Listing` (see the module docstring).

    Args:
        kind: the source's kind ("webdataset", "parquet", ...), the listing's ``kind``.
        where: the source as named in errors.
        label_key: the field labels come from, named in errors.
        on_error: "fail" or "skip", for samples the source cannot give.
        max_bytes: the cap on one image's encoded size; a bigger one is not copied.
        scratch_dir: where the scratch file of image bytes goes (default: the system temp dir).
    """

    def __init__(self, kind: str, where: str, *, label_key: str, on_error: str, max_bytes: int,
                 scratch_dir: str | os.PathLike[str] | None = None) -> None:
        self.kind = kind
        self.where = where
        self.label_key = label_key
        self.on_error = on_error
        self.max_bytes = max_bytes
        self.names: list[str] = []
        self.values: list[object] = []
        self.locators: list[Locator] = []
        self.fields: dict[str, dict[str, Any]] = {}
        self.skipped: list[tuple[str, str]] = []
        self.ignored: list[str] = []
        self._origin: dict[str, str] = {}  # name -> where it was first seen (shard, file)
        self._scratch_dir = scratch_dir
        self._blob: Any = None
        self.blob_path: str | None = None
        self._blob_size = 0

    def add(self, name: str, image: bytes | str, label: object, fields: dict[str, Any], origin: str) -> None:
        """One sample: its image (encoded bytes, or the absolute path of its file), label value (None: none
        given) and fields; ``origin`` (a shard, a file) names where it came from in errors."""
        first = self._origin.get(name)
        if first is not None:
            self.reject(name, f"a second sample under this name, in {origin} (the first is in {first}; kept)")
            return
        if label is None:
            raise SourceError(f"{self.where}: sample {name!r} (in {origin}) has no label field {self.label_key!r}; "
                              "name the field that holds labels with --label-key (label_key=)")
        self._origin[name] = origin
        self.names.append(name)
        self.values.append(label)
        self.locators.append(image if isinstance(image, str) else self._copy(image))
        self.fields[name] = fields

    def reject(self, name: str, why: str) -> None:
        """A sample the source cannot give: fatal under ``on_error="fail"``, else listed as skipped."""
        if self.on_error == "fail":
            raise SourceError(f"{self.where}: {name}: {why} (--on-error skip leaves it out and reports it)")
        self.skipped.append((name, why))

    def _copy(self, data: bytes) -> tuple[int, int]:
        if self._blob is None:
            fd, path = tempfile.mkstemp(prefix=".tbl-convert-", suffix=".records", dir=self._scratch_dir)
            self.blob_path = os.path.abspath(path)
            self._blob = os.fdopen(fd, "wb")
        offset = self._blob_size
        if len(data) <= self.max_bytes:  # a bigger image is refused unread by the worker: nothing to copy
            self._blob.write(data)
            self._blob_size += len(data)
        return offset, len(data)

    def listing(self, classes: list[str] | None = None) -> Listing:
        """The samples as a `Listing`; ``classes``: the source's own class names (labels are their indices)."""
        if self._blob is not None:
            self._blob.flush()  # workers read the file by its name
        if not self.names:
            raise SourceError(f"{self.where} holds no sample with an image ({len(self.skipped)} skipped)")
        if classes is None:
            labels, classes = labels_from_values(self.values, what=f"{self.where}, field {self.label_key!r}")
        else:
            bad = next((v for v in self.values if isinstance(v, bool) or not isinstance(v, int)
                        or not 0 <= v < len(classes)), None)
            if bad is not None:
                raise SourceError(f"{self.where}: label {bad!r} is not an index of its {len(classes)} class names")
            labels = [int(v) for v in self.values]  # type: ignore[call-overload]
        return Listing(self.kind, self.names, labels, self.locators, list(classes), tar_path=self.blob_path,
                       ignored=self.ignored, skipped=self.skipped, fields=self.fields)

    def close(self) -> None:
        """Delete the scratch file."""
        if self._blob is not None:
            self._blob.close()
            self._blob = None
        if self.blob_path is not None:
            os.unlink(self.blob_path)
            self.blob_path = None
