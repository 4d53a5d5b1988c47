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
from dataclasses import dataclass, replace
from typing import Any

from .errors import InvalidSchemaError
from .kinds import DTYPES, KINDS, LIST_ITEMS, as_array, dtype_name

#: Every leaf kind (the rules of each are in ``tbl_format.kinds.KINDS``).
LEAF_KINDS = tuple(sorted(KINDS))
_LEAF_FIELDS = ("dtype", "shape", "ndim", "format", "item")

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
    - ``"encoded_image"``: encoded image bytes, needs ``format`` (e.g. ``"jpeg"``);
    - ``"var_list"``: a list of any length of ``item`` values (``"int"``, ``"float"``, ``"bool"`` or ``"str"``);
    - ``"none"``: always None (a leaf no sample has given a value yet).

    ``optional=True`` (any kind but ``none``): a row may hold None instead of a value.
    """

    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    ndim: int | None = None
    format: str | None = None
    item: str | None = None
    optional: bool = False

    def __post_init__(self) -> None:
        kind = self.kind
        spec = KINDS.get(kind) if isinstance(kind, str) else None
        if spec is None:
            raise InvalidSchemaError(f"unknown leaf kind {kind!r}; expected one of {LEAF_KINDS}")
        if kind == "image":
            if self.dtype not in (None, "uint8"):
                raise InvalidSchemaError(f"image leaves are uint8, got dtype {self.dtype!r}")
            object.__setattr__(self, "dtype", "uint8")
        for name in _LEAF_FIELDS:
            if name not in spec.fields and getattr(self, name) is not None and not (kind == "image" and name == "dtype"):
                raise InvalidSchemaError(f"{kind} leaf takes no {name}")
        if "dtype" in spec.fields and self.dtype not in DTYPES:
            raise InvalidSchemaError(f"{kind} leaf: dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if "shape" in spec.fields:
            if self.shape is None:
                raise InvalidSchemaError(f"{kind} leaf needs a shape")
            shape = _check_shape(self.shape, f"{kind} leaf")
            if kind == "image" and (len(shape) != 3 or 0 in shape):
                raise InvalidSchemaError(f"image leaf shape must be (H, W, C), all > 0, got {shape!r}")
            object.__setattr__(self, "shape", shape)
        if "ndim" in spec.fields and (type(self.ndim) is not int or not 1 <= self.ndim <= MAX_NDIM):
            raise InvalidSchemaError(f"{kind} leaf needs ndim in [1, {MAX_NDIM}], got {self.ndim!r}")
        if "format" in spec.fields:
            f = self.format
            if not isinstance(f, str) or not 0 < len(f) <= 32 or not set(f) <= IMAGE_FORMAT_CHARS:
                raise InvalidSchemaError(f"{kind} leaf needs a short lowercase format tag, got {f!r}")
        if "item" in spec.fields and self.item not in LIST_ITEMS:
            raise InvalidSchemaError(f"{kind} leaf: item must be one of {sorted(LIST_ITEMS)}, got {self.item!r}")
        if type(self.optional) is not bool:
            raise InvalidSchemaError(f"optional must be true or false, got {self.optional!r}")
        if self.optional and kind == "none":
            raise InvalidSchemaError("a none leaf is always None: it cannot be optional")

    @property
    def spec(self) -> Any:
        """This leaf's row of the kinds table (``tbl_format.kinds.Kind``)."""
        return KINDS[self.kind]

    @property
    def minor(self) -> int:
        """The format minor version that introduced what this leaf uses."""
        return max(KINDS[self.kind].minor, 1 if self.optional else 0)

    @property
    def fixed_size(self) -> bool:
        """True when every row has the same number of bytes (stored as a contiguous column)."""
        return KINDS[self.kind].fixed

    @property
    def row_format(self) -> str:
        """struct / memoryview format character of one element."""
        spec = KINDS[self.kind]
        if spec.scalar is not None:
            return spec.scalar
        if self.kind == "var_list" and self.item != "str":
            return KINDS[self.item].scalar
        if self.dtype is None:
            raise InvalidSchemaError(f"{self.kind} leaf has no element format")
        return DTYPES[self.dtype][0]

    @property
    def itemsize(self) -> int:
        """Bytes of one element (int/float 8, bool 1, arrays their dtype's size, var_list its item's size)."""
        spec = KINDS[self.kind]
        if spec.scalar is not None:
            return 1 if self.kind == "bool" else 8
        if self.kind == "var_list" and self.item != "str":
            return LIST_ITEMS[self.item][1]
        if self.dtype is None:
            raise InvalidSchemaError(f"{self.kind} leaf has no item size")
        return DTYPES[self.dtype][1]

    @property
    def row_bytes(self) -> int:
        """Bytes per row of a fixed-size leaf."""
        if not self.fixed_size:
            raise InvalidSchemaError(f"{self.kind} leaves have no fixed row size")
        if self.kind == "none":
            return 0
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
        if self.item is not None:
            out["item"] = self.item
        if self.optional:  # written only when set: 1.0 leaves keep their JSON, hence their fingerprints
            out["optional"] = True
        return out

    @classmethod
    def from_json(cls, obj: Any) -> Leaf:
        if not isinstance(obj, dict) or not set(obj) <= {"kind", *_LEAF_FIELDS, "optional"}:
            raise InvalidSchemaError(f"leaf must be an object with kind/dtype/shape/ndim/format/item/optional, "
                                     f"got {obj!r:.200}")
        shape = obj.get("shape")
        if shape is not None:
            shape = _check_shape(shape, "leaf")
        try:
            return cls(obj.get("kind"), obj.get("dtype"), shape, obj.get("ndim"), obj.get("format"), obj.get("item"),
                       obj.get("optional", False))
        except TypeError as exc:  # unhashable values in the JSON (lists where strings belong)
            raise InvalidSchemaError(f"invalid leaf {obj!r:.200}: {exc}") from None

    def __str__(self) -> str:
        parts = [self.kind]
        if self.dtype and self.kind != "image":
            parts.append(self.dtype)
        if self.shape is not None:
            parts.append("x".join(map(str, self.shape)) or "()")
        if self.ndim is not None:
            parts.append(f"ndim={self.ndim}")
        if self.format:
            parts.append(self.format)
        if self.item:
            parts.append(f"of {self.item}")
        if self.optional:
            parts.append("optional")
        return " ".join(parts)


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
    def minor(self) -> int:
        """The lowest format minor version (of major 1) that has every leaf kind and field this schema uses."""
        return max((leaf.minor for leaf in self.leaves.values()), default=0)

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




