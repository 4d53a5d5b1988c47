"""Arrow tables as a conversion source: Parquet files, Arrow IPC files, HuggingFace `datasets`.

Needs pyarrow (``pip install "tbl-loader[parquet]"``); a `datasets` folder or
object also needs `datasets` (``pip install "tbl-loader[hf]"``).

Sources
-------
Parquet: one ``.parquet`` file, or a folder of them (sorted by name; other
files are ignored and counted), read row group by row group. Arrow: one
``.arrow`` / ``.feather`` file (IPC file or stream format). HuggingFace: a
`datasets.Dataset` object (Python API) or a folder written by its
``save_to_disk`` (a `DatasetDict` folder is refused: name one split's folder).

One row is one sample, named ``FILE:ROW`` (the row's index in its file) or,
for a `datasets` source, its row index.

Columns
-------
The image column is ``image_key`` (default: the column of the `datasets`
``Image`` feature, else ``image``), either encoded bytes (``binary``) or a
struct with a ``bytes`` child as HuggingFace stores images (its ``path`` is
not used; a row with no bytes is a bad sample). The label column is
``label_key`` (default: the one ``ClassLabel`` feature, else ``label``): a
``ClassLabel``'s names are the dataset's class names, other labels follow the
label-file rule. Every other column becomes a field, its kind mapped from its
Arrow type:

==========================================  ==========================================
Arrow type                                  field
==========================================  ==========================================
integers (any width, signed or not)         int (int64)
floating point (any width)                  float (float64)
bool                                        bool
string, large_string                        str
binary, large_binary                        bytes
list / large_list / fixed_size_list of      array of that element type: fixed shape when
numbers (nested for 2-D)                    every row's has one shape, else variable
list of strings                             list of str
struct                                      a dict of fields, one per child, same rules
==========================================  ==========================================

A null anywhere in a stored column is refused by name (``SourceError``: TBL
has no nulls in a field that is not declared optional), as is any other
Arrow type (a timestamp, a dictionary, a map), naming the column.

Hostile files: a Parquet file whose footer does not read is refused
(``SourceError``); a row group that does not read (a corrupt page, a bad
checksum, truncated data) is ``on_error``'s: a named error, or its rows are
left out and the row group is listed in the report.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..errors import SourceError
from .records import RecordSink

__all__ = ["PIP_HF", "PIP_PARQUET", "arrow_table", "column_values", "dataset_rows", "is_hf_dataset", "is_hf_folder",
           "load_dataset", "parquet_tables", "read_arrow", "read_hf", "read_parquet"]

PIP_PARQUET: Final = 'pip install "tbl-loader[parquet]"'
PIP_HF: Final = 'pip install "tbl-loader[hf]"'
HF_BATCH_ROWS: Final = 1024  # rows of a `datasets` source read at a time


def _pyarrow() -> Any:
    try:
        import pyarrow  # optional: the parquet extra
        import pyarrow.ipc  # the submodules read below, imported so that pyarrow.ipc / .parquet are there
        import pyarrow.parquet
    except ImportError as e:
        raise ImportError(f"Parquet and Arrow sources need pyarrow: {PIP_PARQUET}") from e
    return pyarrow


def _datasets() -> Any:
    try:
        import datasets  # optional: the hf extra
    except ImportError as e:
        raise ImportError(f"HuggingFace datasets sources need the datasets library: {PIP_HF}") from e
    return datasets


def is_hf_folder(path: Path) -> bool:
    """Whether ``path`` is a folder `datasets` wrote with ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def is_hf_dataset(obj: object) -> bool:
    """Whether ``obj`` is a `datasets` Dataset or DatasetDict (checked only when `datasets` is imported already:
    an object of it cannot exist otherwise)."""
    datasets = sys.modules.get("datasets")
    return datasets is not None and isinstance(obj, (datasets.Dataset, datasets.DatasetDict))


# ------------------------------------------------------------------------------------------ Arrow values


