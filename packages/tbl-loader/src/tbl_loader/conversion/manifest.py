"""A CSV or JSONL manifest of image paths as a conversion source, other columns as fields.

``.jsonl``: one JSON object per line (blank lines skipped). ``.csv`` / ``.tsv``:
a header row, then one row per image; cells that read as ints become ints, as
numbers floats, others stay strings (as in a CSV sidecar). The image column
is ``image_key`` (default: the first of ``path``, ``image``, ``file_name``,
``filename``, ``file`` the first row has); the label column is ``label_key``
(default ``label``); every other column is a field (JSON lists become
arrays, objects nested fields: see `tbl_loader.conversion.extra_columns`).

A path is relative to the manifest's folder, ``/``-separated, and stays
inside it: an absolute path, or one whose ``..`` parts climb out of the folder,
is refused naming its line (`SourceError`, whatever ``on_error``), so a
manifest never reads files it does not sit above. (Links inside the folder
are followed, as in a folder source.) The path, normalized, is the sample's
name; a path listed twice is a second sample under one name (``on_error``).
Samples keep the manifest's order. Images are read by the workers as a folder
source's are: a missing or bad file is a bad image (``on_error``).
"""

from __future__ import annotations

import csv
import io
import json
import posixpath
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from ..errors import LoaderError, NotRegularFileError, SourceError
from .extra_columns import parse_cell
from .records import RecordSink
from .sources import read_file

__all__ = ["IMAGE_COLUMNS", "MANIFEST_SUFFIXES", "read_manifest"]

IMAGE_COLUMNS: Final = ("path", "image", "file_name", "filename", "file")
MANIFEST_SUFFIXES: Final = (".jsonl", ".csv", ".tsv")
MANIFEST_MAX_BYTES: Final = 1 << 30  # read whole, as a label file is


def _rows(path: Path, text: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a manifest."""
    if path.suffix.lower() == ".jsonl":
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SourceError(f"manifest {str(path)!r} line {lineno}: not JSON: {e}") from None
            if not isinstance(row, dict):
                raise SourceError(f"manifest {str(path)!r} line {lineno}: not a JSON object")
            yield lineno, row
        return
    reader = csv.reader(io.StringIO(text), delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
    header = next(reader, None)
    if not header:
        raise SourceError(f"manifest {str(path)!r} is empty (a CSV manifest starts with a header row)")
    for row in reader:
        if not row:
            continue
        if len(row) != len(header):
            raise SourceError(f"manifest {str(path)!r} line {reader.line_num}: {len(row)} cells, the header "
                              f"{len(header)}")
        yield reader.line_num, {h: parse_cell(c) for h, c in zip(header, row, strict=True)}


def _inside(path: Path, lineno: int, value: object) -> str:
    """The normalized relative path of a manifest cell, refused when it leaves the manifest's folder."""
    if not isinstance(value, str) or not value:
        raise SourceError(f"manifest {str(path)!r} line {lineno}: image path {value!r} is not a path")
    rel = posixpath.normpath(value)
    if value.startswith(("/", "\\")) or Path(value).is_absolute() or rel == ".." or rel.startswith("../"):
        raise SourceError(f"manifest {str(path)!r} line {lineno}: image path {value!r} points outside the "
                          f"manifest's folder {str(path.parent)!r}; paths are relative to it and stay inside it")
    return rel


def read_manifest(path: Path, sink: RecordSink, *, image_key: str | None, label_key: str | None) -> None:
    """Give every row of the manifest ``path`` to ``sink`` (see the module docstring).

    Args:
        path: a ``.jsonl``, ``.csv`` or ``.tsv`` file.
        sink: receives the samples.
        image_key: the image path column (default: the first of `IMAGE_COLUMNS` present).
        label_key: the label column (default ``label``).
    """
    try:
        text = read_file(path, MANIFEST_MAX_BYTES).decode("utf-8-sig")
    except (OSError, ValueError, LoaderError, NotRegularFileError) as e:
        raise SourceError(f"cannot read manifest {str(path)!r}: {e}") from e
    root = path.parent.resolve()
    label_key = label_key or "label"
    for lineno, row in _rows(path, text):
        if image_key is None:
            image_key = next((c for c in IMAGE_COLUMNS if c in row), None)
            if image_key is None:
                raise SourceError(f"manifest {str(path)!r} line {lineno}: no image path column (one of "
                                  f"{list(IMAGE_COLUMNS)}); name it with --image-key (image_key=)")
        if image_key not in row:
            raise SourceError(f"manifest {str(path)!r} line {lineno}: no image path column {image_key!r}")
        rel = _inside(path, lineno, row[image_key])
        fields = {k: v for k, v in row.items() if k not in (image_key, label_key)}
        sink.add(rel, str(root / rel), row.get(label_key), fields, origin=f"manifest line {lineno}")
