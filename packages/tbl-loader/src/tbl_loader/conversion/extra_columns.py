"""Columns `tbl convert` can store beside ``image`` and ``label``: the source path, the original size, sidecar fields.

``keep_path=True`` adds ``"path"`` (str: the image's name in the listing, its
path relative to the source root, ``/``-separated, or the path given in a
list) and ``"orig_size"`` (int64 ``(2,)``: height and width of the source
image as decoded, after its EXIF orientation; read from the image header in
the converting process).

``sidecar=FILE`` adds per-image fields from a JSON or CSV file keyed by that
same name:

- JSON: an object ``{name: {field: value, ...}, ...}``, or a list of objects
  each with a ``"path"`` key;
- CSV (``.csv``, or ``.tsv`` for tabs): a header row with a ``path`` (or
  ``filename``) column and one column per field; cells that read as ints
  become ints, as numbers floats, others stay strings.

Each field becomes one leaf, its kind inferred from all its values: bools ->
``bool``, ints -> ``int``, ints and floats -> ``float``, strings -> ``str``,
lists (nested for 2-D, e.g. boxes ``[[x, y, w, h], ...]``) -> arrays,
``int64`` if every element is an int, else ``float32``: a fixed-shape array
when every image's value has one shape (a multi-label vector), else a
variable-shape one (an empty list is an empty array of the others' trailing
shape). A record source's fields (`tbl_loader.conversion.records`) follow the
same rules, and may also hold bytes (-> ``bytes``), numpy arrays (keeping
their dtype, which must be one), lists of strings (-> a list of str) and
objects with one set of keys (-> a dict of fields, each by these rules).
Every converted image needs an entry with every field
(:class:`SidecarError` names the first that has none); entries naming no image
of the source are ignored. A field may not take the name of a column the
converter writes itself: ``image``, ``label``, ``path``, ``orig_size``, and the
recipe's own (``height`` and ``width`` with ``--max-size``); it would replace
that column (SidecarError names the field and the column).

Geometry (``geometry={"boxes": "xyxy"}``, ``tbl convert --geometry boxes=xyxy``): the field's
values are boxes ``[[x1, y1, x2, y2], ...]`` in the pixels of the upright source image (as a viewer
shows it, EXIF orientation applied; its size is what ``orig_size`` holds). They are stored in stored
pixels, float32, mapped by the conversion's own geometry (the region of the source that becomes the
stored image: the central square for ``center_crop``, the whole image for ``squash`` and
``--max-size``) with the rule of :func:`tbl_loader.image.geometry.map_boxes` (clipped; a box outside the
stored region keeps its place with zero area). Without ``geometry`` a sidecar's numbers are stored as
they are.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import tbl_format

from ..errors import GeometryFieldError, SidecarError, SourceError
from ..image.geometry import check_geometry, map_boxes

__all__ = ["ExtraColumns", "field_leaf", "load_sidecar", "parse_cell"]

RESERVED = ("image", "label", "path", "orig_size")
# EXIF orientations that turn the image by 90 degrees (ImageOps.exif_transpose swaps height and width).
_TURNED = (5, 6, 7, 8)


def parse_cell(text: str) -> Any:
    """A CSV cell: an int if it reads as one, else a float if it reads as one, else the text."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def load_sidecar(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """``{name: {field: value}}`` from a JSON or CSV / TSV sidecar (see the module docstring)."""
    p = Path(path)
    try:
        fd = tbl_format.open_regular(p, "sidecar")  # a FIFO or device is refused unopened: it could block forever
        with os.fdopen(fd, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError, tbl_format.NotRegularFileError) as e:
        raise SidecarError(f"{p}: cannot read the sidecar: {e}") from None
    if p.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SidecarError(f"{p}: not valid JSON: {e}") from None
        except RecursionError:  # the parser recurses once per level of nesting
            raise SidecarError(f"{p}: JSON nested too deeply to read") from None
        if isinstance(data, list):
            entries = {}
            for k, item in enumerate(data):
                if not isinstance(item, dict) or not isinstance(item.get("path"), str):
                    raise SidecarError(f"{p}: item {k} is not an object with a string 'path'")
                entries[item["path"]] = {f: v for f, v in item.items() if f != "path"}
            data = entries
        if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
            raise SidecarError(f"{p}: a JSON sidecar is an object of objects, or a list of objects with 'path'")
        return {str(k): v for k, v in data.items()}
    if p.suffix.lower() not in (".csv", ".tsv"):
        raise SidecarError(f"{p}: a sidecar is a .json, .csv or .tsv file")
    reader = csv.reader(io.StringIO(text), delimiter="\t" if p.suffix.lower() == ".tsv" else ",")
    try:
        rows = list(reader)
    except csv.Error as e:  # e.g. a cell over csv.field_size_limit()
        raise SidecarError(f"{p}: line {reader.line_num}: {e}") from None
    if not rows:
        raise SidecarError(f"{p}: empty sidecar")
    header = rows[0]
    key = next((c for c in ("path", "filename") if c in header), None)
    if key is None:
        raise SidecarError(f"{p}: the header row needs a 'path' or 'filename' column, got {header}")
    at = header.index(key)
    out = {}
    for line, row in enumerate(rows[1:], start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise SidecarError(f"{p}: line {line} has {len(row)} cells, the header {len(header)}")
        out[row[at]] = {f: parse_cell(v) for f, v in zip(header, row, strict=True) if f != key}
    return out


def field_leaf(field: str, values: list[Any]) -> tuple[Any, Any]:
    """The leaf kind of one field from all its values (a dict of leaves for dict values), and the function that
    converts one value to it."""
    if all(isinstance(v, bool) for v in values):
        return tbl_format.Leaf("bool"), bool
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return tbl_format.Leaf("int"), int
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return tbl_format.Leaf("float"), float
    if all(isinstance(v, str) for v in values):
        return tbl_format.Leaf("str"), str
    if all(isinstance(v, bytes) for v in values):
        return tbl_format.Leaf("bytes"), bytes
    if all(isinstance(v, dict) for v in values):
        return _dict_leaf(field, values)
    if all(isinstance(v, np.ndarray) for v in values):
        return _ndarray_leaf(field, values)
    if all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in values) and any(values):
        return tbl_format.Leaf("var_list", item="str"), list
    if all(isinstance(v, list) for v in values):
        try:
            arrays = [np.asarray(v) for v in values]
        except ValueError as e:  # ragged, or nested deeper than numpy's 64 dimensions
            raise SidecarError(f"field {field!r}: list values that are not arrays of numbers ({e})") from None
        if any(a.dtype.kind not in "iufb" for a in arrays if a.size):
            raise SidecarError(f"field {field!r}: list values must hold numbers only (or strings only)")
        dtype = np.int64 if all(a.dtype.kind in "iub" for a in arrays if a.size) else np.float32
        shaped = [a for a in arrays if a.size]
        trailing = shaped[0].shape[1:] if shaped else ()

        def convert(v: Any) -> np.ndarray:
            a = np.asarray(v, dtype=dtype)
            return a.reshape((0, *trailing)) if a.size == 0 else a

        return _array_leaf(field, dtype, [convert(v).shape for v in values]), convert
    kinds = sorted({type(v).__name__ for v in values})
    raise SidecarError(f"field {field!r}: values of mixed or unsupported types {kinds}")


def _array_leaf(field: str, dtype: Any, shapes: list[tuple[int, ...]]) -> tbl_format.Leaf:
    """A fixed-shape array leaf when every value has one shape, else a variable-shape one of one ndim."""
    if len(set(shapes)) == 1:
        return tbl_format.Leaf("array", dtype=np.dtype(dtype).name, shape=shapes[0])
    ndims = {len(s) for s in shapes}
    if len(ndims) != 1:
        raise SidecarError(f"field {field!r}: list values of different depths {sorted(ndims)}")
    return tbl_format.Leaf("var_array", dtype=np.dtype(dtype).name, ndim=ndims.pop())


def _ndarray_leaf(field: str, values: list[np.ndarray]) -> tuple[tbl_format.Leaf, Any]:
    """Arrays (a WebDataset ``.npy`` member, an Arrow list column) keep their own dtype, which must be one; an
    empty one takes the others' trailing shape, as an empty list does."""
    dtypes = sorted({a.dtype.str for a in values})
    if len(dtypes) != 1:
        raise SidecarError(f"field {field!r}: arrays of different dtypes {dtypes}")
    shaped = [a for a in values if a.size]
    trailing = shaped[0].shape[1:] if shaped else ()

    def convert(a: np.ndarray) -> np.ndarray:
        return a.reshape((0, *trailing)) if a.size == 0 else np.ascontiguousarray(a)

    return _array_leaf(field, values[0].dtype, [convert(a).shape for a in values]), convert


