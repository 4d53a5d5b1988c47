"""The leaf kinds: one table row per kind holds every rule about it.

A row says how the kind is stored (a fixed-size column or a heap), which
leaf fields it takes, the format minor version that introduced it, the
struct format and numpy dtype name of a scalar, the Python type a read
returns, how a value is encoded, and how a batch of it is collated
(``batch``, read by tbl-loader). The writer, the reader, the schema and the
batch collator all look kinds up here; none of them keeps a list of kinds.

This module needs neither numpy nor torch: dtypes are named by string, and
array values are handled through ``as_array`` (numpy arrays, numpy scalars,
torch tensors by duck typing) or the buffer protocol.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = [
    "DTYPES",
    "KINDS",
    "LIST_ITEMS",
    "EncodeError",
    "Kind",
    "as_array",
    "dtype_name",
]

#: dtype name -> (struct / memoryview format character, item size). Stored little-endian.
DTYPES: dict[str, tuple[str, int]] = {
    "bool": ("?", 1),
    "uint8": ("B", 1),
    "int8": ("b", 1),
    "uint16": ("H", 2),
    "int16": ("h", 2),
    "uint32": ("I", 4),
    "int32": ("i", 4),
    "uint64": ("Q", 8),
    "int64": ("q", 8),
    "float16": ("e", 2),
    "float32": ("f", 4),
    "float64": ("d", 8),
}

class EncodeError(ValueError):
    """A value does not fit its leaf; the writer adds the sample index and the leaf path to the message."""


def as_array(value: Any) -> Any:
    """A numpy array for a numpy array, numpy scalar or torch tensor; None for anything else.

    Neither numpy nor torch is imported here: such a value can only exist if the caller imported them.
    A torch tensor is recognised by duck typing (``.detach().cpu().numpy()``).
    """
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return None


# numpy (kind, itemsize) -> DTYPES name; numpy's dtype.name property is slow enough to matter per sample.
_KIND_SIZE = {("b", 1): "bool", ("f", 2): "float16", ("f", 4): "float32", ("f", 8): "float64"}
_KIND_SIZE.update({(k, n): f"{'u' if k == 'u' else ''}int{8 * n}" for k in "ui" for n in (1, 2, 4, 8)})


def dtype_name(arr: Any) -> str | None:
    """The DTYPES name of a numpy array's dtype (byte order ignored), or None if unsupported."""
    dt = arr.dtype
    return _KIND_SIZE.get((dt.kind, dt.itemsize))


# ---- encoders: (leaf, value) -> stored bytes (plus the shape for var_array); EncodeError on a misfit ---------

_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


def _what(v: Any) -> str:
    return type(v).__name__


def encode_int(leaf: Any, v: Any) -> bytes:
    if isinstance(v, bool) or not isinstance(v, int):
        arr = as_array(v)
        if arr is None or arr.ndim != 0 or arr.dtype.kind not in "iu":
            raise EncodeError(f"expected an int, got {_what(v)}")
        v = int(arr)
    if not -(1 << 63) <= v < (1 << 63):
        raise EncodeError(f"int {v} does not fit in int64")
    return _I64.pack(v)


def encode_float(leaf: Any, v: Any) -> bytes:
    if isinstance(v, (float, int)) and not isinstance(v, bool):
        try:
            return _F64.pack(v)
        except OverflowError:
            raise EncodeError(f"int {v} is too large for a float") from None
    arr = as_array(v)
    if arr is None or arr.ndim != 0 or arr.dtype.kind not in "iuf":
        raise EncodeError(f"expected a float, got {_what(v)}")
    return _F64.pack(float(arr))


def encode_bool(leaf: Any, v: Any) -> bytes:
    if v is True or v is False:
        return b"\x01" if v else b"\x00"
    arr = as_array(v)
    if arr is None or arr.ndim != 0 or arr.dtype.kind != "b":
        raise EncodeError(f"expected a bool, got {_what(v)}")
    return b"\x01" if bool(arr) else b"\x00"


