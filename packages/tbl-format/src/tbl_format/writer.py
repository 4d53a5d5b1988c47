"""Streaming, crash-safe writer of .tbl files and sharded dataset directories.

Memory stays bounded: every region (a fixed column, a variable column's
offsets, heap and shapes) is spilled to its own temp file in a hidden
directory next to the destination while samples arrive (``columns.py``).
``close()`` lays the regions out, writes the header and copies each spill
file into place with ``os.copy_file_range`` (kernel-side copy), fsyncs,
renames atomically and fsyncs the directory.

Schema inference does not freeze the first sample: when a later sample does
not fit, the schema is widened (``schema.widen``: a shape that varies makes a
``var_array``, a list length that varies a ``var_list``, a None an
``optional`` leaf) and the columns written so far are promoted in place
where their bytes already fit (``Column.promoted``); only a change of
structure (a list of fixed length becoming a var_list) or a shard finished
before the change rewrites what was written, once, from the finished bytes.

Temp names start with ``.`` and contain ``.tbl-tmp-``; they never end in
``.tbl`` and a directory is a dataset only once it has a manifest, so a
killed writer's leftovers are never mistaken for a dataset.
"""

from __future__ import annotations

import itertools
import json
import operator
import os
import secrets
import shutil
import struct
import sys
from array import array
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .codec import Compression, check_compression
from .columns import TABLES, Bytes, Column, Spill, copy_into, make_column, mismatch, promotable
from .crc import crc32
from .destination import check_destination
from .errors import InvalidSchemaError, MetadataError, SchemaMismatchError
from .fsutil import ensure_space, fsync_dir
from .layout import (
    BLOCK_SIZE,
    FORMAT_VERSION,
    HEADER_CAP,
    MAGIC,
    PREAMBLE,
    PREAMBLE_CRC_SPAN,
    PREAMBLE_SIZE,
    align_up,
)
from .manifest import publish_manifest
from .reader import TblFile
from .schema import LIST_ITEMS, Leaf, Schema, infer_schema, widen

__all__ = ["METADATA_DEPTH", "FileWriter", "Writer", "check_metadata", "write"]

_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
# Rows re-encoded per read when a finished file is rewritten with a wider schema.
_REWRITE_ROWS = 4096
#: Deepest nesting of metadata containers (the top-level dict is level 1).
METADATA_DEPTH = 64
# Header bytes besides metadata and schema: the fixed fields, and per leaf its column description.
_HEADER_MARGIN = 4096
_COLUMN_BYTES = 512
# Free space is checked against the bytes spilled so far every this many rows (and before each file is assembled).
_SPACE_CHECK_ROWS = 1024
# Rows ``write`` encodes column by column at a time (FileWriter.append_chunk)
_CHUNK_ROWS = 2048


def _types(values: list[Any]) -> set[type]:
    return set(map(type, values))