def column_values(column: Any, where: str) -> list[Any]:
    """The Python values of one Arrow column (Array or ChunkedArray), mapped as the module docstring says."""
    pa = _pyarrow()
    if column.null_count:
        raise SourceError(f"{where}: {column.null_count} null value(s); TBL stores no nulls in a field")
    t = column.type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return column.to_numpy(zero_copy_only=False).tolist()
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return column.to_pylist()
    if pa.types.is_struct(t):
        combined = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        children = {t.field(i).name: column_values(combined.field(i), f"{where}.{t.field(i).name}")
                    for i in range(t.num_fields)}
        return [dict(zip(children, row, strict=True)) for row in zip(*children.values(), strict=True)]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = t.value_type
        while pa.types.is_list(element) or pa.types.is_large_list(element) or pa.types.is_fixed_size_list(element):
            element = element.value_type
        if pa.types.is_string(element) or pa.types.is_large_string(element):
            return column.to_pylist()
        if pa.types.is_integer(element) or pa.types.is_floating(element) or pa.types.is_boolean(element):
            dtype = np.dtype(element.to_pandas_dtype())
            try:
                return [np.asarray(v, dtype) for v in column.to_pylist()]
            except ValueError as e:  # a ragged inner list
                raise SourceError(f"{where}: lists that are not rectangular arrays ({e})") from None
    raise SourceError(f"{where}: Arrow type {t} is not one TBL stores as a field (see the type table of "
                      "tbl_loader.conversion.tables)")


def _image_bytes(column: Any, where: str) -> list[bytes | None]:
    """Encoded image bytes per row: a binary column, or the ``bytes`` child of HF-style structs."""
    pa = _pyarrow()
    t = column.type
    if pa.types.is_struct(t) and t.get_field_index("bytes") >= 0:
        combined = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        column = combined.field("bytes")
        t = column.type
    if not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        raise SourceError(f"{where}: image column of type {column.type}; an image column holds encoded bytes, or "
                          "structs with a 'bytes' child as HuggingFace stores images (--image-key names another)")
    return column.to_pylist()


def _add_rows(table: Any, names: list[str], sink: RecordSink, image_key: str, label_key: str, origin: str) -> None:
    """Give one table's rows (named ``names``) to the sink."""
    columns = table.column_names
    for key, what in ((image_key, "image"), (label_key, "label")):
        if key not in columns:
            flag = "--image-key (image_key=)" if what == "image" else "--label-key (label_key=)"
            raise SourceError(f"{origin}: no {what} column {key!r} (columns: {columns}); name it with {flag}")
    images = _image_bytes(table.column(image_key), f"{origin}, column {image_key!r}")
    labels = column_values(table.column(label_key), f"{origin}, column {label_key!r}")
    fields = {c: column_values(table.column(c), f"{origin}, column {c!r}")
              for c in columns if c not in (image_key, label_key)}
    for i, name in enumerate(names):
        if images[i] is None:
            sink.reject(name, f"in {origin}: no image bytes in column {image_key!r}")
            continue
        sink.add(name, images[i], labels[i], {c: v[i] for c, v in fields.items()}, origin=origin)


# ------------------------------------------------------------------------------------------ sources


def _parquet_files(src: Path) -> tuple[list[Path], list[str]]:
    """The Parquet files of ``src`` (a file, or a folder's ``*.parquet`` sorted) and the other files ignored."""
    if not src.is_dir():
        return [src], []
    entries = sorted(os.scandir(src), key=lambda e: e.name)
    files = [Path(e.path) for e in entries if e.name.endswith(".parquet") and not e.name.startswith(".")]
    if not files:
        raise SourceError(f"folder {str(src)!r} holds no .parquet file")
    return files, [e.name for e in entries if Path(e.path) not in files]


def read_parquet(src: Path, sink: RecordSink, *, image_key: str | None, label_key: str | None) -> None:
    """Give every row of the Parquet file(s) ``src`` to ``sink``, row group by row group (module docstring).

    Args:
        src: a ``.parquet`` file or a folder of them.
        sink: receives the samples.
        image_key: the image column (default ``image``).
        label_key: the label column (default ``label``).
    """
    for table, names in parquet_tables(src, sink):
        _add_rows(table, names, sink, image_key or "image", label_key or "label", f"{str(src)!r}")


def read_arrow(src: Path, sink: RecordSink, *, image_key: str | None, label_key: str | None) -> None:
    """Give every row of the Arrow IPC file ``src`` (file or stream format) to ``sink``.

    Args:
        src: an ``.arrow`` / ``.feather`` file.
        sink: receives the samples.
        image_key: the image column (default ``image``).
        label_key: the label column (default ``label``).
    """
    table = arrow_table(src)
    names = [f"{src.name}:{r}" for r in range(table.num_rows)]
    _add_rows(table, names, sink, image_key or "image", label_key or "label", repr(str(src)))