def _dict_leaf(field: str, values: list[dict[str, Any]]) -> tuple[dict[str, Any], Any]:
    """Objects (a parsed ``.json`` member, an Arrow struct) with one set of keys: a dict of leaves, one per key."""
    keys = list(values[0])
    differing = next((v for v in values if list(v) != keys), None)
    if differing is not None:
        raise SidecarError(f"field {field!r}: objects with different keys {keys} and {list(differing)}")
    parts = {k: field_leaf(f"{field}.{k}", [v[k] for v in values]) for k in keys}

    def convert(v: dict[str, Any]) -> dict[str, Any]:
        return {k: part_convert(v[k]) for k, (_, part_convert) in parts.items()}

    return {k: node for k, (node, _) in parts.items()}, convert


class ExtraColumns:
    """The extra leaves of one conversion and each image's values (see the module docstring)."""

    def __init__(self, names: Sequence[str], locators: Sequence[Any], *, written: Sequence[str],
                 keep_path: bool = False, sidecar: str | os.PathLike[str] | None = None, tar_path: str | None = None,
                 max_bytes: int | None = None, fields: Mapping[str, Mapping[str, Any]] | None = None,
                 geometry: dict[str, str] | None = None, placement: Any = None) -> None:
        """Args:
            names: each image's name in the listing (a sidecar's keys).
            locators: where each image's bytes are (a path, or a tar member's offset and size).
            written: the columns the conversion's recipe writes itself (its schema's top-level names);
                no field may take one of them, nor one of RESERVED.
            keep_path: add the ``path`` and ``orig_size`` columns.
            sidecar: a JSON / CSV / TSV file of per-image fields.
            tar_path: the TAR the locators point into, if any.
            max_bytes: the largest image file read (--max-image-bytes).
            fields: a record source's own fields per image name (instead of a sidecar).
            geometry: fields holding boxes, by kind (see the module docstring).
            placement: ``placement(height, width) -> (source region (top, left, h, w), stored (H, W))``,
                the recipe's geometry that boxes are mapped through.
        """
        self.names = list(names)
        self.locators = list(locators)
        self.keep_path = bool(keep_path)
        self.tar_path = tar_path
        self.max_bytes = max_bytes
        self.leaves: dict[str, Any] = {}  # a field's leaf, or a dict of leaves for an object field
        self._fields: list[tuple[str, Any]] = []
        self._entries: dict[str, dict[str, Any]] = {}
        self._tar: Any = None
        if self.keep_path:
            self.leaves["path"] = tbl_format.Leaf("str")
            self.leaves["orig_size"] = tbl_format.Leaf("array", dtype="int64", shape=(2,))
        if sidecar is not None and fields is not None:
            raise SidecarError(f"{sidecar}: this source carries its own fields; a sidecar applies to a TAR or "
                               "folder source")
        if sidecar is not None:
            self._entries = load_sidecar(sidecar)
            self._add_fields(str(sidecar), SidecarError, written)
        elif fields is not None:
            self._entries = {n: dict(v) for n, v in fields.items()}
            self._add_fields("source", SourceError, written)
        self.geometry = check_geometry(geometry)
        self.placement = placement
        for f in self.geometry:
            leaf = self.leaves.get(f)
            if f in RESERVED or leaf is None:
                raise GeometryFieldError(f"geometry field {f!r} is not a sidecar field")
            boxes = leaf.kind == "var_array" and leaf.ndim == 2 or leaf.kind == "array" and len(leaf.shape) == 2
            if not boxes or (leaf.kind == "array" and leaf.shape[1] != 4):
                raise GeometryFieldError(f"geometry field {f!r} must hold lists of [x1, y1, x2, y2] boxes")
            # mapped boxes are fractional: float32 whatever the sidecar's numbers were
            self.leaves[f] = (tbl_format.Leaf("var_array", dtype="float32", ndim=2) if leaf.kind == "var_array"
                              else tbl_format.Leaf("array", dtype="float32", shape=leaf.shape))
        self._tar: Any = None

    def _add_fields(self, where: str, error: type[ValueError], written: Sequence[str]) -> None:
        """A leaf per field of the entries, from every converted image's value; ``error`` names what is wrong."""
        missing = [n for n in self.names if n not in self._entries]
        if missing:
            raise error(f"{where}: no entry for image {missing[0]!r} ({len(missing)} images have none)")
        fields = list(dict.fromkeys(f for n in self.names for f in self._entries[n]))
        taken = list(dict.fromkeys([*RESERVED, *written]))
        for f in fields:
            if f in taken:  # it would silently replace the converter's own column
                raise error(f"{where}: field {f!r} is reserved: the converter writes a {f!r} column "
                            f"itself (reserved: {', '.join(taken)}); rename the field")
            lacking = next((n for n in self.names if f not in self._entries[n]), None)
            if lacking is not None:
                raise error(f"{where}: image {lacking!r} has no field {f!r}")
            try:
                leaf, convert = field_leaf(f, [self._entries[n][f] for n in self.names])
            except SidecarError as e:
                raise error(f"{where}: {e}") from None
            self.leaves[f] = leaf
            self._fields.append((f, convert))

    def __bool__(self) -> bool:
        return bool(self.leaves)

    def refusal(self, i: int) -> str | None:
        """Why image ``i`` cannot be stored with its extra columns, or None. A file name that is not UTF-8
        (Python holds its bytes as surrogates) has no ``path`` value: the image fails like one that does not
        decode (the converter's ``on_error``), naming the file."""
        if self.keep_path:
            try:
                self.names[i].encode("utf-8")
            except UnicodeEncodeError:
                raw = os.fsencode(self.names[i])
                return f"its name is not UTF-8 ({raw!r}); the path column (keep_path) stores UTF-8 text"
        return None

    def row(self, i: int) -> dict[str, Any]:
        """Image ``i``'s extra values (``i`` indexes ``names``)."""
        out: dict[str, Any] = {}
        name = self.names[i]
        size = self._original_size(self.locators[i]) if self.keep_path or self.geometry else None
        if self.keep_path:
            out["path"] = name
            out["orig_size"] = np.array(size, np.int64)
        entry = self._entries.get(name, {})
        for f, convert in self._fields:
            out[f] = convert(entry[f])
        if self.geometry:
            region, stored_hw = self.placement(*size)
            for f in self.geometry:
                boxes = np.asarray(entry[f], dtype=np.float64)
                if boxes.size and (boxes.ndim != 2 or boxes.shape[1] != 4):
                    raise GeometryFieldError(f"image {name!r}: field {f!r} holds {boxes.shape}, not [x1, y1, x2, y2] "
                                             "boxes")
                boxes = boxes.reshape(-1, 4)
                mapped = map_boxes(boxes, np.zeros(boxes.shape[0], np.int64), region[None, :],
                                   np.zeros(1, np.bool_), stored_hw)
                out[f] = mapped.astype(np.float32).reshape(out[f].shape)
        return out

    def _original_size(self, locator: Any) -> tuple[int, int]:
        from PIL import Image  # conversion needs Pillow anyway

        from .sources import TarReader, read_file

        if isinstance(locator, str):
            data = read_file(locator, self.max_bytes) if self.max_bytes else Path(locator).read_bytes()
        else:
            if self._tar is None:
                self._tar = TarReader(self.tar_path, self.max_bytes)
            data = self._tar.read(*locator)
        with Image.open(io.BytesIO(data)) as img:  # the header only: no pixel is decoded
            width, height = img.size
            orientation = img.getexif().get(0x0112, 1)
        return (width, height) if orientation in _TURNED else (height, width)

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()
            self._tar = None