class FileWriter:
    """Writes one .tbl file into a temp file next to ``final``; ``finish()`` returns the temp path."""

    def __init__(self, final: Path, schema: Schema, metadata: dict[str, Any], compression: Compression | None,
                 file_id: str | None = None) -> None:
        self.final = final
        self.schema = schema
        self.metadata = metadata
        self.compression = compression
        self.file_id = file_id
        self.tmp = final.parent / f".{final.name}.tbl-tmp-{secrets.token_hex(4)}"
        self.spill_dir = Path(f"{self.tmp}.d")
        self._spill_names = itertools.count()
        self.rows = 0
        self.columns: list[Column] = []
        # Whatever ends construction early (a Ctrl-C included) removes what it made: the caller has no
        # writer to abort yet.
        try:
            self.spill_dir.mkdir()
            for path, leaf in schema.leaves.items():
                self.columns.append(make_column(path, leaf, self._new_spill, compression))
            self.append_fast = self._compile_fast()
            self.append_chunk = self._compile_chunk()
        except BaseException:
            self.abort()
            raise

    def _new_spill(self, whole_crc: bool) -> Spill:
        return Spill(self.spill_dir / str(next(self._spill_names)), whole_crc)

    def promote(self, schema: Schema) -> FileWriter:
        """This file's rows under the wider ``schema`` (see ``schema.widen``); returns the writer to go on with.

        Promotes the columns in place when every one of them can be (``Column.promoted``); otherwise
        finishes this file and rewrites its rows into a new FileWriter.
        """
        old = dict(zip(self.schema.leaves, self.columns, strict=True))
        if set(schema.leaves) == set(old) and all(promotable(old[p].leaf, leaf) for p, leaf in schema.leaves.items()):
            self.columns = [old[p] if old[p].leaf == leaf else old[p].promoted(leaf, self.rows)
                            for p, leaf in schema.leaves.items()]
            self.schema = schema
            self.append_fast = self._compile_fast()
            self.append_chunk = self._compile_chunk()
            return self
        tmp, _, _ = self.finish()
        try:
            return rewrite(tmp, self.final, schema, self.metadata, self.compression, self.file_id)
        finally:
            tmp.unlink(missing_ok=True)

    def _compile_fast(self) -> Any:
        """Generate append_fast(sample, idx) -> bool for this schema.

        It walks the exact container types (dict / list / tuple, not subclasses),
        encodes the common Python scalar types inline and appends; it returns
        False without appending anything when any check or encoding fails, and
        the caller then takes the general path, which names the leaf at fault.
        """
        np = sys.modules.get("numpy")  # only if the caller already uses numpy: never imported here
        ns: dict[str, Any] = {"PQ": _I64.pack, "PD": _F64.pack, "dict": dict, "list": list, "tuple": tuple,
                              "NDARRAY": np.ndarray if np is not None else None}
        lines: list[str] = []
        leaves: list[str] = []
        counter = [0]

        def walk(node: Any, var: str) -> None:
            if isinstance(node, Leaf):
                leaves.append(var)
                return
            typ = "dict" if isinstance(node, dict) else "list" if isinstance(node, list) else "tuple"
            lines.append(f"if {var}.__class__ is not {typ} or len({var}) != {len(node)}: return False")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, sub in items:
                counter[0] += 1
                child = f"x{counter[0]}"
                lines.append(f"{child} = {var}[{key!r}]")
                walk(sub, child)

        walk(self.schema.tree, "sample")
        appends = []
        for k, (var, col) in enumerate(zip(leaves, self.columns, strict=True)):
            # The common Python types are encoded inline; anything else (None, numpy scalars, a misfit) calls E.
            ns[f"E{k}"] = col.encode
            kind = col.leaf.kind
            if kind == "none":
                kind = "-"  # no fast form: E checks for None
            if kind == "int":
                lines.append(f"e{k} = PQ({var}) if {var}.__class__ is int else E{k}({var}, idx)")
            elif kind == "float":
                lines.append(f"e{k} = PD({var}) if {var}.__class__ is float else E{k}({var}, idx)")
            elif kind == "bool":
                lines.append(f"e{k} = (b'\\x01' if {var} else b'\\x00') if {var}.__class__ is bool else E{k}({var}, idx)")
            elif kind == "str":
                lines.append(f"e{k} = {var}.encode() if {var}.__class__ is str else E{k}({var}, idx)")
            elif kind == "var_list" and col.leaf.item == "int" and sys.byteorder == "little":
                # Packed as encode_list packs them; a list holding anything but plain ints takes E's checks.
                ns["LIST"], ns["INTS"], ns["ARRAY"] = list, frozenset((int,)), array
                lines.append(
                    f"e{k} = (ARRAY('q', {var}).tobytes(), len({var})) if {var}.__class__ is LIST "
                    f"and {{*map(type, {var})}} <= INTS else E{k}({var}, idx)"
                )
            elif kind in ("array", "image") and np is not None:
                ns[f"DT{k}"], ns[f"SH{k}"] = np.dtype(col.leaf.dtype), col.leaf.shape
                lines.append(
                    f"e{k} = {var}.tobytes() if {var}.__class__ is NDARRAY and {var}.dtype == DT{k} "
                    f"and {var}.shape == SH{k} else E{k}({var}, idx)"
                )
            else:
                lines.append(f"e{k} = E{k}({var}, idx)")
            appends.append(col.append_code(ns, k, f"e{k}"))
        body = "\n        ".join(lines) or "pass"
        tail = "\n    ".join(appends) or "pass"
        src = f"""
def append_fast(sample, idx):
    try:
        {body}
    except Exception:
        return False
    {tail}
    fw.rows += 1
    return True
"""
        ns["fw"] = self
        exec(compile(src, "<tbl row encoder>", "exec"), ns)
        return ns["append_fast"]

    def _compile_chunk(self) -> Any:
        """Generate append_chunk(samples) -> bool for this schema, or None when a leaf has no column-wise form.

        The rows' leaf values are taken leaf by leaf (one list per leaf), checked by the set of their types
        and encoded with one call per leaf (``array(...).tobytes()``, ``b"".join``), then appended to the
        columns at once (``Column.append_rows``): the bytes ``append_fast`` of each row would write, without
        its per-row Python work. Nothing is appended unless every row passes; the caller then writes the
        rows one by one, which names the sample and leaf at fault.
        """
        np = sys.modules.get("numpy")
        if sys.byteorder != "little":  # array('q' / 'd') packs in the machine's order; the format is little-endian
            return None
        ns: dict[str, Any] = {"ARRAY": array, "CHAIN": itertools.chain.from_iterable, "TYPES": _types,
                              "DICT": frozenset((dict,)), "LIST": frozenset((list,)), "TUPLE": frozenset((tuple,)),
                              "LEN": len, "GET_DTYPE": operator.attrgetter("dtype"),
                              "GET_SHAPE": operator.attrgetter("shape")}
        checks: list[str] = []  # every container node, as a list over the rows: its type and length
        paths: list[str] = []  # every leaf: the name of its list over the rows
        counter = itertools.count()

        def walk(node: Any, var: str) -> None:
            if isinstance(node, Leaf):
                paths.append(var)
                return
            typ = "DICT" if isinstance(node, dict) else "LIST" if isinstance(node, list) else "TUPLE"
            checks.append(f"if not TYPES({var}) <= {typ} or {{*map(LEN, {var})}} != {{{len(node)}}}: return False")
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for key, sub in items:
                child = f"n{next(counter)}"
                ns[f"G{child}"] = operator.itemgetter(key)
                checks.append(f"{child} = [*map(G{child}, {var})]")
                walk(sub, child)

        walk(self.schema.tree, "samples")
        body: list[str] = []
        appends: list[str] = []
        for k, (var, col) in enumerate(zip(paths, self.columns, strict=True)):
            leaf, c = col.leaf, f"c{k}"
            if col.present is not None:
                return None
            body.append(f"{c} = {var}")
            ns[f"COL{k}"] = col
            if leaf.kind in ("int", "float", "bool"):
                typ, code = {"int": (int, f"ARRAY('q', {c}).tobytes()"), "float": (float, f"ARRAY('d', {c}).tobytes()"),
                             "bool": (bool, f"bytes({c})")}[leaf.kind]
                ns[f"T{k}"] = frozenset((typ,))
                body += [f"if not TYPES({c}) <= T{k}: return False", f"b{k} = {code}"]
                appends.append(f"COL{k}.data.write(b{k})")
            elif leaf.kind in ("array", "image") and np is not None:
                ns[f"T{k}"], ns[f"DT{k}"], ns[f"SH{k}"] = frozenset((np.ndarray,)), np.dtype(leaf.dtype), leaf.shape
                body += [f"if not TYPES({c}) <= T{k}: return False",
                         f"if {{*map(GET_DTYPE, {c})}} != {{DT{k}}} or {{*map(GET_SHAPE, {c})}} != {{SH{k}}}: return False",
                         f"b{k} = b''.join([v.tobytes() for v in {c}])"]
                appends.append(f"COL{k}.data.write(b{k})")
            elif leaf.kind == "str" and col.shapes is None:
                ns[f"T{k}"] = frozenset((str,))
                body += [f"if not TYPES({c}) <= T{k}: return False", f"{c} = [v.encode() for v in {c}]",
                         f"b{k} = b''.join({c})"]
                appends.append(f"COL{k}.append_rows([*map(len, {c})], b{k})")
            elif leaf.kind == "var_list" and leaf.item == "int" and col.items is None:
                ns[f"T{k}"], ns["INTS"] = frozenset((list,)), frozenset((int,))
                body += [f"if not TYPES({c}) <= T{k}: return False", f"f{k} = [*CHAIN({c})]",
                         f"if not TYPES(f{k}) <= INTS: return False", f"b{k} = ARRAY('q', f{k}).tobytes()"]
                appends.append(f"COL{k}.append_rows([*map(len, {c})], b{k})")
            else:
                return None
        src = f"""
def append_chunk(samples):
    try:
        {chr(10).join("        " + line for line in checks + body).lstrip()}
    except Exception:
        return False
    {chr(10).join("    " + line for line in appends).lstrip()}
    fw.rows += len(samples)
    return True
"""
        ns["fw"] = self
        exec(compile(src, "<tbl chunk encoder>", "exec"), ns)
        return ns["append_chunk"]

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.columns)

    def append(self, encoded: list[Any]) -> None:
        for col, e in zip(self.columns, encoded, strict=True):
            col.append(e)
        self.rows += 1

    def finish(self) -> tuple[Path, int, int]:
        """Assemble, fsync and close the temp file; returns (temp path, header CRC-32, file size)."""
        parts = []
        for col in self.columns:
            extra, regions = col.finish()
            parts.append((col.path, extra, regions))
        all_regions = [r for _, _, regions in parts for _, r in regions]
        nblocks = sum(len(r.blocks) for r in all_regions)
        crc_table = array("I")
        for r in all_regions:
            crc_table.extend(r.blocks)
        table = Bytes(crc_table.tobytes() if nblocks else b"")
        # Region offsets depend on the header length, which depends on the offsets: iterate to the fixed point.
        data_start = align_up(PREAMBLE_SIZE)
        while True:
            header, places, file_size = self._header(parts, table, data_start)
            need = align_up(PREAMBLE_SIZE + len(header))
            if need <= data_start:
                break
            data_start = need
        if len(header) > HEADER_CAP:
            raise InvalidSchemaError(f"header of {len(header)} bytes exceeds the {HEADER_CAP}-byte cap")
        # The lowest minor that has what the schema uses: a file of 1.0 features stays readable by 1.0 readers.
        version = (FORMAT_VERSION[0], self.schema.minor)
        head = PREAMBLE.pack(MAGIC, *version, len(header), file_size, 0, 0)[:PREAMBLE_CRC_SPAN]
        crc = crc32(header, crc32(head))
        preamble = PREAMBLE.pack(MAGIC, *version, len(header), file_size, crc, 0)
        # The spill files still hold every byte until the file is assembled: it needs its whole size again.
        ensure_space(self.tmp.parent, self._assembly_space(file_size), f"assembling {self.final.name}")
        fd = self._open_output()
        try:
            os.pwrite(fd, preamble + header, 0)
            for src, off in places:
                self._copy(src, fd, off)
            os.ftruncate(fd, file_size)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._drop_spills()
        return self.tmp, crc, file_size

    # Assembly hooks (PlacedWriter's file writer overrides them: its temp file exists and holds a region already).
    def _open_output(self) -> int:
        return os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    def _assembly_space(self, file_size: int) -> int:
        return file_size

    def _copy(self, src: Any, fd: int, off: int) -> None:
        copy_into(src, fd, off)

    def _header(self, parts: list[Any], table: Any, data_start: int) -> tuple[bytes, list[Any], int]:
        pos = data_start
        block = 0
        places = []
        columns = []
        end = PREAMBLE_SIZE
        for path, extra, regions in parts:
            desc: dict[str, Any] = {"path": path, "regions": {}}
            desc.update(extra)
            for name, r in regions:
                region = {"offset": pos, "size": r.size, "first_block": block}
                if name in TABLES:
                    region["crc32"] = r.crc
                desc["regions"][name] = region
                places.append((r, pos))
                end = pos + r.size
                block += len(r.blocks)
                pos = align_up(end)
            columns.append(desc)
        places.append((table, pos))
        checksums = {"offset": pos, "size": table.size, "crc32": table.crc}
        end = max(end, pos + table.size)
        header = {
            "rows": self.rows,
            "block_size": BLOCK_SIZE,
            "schema": self.schema.to_json(),
            "metadata": self.metadata,
            "columns": columns,
            "checksums": checksums,
        }
        if self.file_id is not None:
            header["file_id"] = self.file_id
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")
        return text, places, max(end, data_start)

    def _drop_spills(self) -> None:
        for col in self.columns:
            col.close()
        shutil.rmtree(self.spill_dir, ignore_errors=True)

    def abort(self) -> None:
        self._drop_spills()
        try:
            self.tmp.unlink()
        except FileNotFoundError:
            pass


