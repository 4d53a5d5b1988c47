"""Schema of a sample pytree: its structure and, per leaf, its kind.

A schema is a tree of ``dict`` (str keys, order kept), ``list`` and ``tuple``
nodes whose leaves are ``Leaf`` objects. A leaf's path is the keys on the way
to it joined by ``/`` (list and tuple elements by index), e.g. ``"meta/caption"``
or ``"boxes/0"``; a root that is itself a leaf has the path ``""``.

The JSON form (stored in every file header and manifest) is::

    {"dict": [[key, node], ...]} | {"list": [node, ...]} | {"tuple": [node, ...]}
    | {"leaf": {"kind": ..., "dtype": ..., "shape": [...], "ndim": n, "format": ...}}
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from typing import Any

from .errors import InvalidSchemaError

#: Every leaf kind. Fixed-size kinds are stored as contiguous columns, the others in a heap.
LEAF_KINDS = ("array", "bool", "bytes", "encoded_image", "float", "image", "int", "str", "var_array")
FIXED_KINDS = frozenset({"int", "float", "bool", "array", "image"})

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

# Dimensions and counts are bounded so that products stay far from any overflow
# and a hostile header cannot ask for absurd shapes.
MAX_NDIM = 32
MAX_DIM = 1 << 40
IMAGE_FORMAT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def _check_shape(shape: Any, what: str) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_NDIM:
        raise InvalidSchemaError(f"{what}: shape must be a list of at most {MAX_NDIM} ints, got {shape!r}")
    out = []
    for d in shape:
        if type(d) is not int or not 0 <= d <= MAX_DIM:
            raise InvalidSchemaError(f"{what}: shape dimensions must be ints in [0, 2**40], got {shape!r}")
        out.append(d)
    return tuple(out)


@dataclass(frozen=True)
class Leaf:
    """One leaf of a schema.

    ``kind`` is one of ``LEAF_KINDS``:

    - ``"int"`` (int64), ``"float"`` (float64), ``"bool"``, ``"str"`` (UTF-8), ``"bytes"``;
    - ``"array"``: fixed-shape ndarray, needs ``dtype`` and ``shape``;
    - ``"var_array"``: variable-shape ndarray, needs ``dtype`` and ``ndim`` (>= 1);
    - ``"image"``: raw uint8 image, HWC, needs ``shape=(H, W, C)``; ``dtype`` is uint8;
    - ``"encoded_image"``: encoded image bytes, needs ``format`` (e.g. ``"jpeg"``).
    """

    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    ndim: int | None = None
    format: str | None = None

    def __post_init__(self) -> None:
        kind = self.kind
        if kind not in LEAF_KINDS:
            raise InvalidSchemaError(f"unknown leaf kind {kind!r}; expected one of {LEAF_KINDS}")
        if kind == "image":
            if self.dtype not in (None, "uint8"):
                raise InvalidSchemaError(f"image leaves are uint8, got dtype {self.dtype!r}")
            object.__setattr__(self, "dtype", "uint8")
        if kind in ("array", "var_array", "image"):
            if self.dtype not in DTYPES:
                raise InvalidSchemaError(f"{kind} leaf: dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        elif self.dtype is not None:
            raise InvalidSchemaError(f"{kind} leaf takes no dtype")
        if kind in ("array", "image"):
            if self.shape is None:
                raise InvalidSchemaError(f"{kind} leaf needs a shape")
            shape = _check_shape(self.shape, f"{kind} leaf")
            if kind == "image" and (len(shape) != 3 or 0 in shape):
                raise InvalidSchemaError(f"image leaf shape must be (H, W, C), all > 0, got {shape!r}")
            object.__setattr__(self, "shape", shape)
        elif self.shape is not None:
            raise InvalidSchemaError(f"{kind} leaf takes no shape")
        if kind == "var_array":
            if type(self.ndim) is not int or not 1 <= self.ndim <= MAX_NDIM:
                raise InvalidSchemaError(f"var_array leaf needs ndim in [1, {MAX_NDIM}], got {self.ndim!r}")
        elif self.ndim is not None:
            raise InvalidSchemaError(f"{kind} leaf takes no ndim")
        if kind == "encoded_image":
            f = self.format
            if not isinstance(f, str) or not 0 < len(f) <= 32 or not set(f) <= IMAGE_FORMAT_CHARS:
                raise InvalidSchemaError(f"encoded_image leaf needs a short lowercase format tag, got {f!r}")
        elif self.format is not None:
            raise InvalidSchemaError(f"{kind} leaf takes no format")

    @property
    def fixed_size(self) -> bool:
        """True when every row has the same number of bytes (stored as a contiguous column)."""
        return self.kind in FIXED_KINDS

    @property
    def row_format(self) -> str:
        """struct / memoryview format character of one element."""
        if self.kind == "int":
            return "q"
        if self.kind == "float":
            return "d"
        if self.kind == "bool":
            return "?"
        if self.dtype is None:
            raise InvalidSchemaError(f"{self.kind} leaf has no element format")
        return DTYPES[self.dtype][0]

    @property
    def itemsize(self) -> int:
        """Bytes of one element (int/float 8, bool 1, arrays their dtype's size)."""
        if self.kind in ("int", "float"):
            return 8
        if self.kind == "bool":
            return 1
        if self.dtype is None:
            raise InvalidSchemaError(f"{self.kind} leaf has no item size")
        return DTYPES[self.dtype][1]

    @property
    def row_bytes(self) -> int:
        """Bytes per row of a fixed-size leaf."""
        if not self.fixed_size:
            raise InvalidSchemaError(f"{self.kind} leaves have no fixed row size")
        n = self.itemsize
        for d in self.shape or ():
            n *= d
        return n

    @property
    def row_shape(self) -> tuple[int, ...]:
        """Shape of one row of a fixed-size leaf (``()`` for scalars)."""
        return tuple(self.shape or ())

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.dtype is not None and self.kind != "image":
            out["dtype"] = self.dtype
        if self.shape is not None:
            out["shape"] = list(self.shape)
        if self.ndim is not None:
            out["ndim"] = self.ndim
        if self.format is not None:
            out["format"] = self.format
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Leaf:
        if not isinstance(obj, dict) or not set(obj) <= {"kind", "dtype", "shape", "ndim", "format"}:
            raise InvalidSchemaError(f"leaf must be an object with kind/dtype/shape/ndim/format, got {obj!r:.200}")
        shape = obj.get("shape")
        if shape is not None:
            shape = _check_shape(shape, "leaf")
        try:
            return cls(obj.get("kind"), obj.get("dtype"), shape, obj.get("ndim"), obj.get("format"))
        except TypeError as exc:  # unhashable values in the JSON (lists where strings belong)
            raise InvalidSchemaError(f"invalid leaf {obj!r:.200}: {exc}") from None


def _check_key(key: Any, where: str) -> str:
    if not isinstance(key, str):
        raise InvalidSchemaError(f"dict keys must be str, got {key!r} at {where or '<root>'!r}")
    if "/" in key or key == "":
        raise InvalidSchemaError(f"dict key {key!r} at {where or '<root>'!r} is empty or contains '/'")
    return key


def _join(prefix: str, key: str) -> str:
    return f"{prefix}/{key}" if prefix else key


class Schema:
    """A sample pytree's structure with a ``Leaf`` at each leaf.

    ``Schema({"image": Leaf("image", shape=(32, 32, 3)), "label": Leaf("int")})``.
    ``leaves`` maps every leaf path to its ``Leaf`` in traversal order (dict
    insertion order, then list/tuple index order).
    """

    __slots__ = ("_fingerprint", "leaves", "tree")

    def __init__(self, tree: Any) -> None:
        self.leaves: dict[str, Leaf] = {}
        self.tree = self._build(tree, "", 0)
        self._fingerprint: str | None = None

    def _build(self, node: Any, path: str, depth: int) -> Any:
        if depth > 64:
            raise InvalidSchemaError("schema nesting is deeper than 64 levels")
        if isinstance(node, Leaf):
            self.leaves[path] = node
            return node
        if isinstance(node, dict):
            return {k: self._build(v, _join(path, _check_key(k, path)), depth + 1) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            items = [self._build(v, _join(path, str(i)), depth + 1) for i, v in enumerate(node)]
            return items if isinstance(node, list) else tuple(items)
        raise InvalidSchemaError(f"schema node at {path or '<root>'!r} is {type(node).__name__}, not Leaf/dict/list/tuple")

    @property
    def paths(self) -> list[str]:
        return list(self.leaves)

    def to_json(self) -> Any:
        def enc(node: Any) -> Any:
            if isinstance(node, Leaf):
                return {"leaf": node.to_json()}
            if isinstance(node, dict):
                return {"dict": [[k, enc(v)] for k, v in node.items()]}
            return {"list" if isinstance(node, list) else "tuple": [enc(v) for v in node]}

        return enc(self.tree)

    @classmethod
    def from_json(cls, obj: Any) -> Schema:
        def dec(node: Any, depth: int) -> Any:
            if depth > 64:
                raise InvalidSchemaError("schema nesting is deeper than 64 levels")
            if not isinstance(node, dict) or len(node) != 1:
                raise InvalidSchemaError(f"schema node must be a one-key object, got {node!r:.200}")
            ((tag, body),) = node.items()
            if tag == "leaf":
                return Leaf.from_json(body)
            if tag == "dict" and isinstance(body, list):
                out = {}
                for item in body:
                    if not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], str):
                        raise InvalidSchemaError(f"dict schema items are [key, node] pairs, got {item!r:.200}")
                    if item[0] in out:
                        raise InvalidSchemaError(f"duplicate dict key {item[0]!r} in schema")
                    out[item[0]] = dec(item[1], depth + 1)
                return out
            if tag in ("list", "tuple") and isinstance(body, list):
                items = [dec(v, depth + 1) for v in body]
                return items if tag == "list" else tuple(items)
            raise InvalidSchemaError(f"unknown schema node {tag!r}")

        return cls(dec(obj, 0))

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the canonical JSON form: equal schemas have equal fingerprints."""
        if self._fingerprint is None:
            text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
            self._fingerprint = hashlib.sha256(text.encode()).hexdigest()
        return self._fingerprint

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        inner = ", ".join(f"{p!r}: {leaf}" for p, leaf in self.leaves.items())
        return f"Schema({{{inner}}})"


def _numpy():
    return sys.modules.get("numpy")


def as_array(value: Any) -> Any:
    """A numpy array for a numpy array, numpy scalar or torch tensor; None for anything else.

    torch is never imported here: a tensor can only exist if the caller imported it.
    """
    np = _numpy()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    return None


def dtype_name(arr: Any) -> str | None:
    """The DTYPES name of a numpy array's dtype (byte order ignored), or None if unsupported."""
    dt = arr.dtype
    return _KIND_SIZE.get((dt.kind, dt.itemsize))