def encode_none(leaf: Any, v: Any) -> bytes:
    if v is not None:
        raise EncodeError(f"expected None, got {_what(v)}")
    return b""


def encode_str(leaf: Any, v: Any) -> bytes:
    if not isinstance(v, str):
        raise EncodeError(f"expected a str, got {_what(v)}")
    try:
        return v.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EncodeError(f"str is not encodable as UTF-8: {exc}") from None


def encode_bytes(leaf: Any, v: Any) -> bytes:
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, memoryview):
        return v.tobytes()
    arr = as_array(v)
    if arr is not None and arr.dtype.kind in "uib" and arr.dtype.itemsize == 1 and arr.ndim == 1:
        return arr.tobytes()
    raise EncodeError(f"expected bytes, got {_what(v)}")


def array_bytes(leaf: Any, value: Any) -> tuple[bytes, tuple[int, ...]]:
    """Little-endian C-order bytes and shape of an array value, checked against the leaf's dtype and shape/ndim."""
    var = leaf.shape is None
    arr = as_array(value)
    if arr is not None:
        name = dtype_name(arr)
        if name != leaf.dtype:
            raise EncodeError(f"expected dtype {leaf.dtype}, got {arr.dtype}")
        shape = tuple(int(d) for d in arr.shape)
        if not var and shape != leaf.shape:
            raise EncodeError(f"expected shape {leaf.shape}, got {shape}")
        if var and len(shape) != leaf.ndim:
            raise EncodeError(f"expected ndim {leaf.ndim}, got shape {shape}")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        return arr.tobytes(order="C"), shape
    # Without numpy: any C-contiguous buffer whose format is the leaf's element format.
    try:
        mv = memoryview(value)
    except TypeError:
        raise EncodeError(f"expected a {leaf.dtype} array, got {_what(value)}") from None
    fmt = mv.format.lstrip("@=<")
    if fmt != DTYPES[leaf.dtype][0] or not mv.c_contiguous or mv.format.startswith(("!", ">")):
        raise EncodeError(f"expected a C-contiguous {leaf.dtype} buffer, got format {mv.format!r}")
    shape = tuple(mv.shape or ())
    if (not var and shape != leaf.shape) or (var and len(shape) != leaf.ndim):
        raise EncodeError(f"shape {shape} does not fit leaf {leaf}")
    return mv.tobytes(), shape


def encode_array(leaf: Any, v: Any) -> bytes:
    return array_bytes(leaf, v)[0]


# var_list items: item kind -> (array typecode of the packed items, per-item check).
def _int_items(items: list[Any]) -> list[int]:
    out = []
    for x in items:
        if x.__class__ is not int:
            x = int.from_bytes(encode_int(None, x), "little", signed=True)
        elif not -(1 << 63) <= x < (1 << 63):
            raise EncodeError(f"int {x} does not fit in int64")
        out.append(x)
    return out


def _float_items(items: list[Any]) -> list[float]:
    return [x if x.__class__ is float else _F64.unpack(encode_float(None, x))[0] for x in items]


def _bool_items(items: list[Any]) -> list[int]:
    return [1 if x is True else 0 if x is False else encode_bool(None, x)[0] for x in items]


#: var_list item kind -> (array typecode, item size, conversion of a Python list to storable items)
LIST_ITEMS: dict[str, tuple[str, int, Callable[[list[Any]], list[Any]]]] = {
    "int": ("q", 8, _int_items),
    "float": ("d", 8, _float_items),
    "bool": ("B", 1, _bool_items),
    "str": ("", 0, lambda items: [encode_str(None, x) for x in items]),
}


def encode_list(leaf: Any, v: Any) -> tuple[Any, int]:
    """(stored items, item count): packed bytes for scalar items, a list of UTF-8 bytes for str items."""
    if v.__class__ is not list:
        if not isinstance(v, (list, tuple)):
            raise EncodeError(f"expected a list of {leaf.item}, got {_what(v)}")
        v = list(v)
    code, _, convert = LIST_ITEMS[leaf.item]
    try:
        items = convert(v)
    except EncodeError as exc:
        raise EncodeError(f"list item: {exc}") from None
    except (TypeError, AttributeError):
        raise EncodeError(f"expected a list of {leaf.item}") from None
    if code:
        return array(code, items).tobytes() if sys.byteorder == "little" else _swapped(code, items), len(items)
    return items, len(items)