def rewrite(src: Path, final: Path, schema: Schema, metadata: dict[str, Any], compression: Compression | None,
            file_id: str | None) -> FileWriter:
    """A FileWriter for ``final`` holding every row of the finished file ``src``, encoded under ``schema``.

    Rows read back as the values they were written from, so a wider schema takes them unchanged.
    """
    fw = FileWriter(final, schema, metadata, compression, file_id)
    try:
        f = TblFile(src)
        try:
            for a in range(0, f.rows, _REWRITE_ROWS):
                for k, sample in enumerate(f.read_range(a, min(f.rows, a + _REWRITE_ROWS)), start=a):
                    fw.append(encode_sample(fw, sample, k))
        finally:
            f.close()
    except BaseException:
        fw.abort()
        raise
    return fw


def flatten(node: Any, value: Any, path: str, out: list[Any], idx: int) -> None:
    """The leaf values of ``value`` in schema order; SchemaMismatchError where its structure differs."""
    if isinstance(node, Leaf):
        out.append(value)
    elif isinstance(node, dict):
        if not isinstance(value, Mapping):
            raise mismatch(idx, path, f"expected a dict, got {type(value).__name__}")
        if len(value) != len(node) or any(k not in value for k in node):
            missing = [k for k in node if k not in value]
            extra = [k for k in value if k not in node]
            raise mismatch(idx, path, f"dict keys differ: missing {missing}, unexpected {extra}")
        for k, sub in node.items():
            flatten(sub, value[k], f"{path}/{k}" if path else k, out, idx)
    else:
        want = list if isinstance(node, list) else tuple
        if not isinstance(value, want):
            raise mismatch(idx, path, f"expected a {want.__name__}, got {type(value).__name__}")
        if len(value) != len(node):
            raise mismatch(idx, path, f"expected {len(node)} elements, got {len(value)}")
        for i, (sub, v) in enumerate(zip(node, value, strict=True)):
            flatten(sub, v, f"{path}/{i}" if path else str(i), out, idx)