# ---- inference --------------------------------------------------------------------------------------------


def infer_leaf(value: Any, path: str) -> Leaf:
    """The Leaf kind of one value; see infer_schema."""
    if value is None:
        return Leaf("none")
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


def _infer_node(node: Any, path: str, depth: int) -> Any:
    if depth > 64:
        raise InvalidSchemaError("sample nesting is deeper than 64 levels")
    if isinstance(node, dict):
        return {_check_key(k, path): _infer_node(v, _join(path, k), depth + 1) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        items = [_infer_node(v, _join(path, str(i)), depth + 1) for i, v in enumerate(node)]
        return items if isinstance(node, list) else tuple(items)
    return infer_leaf(node, path)


def infer_schema(sample: Any) -> Schema:
    """Infer a Schema from one sample.

    None maps to a ``none`` leaf, Python/numpy scalars to int/float/bool,
    ``str`` to str, bytes-like to bytes, numpy arrays and torch tensors to
    fixed-shape ``array`` leaves; dicts, lists and tuples to the same
    structure. The writer widens this schema as later samples differ (see
    ``widen``). Raw images and encoded images cannot be told apart from
    other arrays and bytes: pass an explicit Schema with ``image`` /
    ``encoded_image`` leaves for those. Keys containing ``/`` are rejected.
    """
    return Schema(_infer_node(sample, "", 0))


# ---- widening ---------------------------------------------------------------------------------------------


def _list_item(node: Any) -> tuple[str, bool] | None:
    """(item kind, optional) if node can become a var_list: "" for an empty list node; None if it cannot."""
    if isinstance(node, Leaf):
        if node.kind == "var_list":
            return node.item or "", node.optional
        return None
    if not isinstance(node, list):
        return None
    kinds = set()
    for sub in node:
        if not isinstance(sub, Leaf) or sub.optional or sub.kind not in LIST_ITEMS:
            return None
        kinds.add(sub.kind)
    if len(kinds) > 1:
        return None
    return (kinds.pop() if kinds else ""), False


def _widen_leaves(a: Leaf, b: Leaf) -> Leaf | None:
    if a == b:
        return a
    if a.kind == "none":
        return replace(b, optional=True) if b.kind != "none" else a
    if b.kind == "none":
        return replace(a, optional=True)
    optional = a.optional or b.optional
    a, b = replace(a, optional=False), replace(b, optional=False)
    if a == b:
        return replace(a, optional=optional)
    if a.kind in ("array", "var_array") and b.kind in ("array", "var_array") and a.dtype == b.dtype:
        ndim_a = len(a.shape) if a.shape is not None else a.ndim
        ndim_b = len(b.shape) if b.shape is not None else b.ndim
        if ndim_a == ndim_b and ndim_a:
            return Leaf("var_array", dtype=a.dtype, ndim=ndim_a, optional=optional)
    return None


def _widen(a: Any, b: Any) -> Any:
    """The narrowest node that stores everything a and b store, or None if there is none."""
    if isinstance(a, Leaf) and isinstance(b, Leaf):
        return _widen_leaves(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return None
        out = {}
        for k in a:
            w = _widen(a[k], b[k])
            if w is None:
                return None
            out[k] = w
        return out
    if isinstance(a, tuple) and isinstance(b, tuple):
        if len(a) != len(b):
            return None
        items = [_widen(x, y) for x, y in zip(a, b, strict=True)]
        return None if any(w is None for w in items) else tuple(items)
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        items = [_widen(x, y) for x, y in zip(a, b, strict=True)]
        if all(w is not None for w in items):
            return items
    # A list whose length varies (or a var_list, or None) becomes a var_list of its one item kind.
    none_a = isinstance(a, Leaf) and a.kind == "none"
    none_b = isinstance(b, Leaf) and b.kind == "none"
    la = ("", True) if none_a else _list_item(a)
    lb = ("", True) if none_b else _list_item(b)
    if la is None or lb is None or (none_a and none_b):
        return None
    if la[0] and lb[0] and la[0] != lb[0]:
        return None
    item = la[0] or lb[0]
    optional = la[1] or lb[1]
    if not item:
        return None if optional else []  # both empty lists (a None and an empty list: item still unknown)
    return Leaf("var_list", item=item, optional=optional)


def widen(schema: Schema, other: Schema) -> Schema | None:
    """The narrowest schema that stores every sample of both, or None when they cannot share one.

    Leaves keep their kind; they widen only where a writer can tell what a
    demanding reader expects: a fixed-shape array whose shape varies becomes
    a ``var_array`` of the same dtype and ndim; a list whose length varies,
    all of whose items are int, float, bool or str of one kind, becomes a
    ``var_list``; a leaf that is None in some samples becomes ``optional``
    (a ``none`` leaf takes the kind of the first value). Anything else (an
    int where a str was, other dict keys, a tuple of another length, another
    dtype) cannot be widened.
    """
    tree = _widen(schema.tree, other.tree)
    if tree is None:
        return None
    out = Schema(tree)
    return schema if out == schema else out