# numpy (kind, itemsize) -> DTYPES name; numpy's dtype.name property is slow enough to matter per sample.
_KIND_SIZE = {("b", 1): "bool", ("f", 2): "float16", ("f", 4): "float32", ("f", 8): "float64"}
_KIND_SIZE.update({(k, n): f"{'u' if k == 'u' else ''}int{8 * n}" for k in "ui" for n in (1, 2, 4, 8)})


def infer_leaf(value: Any, path: str) -> Leaf:
    """The Leaf kind of one value; see infer_schema."""
    if isinstance(value, bool):
        return Leaf("bool")
    if isinstance(value, int):
        return Leaf("int")
    if isinstance(value, float):
        return Leaf("float")
    if isinstance(value, str):
        return Leaf("str")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Leaf("bytes")
    arr = as_array(value)
    if arr is not None:
        name = dtype_name(arr)
        if name is None:
            raise InvalidSchemaError(f"leaf {path!r}: unsupported dtype {arr.dtype}")
        if arr.ndim == 0:  # numpy scalars become Python scalars
            return Leaf({"bool": "bool", "float16": "float", "float32": "float", "float64": "float"}.get(name, "int"))
        return Leaf("array", dtype=name, shape=tuple(int(d) for d in arr.shape))
    raise InvalidSchemaError(f"leaf {path!r}: cannot store a {type(value).__name__}")


def infer_schema(sample: Any) -> Schema:
    """Infer a Schema from one sample.

    Python/numpy scalars map to int/float/bool, ``str`` to str, bytes-like to
    bytes, numpy arrays and torch tensors to fixed-shape ``array`` leaves.
    Variable-shape arrays, raw images and encoded images cannot be told apart
    from one sample: pass an explicit Schema with ``var_array`` / ``image`` /
    ``encoded_image`` leaves for those. Keys containing ``/`` are rejected.
    """

    def walk(node: Any, path: str, depth: int) -> Any:
        if depth > 64:
            raise InvalidSchemaError("sample nesting is deeper than 64 levels")
        if isinstance(node, dict):
            return {_check_key(k, path): walk(v, _join(path, k), depth + 1) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            items = [walk(v, _join(path, str(i)), depth + 1) for i, v in enumerate(node)]
            return items if isinstance(node, list) else tuple(items)
        return infer_leaf(node, path)

    return Schema(walk(sample, "", 0))