def encode_sample(fw: FileWriter, sample: Any, idx: int) -> list[Any]:
    """Every leaf of ``sample`` encoded for ``fw``'s columns (the general path: names the leaf at fault)."""
    flat: list[Any] = []
    flatten(fw.schema.tree, sample, "", flat, idx)
    return [col.encode(v, idx) for col, v in zip(fw.columns, flat, strict=True)]


def with_variable(schema: Schema, variable: Iterable[str]) -> Schema:
    """schema with the named leaves made variable-size: array leaves become var_array leaves of the same dtype
    and ndim, lists of int, float, bool or str items (all of one kind) become var_list leaves."""
    names = list(variable)
    wanted = set(names)
    found: set[str] = set()

    def walk(node: Any, path: str) -> Any:
        if path in wanted:
            found.add(path)
            if isinstance(node, list):
                kinds = {sub.kind for sub in node if isinstance(sub, Leaf) and not sub.optional}
                if len(kinds) == 1 and kinds <= set(LIST_ITEMS) and all(isinstance(sub, Leaf) for sub in node):
                    return Leaf("var_list", item=kinds.pop())
                raise ValueError(f"leaf {path!r}: only array leaves and lists whose items are all int, float, bool "
                                 "or all str can be variable")
            if not isinstance(node, Leaf) or node.kind not in ("array", "var_array"):
                kind = node.kind if isinstance(node, Leaf) else type(node).__name__
                raise ValueError(f"leaf {path!r} is {kind}; only array leaves and lists of scalars can be variable")
            if node.kind == "var_array":
                return node
            if not node.shape:
                raise ValueError(f"leaf {path!r} is a 0-d array; variable-shape arrays need ndim >= 1")
            return Leaf("var_array", dtype=node.dtype, ndim=len(node.shape), optional=node.optional)
        if isinstance(node, Leaf):
            return node
        if isinstance(node, dict):
            return {k: walk(v, f"{path}/{k}" if path else k) for k, v in node.items()}
        items = [walk(v, f"{path}/{i}" if path else str(i)) for i, v in enumerate(node)]
        return items if isinstance(node, list) else tuple(items)

    tree = walk(schema.tree, "")
    unknown = [p for p in names if p not in found]
    if unknown:
        raise KeyError(f"variable names leaves {unknown} that the first sample does not have; "
                       f"it has {list(schema.leaves)}")
    return Schema(tree)