def parquet_tables(src: Path, sink: RecordSink | None) -> Iterator[tuple[Any, list[str]]]:
    """(table, row names) per readable row group of the Parquet file(s) ``src``, in order; an unreadable row
    group goes to ``sink.reject`` (None: `SourceError`). The other files of a folder go to ``sink.ignored``."""
    pa = _pyarrow()
    files, ignored = _parquet_files(src)
    if sink is not None:
        sink.ignored.extend(ignored)
    for path in files:
        try:
            pf = pa.parquet.ParquetFile(path)
        except (OSError, pa.ArrowException) as e:
            raise SourceError(f"{str(path)!r} is not a readable Parquet file: {e}") from e
        with pf:
            row = 0
            for group in range(pf.num_row_groups):
                rows = pf.metadata.row_group(group).num_rows
                where = f"{str(path)!r} row group {group} (rows {row}..{row + rows - 1})"
                try:
                    table = pf.read_row_group(group)
                except (OSError, pa.ArrowException) as e:
                    if sink is None:
                        raise SourceError(f"{where} does not read: {type(e).__name__}: {e}") from e
                    sink.reject(where, f"does not read: {type(e).__name__}: {e}")
                else:
                    yield table, [f"{path.name}:{r}" for r in range(row, row + table.num_rows)]
                row += rows


def arrow_table(src: Path) -> Any:
    """The whole table of the Arrow IPC file ``src`` (file or stream format)."""
    pa = _pyarrow()
    try:
        try:
            return pa.ipc.open_file(src).read_all()
        except pa.ArrowInvalid:
            with pa.ipc.open_stream(src) as reader:
                return reader.read_all()
    except (OSError, pa.ArrowException) as e:
        raise SourceError(f"{str(src)!r} is not a readable Arrow file: {e}") from e


def load_dataset(src: Any) -> Any:
    """A `datasets.Dataset`: ``src`` itself, or loaded from its ``save_to_disk`` folder (a DatasetDict refused)."""
    datasets = _datasets()
    if isinstance(src, (str, os.PathLike)):
        if (Path(src) / "dataset_dict.json").is_file():
            splits = json.loads((Path(src) / "dataset_dict.json").read_text()).get("splits")
            raise SourceError(f"{os.fspath(src)!r} holds a DatasetDict (splits {splits}); name one split's folder")
        try:
            return datasets.load_from_disk(os.fspath(src))
        except (OSError, ValueError) as e:
            raise SourceError(f"{os.fspath(src)!r} does not load as a datasets folder: {e}") from e
    if isinstance(src, datasets.DatasetDict):
        raise SourceError(f"a DatasetDict (splits {list(src)}); give one split, e.g. dataset['train']")
    return src


def dataset_rows(ds: Any) -> Iterator[Any]:
    """A `datasets.Dataset`'s rows as Arrow tables of at most ``HF_BATCH_ROWS`` rows, in its order."""
    arrow = ds.with_format("arrow")
    for start in range(0, len(ds), HF_BATCH_ROWS):
        yield arrow[start : start + HF_BATCH_ROWS]


def read_hf(src: Any, sink: RecordSink, *, image_key: str | None, label_key: str | None) -> list[str] | None:
    """Give every row of a `datasets` Dataset (or ``save_to_disk`` folder) to ``sink``; returns the label's
    ``ClassLabel`` names, or None when the label column is not one.

    Args:
        src: a `datasets.Dataset`, or the path of its ``save_to_disk`` folder.
        sink: receives the samples.
        image_key: the image column (default: the ``Image`` feature's).
        label_key: the label column (default: the ``ClassLabel`` feature's, else ``label``).
    """
    datasets = _datasets()
    ds = load_dataset(src)
    features = ds.features
    images = [c for c, f in features.items() if isinstance(f, datasets.Image)]
    class_labels = [c for c, f in features.items() if isinstance(f, datasets.ClassLabel)]
    image_key = image_key or (images[0] if len(images) == 1 else "image")
    label_key = label_key or (class_labels[0] if len(class_labels) == 1 else "label")
    for start, table in zip(range(0, len(ds), HF_BATCH_ROWS), dataset_rows(ds), strict=True):
        names = [str(r) for r in range(start, start + table.num_rows)]
        _add_rows(table, names, sink, image_key, label_key, "the dataset")
    label_feature = features.get(label_key)
    return list(label_feature.names) if isinstance(label_feature, datasets.ClassLabel) else None