def _swapped(code: str, items: list[Any]) -> bytes:
    a = array(code, items)
    a.byteswap()
    return a.tobytes()


@dataclass(frozen=True)
class Kind:
    """Every rule about one leaf kind (see the module docstring)."""

    # How a batch of a kind is collated (``batch``; tbl-loader's Collator reads these):
    #: one fresh (B, *shape) array of the kind's dtype, gathered straight from the mapped columns
    COLUMN: ClassVar[str] = "column"
    #: a list of B values as ``ds[i]`` returns them, in both var modes
    VALUES: ClassVar[str] = "values"
    #: a list of B arrays, or in pad mode a Padded (B, *max_shape) array with each row's shape
    PAD_ARRAY: ClassVar[str] = "pad_array"
    #: a list of B bytes, or in pad mode a Padded (B, max_len) uint8 array with each row's length
    PAD_BYTES: ClassVar[str] = "pad_bytes"
    #: a list of B lists, or in pad mode (scalar items) a Padded (B, max_len) array with each row's length
    PAD_LIST: ClassVar[str] = "pad_list"

    name: str
    #: stored as a fixed-size column (row i at i * row_bytes) rather than in a heap
    fixed: bool
    #: the leaf fields this kind requires, beyond ``kind`` and ``optional``
    fields: frozenset[str]
    #: the format minor version (of major 1) that introduced the kind
    minor: int
    #: struct format of one scalar row, or None
    scalar: str | None
    #: numpy dtype name of a scalar row (``int64`` ...), or None (arrays use the leaf's dtype)
    numpy: str | None
    #: the Python type ``ds[i]`` returns, or None for arrays (numpy array / memoryview)
    python: type | None
    #: how a batch of this kind is collated: Kind.COLUMN, VALUES, PAD_ARRAY, PAD_BYTES or PAD_LIST
    batch: str
    #: (leaf, value) -> stored bytes (var_array: (bytes, shape); var_list: (items, count)); EncodeError on a misfit
    encode: Callable[[Any, Any], Any]


def _k(name: str, fixed: bool, fields: str, minor: int, scalar: str | None, numpy: str | None,
       python: type | None, batch: str, encode: Callable[[Any, Any], Any]) -> Kind:
    return Kind(name, fixed, frozenset(fields.split()), minor, scalar, numpy, python, batch, encode)


def _encode_var_array(leaf: Any, v: Any) -> tuple[bytes, tuple[int, ...]]:
    return array_bytes(leaf, v)


#: Every leaf kind, by name.
KINDS: dict[str, Kind] = {k.name: k for k in (
    _k("int", True, "", 0, "q", "int64", int, Kind.COLUMN, encode_int),
    _k("float", True, "", 0, "d", "float64", float, Kind.COLUMN, encode_float),
    _k("bool", True, "", 0, "?", "bool", bool, Kind.COLUMN, encode_bool),
    _k("array", True, "dtype shape", 0, None, None, None, Kind.COLUMN, encode_array),
    _k("image", True, "shape", 0, None, None, None, Kind.COLUMN, encode_array),
    _k("str", False, "", 0, None, None, str, Kind.VALUES, encode_str),
    _k("bytes", False, "", 0, None, None, bytes, Kind.PAD_BYTES, encode_bytes),
    _k("encoded_image", False, "format", 0, None, None, bytes, Kind.PAD_BYTES, encode_bytes),
    _k("var_array", False, "dtype ndim", 0, None, None, None, Kind.PAD_ARRAY, _encode_var_array),
    _k("var_list", False, "item", 1, None, None, list, Kind.PAD_LIST, encode_list),
    _k("none", True, "", 1, None, None, type(None), Kind.VALUES, encode_none),
)}