def check_metadata(metadata: Any) -> dict[str, Any]:
    """``metadata`` as the JSON object the header will hold; MetadataError unless it is stored exactly.

    Keys must be str at every level (JSON would turn ``1`` into ``"1"``, so ``{1: "a", "1": "b"}`` would
    lose a key), nesting at most METADATA_DEPTH levels (checked without recursion), values JSON (tuples
    become lists; no NaN / inf), and the JSON text at most the header cap.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}")
    stack: list[tuple[Any, str, int]] = [(metadata, "metadata", 1)]
    while stack:
        node, where, depth = stack.pop()
        if depth > METADATA_DEPTH:
            raise MetadataError(f"{where}: metadata nests deeper than {METADATA_DEPTH} levels")
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    raise MetadataError(f"{where}: key {k!r} is {type(k).__name__}; metadata keys must be str "
                                        "(JSON would turn it into a string)")
                if isinstance(v, (dict, list, tuple)):
                    stack.append((v, f"{where}[{k!r}]", depth + 1))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                if isinstance(v, (dict, list, tuple)):
                    stack.append((v, f"{where}[{i}]", depth + 1))
    try:
        text = json.dumps(metadata, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise MetadataError(f"metadata must be JSON-serializable (no NaN/inf): {exc}") from None
    if len(text.encode("utf-8")) > HEADER_CAP - _HEADER_MARGIN:
        raise MetadataError(f"metadata of {len(text.encode('utf-8')):,} bytes of JSON does not fit the "
                            f"{HEADER_CAP:,}-byte header cap")
    return json.loads(text)


def check_header_room(schema: Schema, metadata: dict[str, Any]) -> None:
    """MetadataError when the schema and metadata alone would make a header over the cap (before any row)."""
    leaves = schema.leaves
    estimate = (len(json.dumps(schema.to_json(), separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
                + len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
                + sum(_COLUMN_BYTES + 2 * len(p.encode("utf-8")) for p in leaves) + _HEADER_MARGIN)
    if estimate > HEADER_CAP:
        raise MetadataError(f"a header of this schema ({len(leaves)} leaves) and metadata needs about "
                            f"{estimate:,} bytes, over the {HEADER_CAP:,}-byte cap")


class Writer:
    """Streaming writer of one .tbl file, or of a sharded dataset directory when shard_rows/shard_bytes is set.

    ``write(sample)`` checks the sample against the schema and raises
    SchemaMismatchError naming the sample index and leaf path; the writer
    stays usable after such an error. Without ``schema`` the schema is
    inferred from the first sample (the leaves named in ``variable`` made
    variable-size from the start) and widened when a later sample differs in
    a way ``schema.widen`` allows (a shape or list length that varies, a
    None): the written schema states the result. A given ``schema`` is kept
    as it is: a sample that does not fit it is an error.
    ``close()`` publishes atomically and returns the destination; ``abort()``
    removes everything this writer created. As a context manager it closes on
    success and aborts on exception.

    The destination is checked by ``check_destination`` at construction and
    again before publishing: an existing file or dataset is replaced only with
    ``overwrite=True``; a link, FIFO, device or socket is never replaced
    (``DestinationError``). Replacing a dataset directory removes only the old
    shards the directory itself holds as TBL files; the old manifest's other
    entries stay and are listed in ``kept`` after ``close()``.
    ``compression`` (``"lz4"`` or ``"zstd"``) compresses the heaps of
    variable-size leaves in 64 KiB blocks (SPEC.md, "Columns");
    ``compression_level`` is zstd's level (default 3; negative is faster).
    ``file_id`` is stored in each file's header (SPEC.md) so that files of
    equal rows have distinct header checksums; the shards of a sharded write
    always get one (their index, after ``file_id + "/"`` when given).
    Metadata is checked at construction (``MetadataError``: non-str keys,
    nesting, size), free disk space while rows arrive and before each file is
    assembled (``InsufficientSpaceError``: assembling needs the file's size
    again while its temp columns still exist).
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        schema: Schema | Any | None = None,
        *,
        variable: Iterable[str] = (),
        metadata: dict[str, Any] | None = None,
        compression: str | None = None,
        compression_level: int | None = None,
        shard_rows: int | None = None,
        shard_bytes: int | None = None,
        overwrite: bool = False,
        file_id: str | None = None,
    ) -> None:
        if isinstance(variable, str):
            raise TypeError("variable must be a list of leaf paths, not a single string")
        self.variable = list(variable)
        if self.variable and schema is not None:
            raise ValueError("pass either schema or variable: variable only adjusts an inferred schema")
        check_compression(compression, compression_level)
        for name, v in (("shard_rows", shard_rows), ("shard_bytes", shard_bytes)):
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if file_id is not None and not isinstance(file_id, str):
            raise TypeError(f"file_id must be a str, got {type(file_id).__name__}")
        self.dst = Path(dst)
        self.schema = schema if isinstance(schema, Schema) or schema is None else Schema(schema)
        self._infer = schema is None  # only an inferred schema widens
        self.metadata = check_metadata(metadata)
        if self.schema is not None:
            check_header_room(self.schema, self.metadata)
        self.overwrite = bool(overwrite)
        self.file_id = file_id
        #: After close(): files the replaced dataset's manifest listed that were left in place (not provably its own).
        self.kept: list[Path] = []
        self.compression = compression
        self.compression_level = compression_level
        # What each FileWriter compresses heaps with: the codec and its level (None: the codec's default).
        self._codec: Compression | None = None if compression is None else (compression, compression_level)
        self.sharded = shard_rows is not None or shard_bytes is not None
        self.shard_rows = shard_rows
        self.shard_bytes = shard_bytes
        self.rows = 0
        self._file: FileWriter | None = None
        self._shards: list[dict[str, Any]] = []
        self._pending: list[Path] = []  # finished shard temp files, renamed at close()
        self._token = secrets.token_hex(4)
        self._created_dir = False
        self._done = False
        self._next_space_check = _SPACE_CHECK_ROWS
        check_destination(self.dst, directory=self.sharded, overwrite=self.overwrite)
        if self.sharded and not os.path.lexists(self.dst):
            self.dst.mkdir(parents=True)
            self._created_dir = True

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _open_file(self) -> FileWriter:
        if self.sharded:
            n = len(self._shards)
            final = self.dst / f"shard-{self._token}-{n:05d}.tbl"
            file_id = f"{self.file_id}/{n}" if self.file_id is not None else str(n)
            return FileWriter(final, self.schema, self.metadata, self._codec, file_id)
        return FileWriter(self.dst, self.schema, self.metadata, self._codec, self.file_id)

    def write(self, sample: Any) -> None:
        if self._done:
            raise RuntimeError("write() on a closed or aborted Writer")
        if self.schema is None:
            schema = with_variable(infer_schema(sample), self.variable) if self.variable else infer_schema(sample)
            check_header_room(schema, self.metadata)
            self.schema = schema
        if self._file is None:
            self._file = self._open_file()
        fw = self._file
        if not fw.append_fast(sample, self.rows):
            # The general path: checks everything again and raises SchemaMismatchError naming index and leaf.
            try:
                encoded = encode_sample(fw, sample, self.rows)
            except SchemaMismatchError:
                wider = self._wider(sample)
                if wider is None:
                    raise
                self._promote(wider)
                fw = self._file
                encoded = encode_sample(fw, sample, self.rows)
            fw.append(encoded)
        self.rows += 1
        self._after_rows(fw)

    def _after_rows(self, fw: FileWriter) -> None:
        """After rows were written to ``fw``: the periodic free-space check, and a shard that is full published."""
        if self.rows >= self._next_space_check:
            self._next_space_check = self.rows + _SPACE_CHECK_ROWS
            # Assembling the file needs its bytes once more while the temp columns hold them: fail now, not then.
            ensure_space(self.dst.parent if not self.sharded else self.dst, fw.nbytes,
                         f"writing {fw.final.name} (so far {fw.rows:,} rows: temp columns, then the file)")
        if self.sharded and (
            (self.shard_rows is not None and fw.rows >= self.shard_rows)
            or (self.shard_bytes is not None and fw.nbytes >= self.shard_bytes)
        ):
            self._publish_shard()

    def write_all(self, samples: Iterable[Any]) -> None:
        """``write`` each of ``samples``, in order: the same file, faster for many small rows, which are encoded
        leaf by leaf up to 2,048 rows at a time where the schema allows (rows that need the per-row checks,
        widening or a byte-sized shard cut are written one by one)."""
        it = iter(samples)
        while True:
            fw = self._file
            size = _CHUNK_ROWS
            if self.shard_rows is not None:  # a chunk never crosses a shard's last row
                size = min(size, self.shard_rows - (fw.rows if fw is not None else 0))
            chunk = list(itertools.islice(it, size))
            if not chunk:
                return
            self._write_chunk(chunk)

    def _write_chunk(self, chunk: list[Any]) -> None:
        if self._done:
            raise RuntimeError("write() on a closed or aborted Writer")
        if self.schema is not None and self._file is None:
            self._file = self._open_file()
        fw = self._file
        # A byte-sized shard is cut after the row that fills it: rows one by one find that row.
        if fw is None or self.shard_bytes is not None or fw.append_chunk is None or not fw.append_chunk(chunk):
            for sample in chunk:
                self.write(sample)
            return
        self.rows += len(chunk)
        self._after_rows(fw)

    def _wider(self, sample: Any) -> Schema | None:
        """The widened schema that also stores ``sample``, or None (a given schema, or a real mismatch)."""
        if not self._infer:
            return None
        try:
            other = infer_schema(sample)
        except InvalidSchemaError:
            return None
        return widen(self.schema, other)

    def _promote(self, schema: Schema) -> None:
        """Go on under the wider ``schema``: promote the open file, rewrite the shards finished before it."""
        self.schema = schema
        for n, (tmp, entry) in enumerate(zip(self._pending, self._shards, strict=True)):
            file_id = f"{self.file_id}/{n}" if self.file_id is not None else str(n)
            fw = rewrite(tmp, self.dst / entry["file"], schema, self.metadata, self._codec, file_id)
            try:
                new_tmp, crc, size = fw.finish()
            except BaseException:
                fw.abort()
                raise
            tmp.unlink()
            self._pending[n] = new_tmp
            entry.update(header_crc32=crc, size=size)
        if self._file is not None:
            self._file = self._file.promote(schema)

    def _publish_shard(self) -> None:
        fw = self._file
        assert fw is not None
        self._file = None
        try:
            tmp, crc, size = fw.finish()
        except BaseException:
            fw.abort()
            raise
        # The shard keeps its temp name until close(): a killed writer leaves only clearly named temp files.
        self._pending.append(tmp)
        self._shards.append({"file": fw.final.name, "rows": fw.rows, "header_crc32": crc, "size": size})

    def close(self) -> Path:
        """Publish atomically and return the destination path."""
        if self._done:
            raise RuntimeError("close() on a closed or aborted Writer")
        try:
            if self.schema is None:
                raise ValueError("no samples were written and no schema was given: nothing defines the schema")
            if self.sharded:
                self._close_sharded()
            else:
                fw = self._file or self._open_file()
                self._file = None
                try:
                    tmp, _, _ = fw.finish()
                    # Again just before the rename: the destination may have become a FIFO, a link, a dataset.
                    check_destination(self.dst, overwrite=self.overwrite)
                    os.replace(tmp, self.dst)
                except BaseException:
                    fw.abort()
                    raise
                fsync_dir(self.dst.parent)
        except BaseException:
            self.abort()
            raise
        self._done = True
        return self.dst

    def _close_sharded(self) -> None:
        if self._file is not None and self._file.rows:
            self._publish_shard()
        elif self._file is not None:
            self._file.abort()
            self._file = None
        check_destination(self.dst, directory=True, overwrite=self.overwrite or self._created_dir)
        for tmp, s in zip(self._pending, self._shards, strict=True):
            os.replace(tmp, self.dst / s["file"])
        self._pending = []
        fsync_dir(self.dst)
        kept = publish_manifest(self.dst, self.schema, self.metadata, self._shards)
        self.kept = [self.dst / name for name in kept]

    def abort(self) -> None:
        """Remove everything this writer created; a previously published destination stays as it was."""
        if self._done:
            return
        self._done = True
        if self._file is not None:
            self._file.abort()
            self._file = None
        for tmp in self._pending:
            tmp.unlink(missing_ok=True)
        if self._pending is not None and not self._pending:
            # close() failed after renaming the shards: they are not referenced by any manifest.
            for s in self._shards:
                (self.dst / s["file"]).unlink(missing_ok=True)
        if self._created_dir:
            try:
                self.dst.rmdir()
            except OSError:
                pass


def write(
    samples: Iterable[Any],
    dst: str | os.PathLike[str],
    *,
    schema: Schema | Any | None = None,
    variable: Iterable[str] = (),
    metadata: dict[str, Any] | None = None,
    compression: str | None = None,
    compression_level: int | None = None,
    shard_rows: int | None = None,
    shard_bytes: int | None = None,
    overwrite: bool = False,
    file_id: str | None = None,
) -> Path:
    """Write every sample to ``dst`` (a ``.tbl`` file, or a directory when ``shard_rows``/``shard_bytes`` is set).

    ``schema``: a ``Schema`` (or its tree of ``Leaf``), kept as given; when
    omitted it is inferred and widened as samples differ (see ``Writer``), with
    the leaves named in ``variable`` variable-size from the start.
    ``compression="lz4"`` or ``"zstd"`` compresses variable-size leaves
    (``compression_level``: zstd's level, default 3). numpy arrays and
    torch tensors are stored as arrays (tensors through ``.numpy()``; torch is
    never imported). Published atomically; returns ``dst``. An existing file
    or dataset at ``dst`` is replaced only with ``overwrite=True``; see
    ``Writer`` for what replacing removes and for ``file_id``.
    """
    with Writer(dst, schema, variable=variable, metadata=metadata, compression=compression,
                compression_level=compression_level, shard_rows=shard_rows, shard_bytes=shard_bytes,
                overwrite=overwrite, file_id=file_id) as w:
        w.write_all(samples)
    return w.dst
