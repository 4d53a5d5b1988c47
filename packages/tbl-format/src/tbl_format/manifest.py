"""The manifest of a sharded dataset directory: publishing, reading, merging.

``manifest.json`` lists every shard file with its row count, size and header
CRC-32, plus the schema and metadata. It is written last, by atomic rename:
a directory without a manifest is not a dataset, and shards not listed in it
are not part of one.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from .destination import remove_owned_shards
from .errors import (
    DestinationError,
    DuplicateShardError,
    FormatError,
    InvalidSchemaError,
    ManifestError,
    NotADatasetError,
    SchemaMismatchError,
    UnsupportedVersionError,
)
from .fsutil import fsync_dir, read_regular
from .layout import MANIFEST_NAME
from .opener import open_file
from .schema import Schema

MANIFEST_VERSION = (1, 0)
MANIFEST_CAP = 256 * 1024 * 1024

__all__ = ["MANIFEST_NAME", "check_unique", "merge_manifests", "publish_manifest", "read_manifest"]


def _check_name(name: Any, where: str) -> str:
    """A shard file name: a relative POSIX path inside the dataset directory, in its one canonical spelling."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        raise ManifestError(f"{where}: shard file name {name!r} is not a relative path")
    # The raw components, not PurePosixPath's: it drops "." and empty parts, so "." or "a//b" would pass.
    if any(part in ("..", ".", "") for part in name.split("/")) or name == MANIFEST_NAME:
        raise ManifestError(f"{where}: shard file name {name!r} is not a file path inside the dataset directory")
    return name


def check_unique(shards: list[dict[str, Any]], where: str) -> None:
    """DuplicateShardError if two shards holding rows share a file name or a header CRC-32.

    Equal header checksums mean equal headers, and a header covers the checksums
    of all its data: the same rows twice. Writers give every shard of a dataset
    a distinct ``file_id`` so that shards of equal rows still differ. Shards of
    zero rows add no rows and may repeat.
    """
    names: dict[str, int] = {}
    crcs: dict[int, int] = {}
    for n, s in enumerate(shards):
        if not s["rows"]:
            continue
        first = names.setdefault(s["file"], n)
        if first != n:
            raise DuplicateShardError(f"{where}: shards {first} and {n} are the same file {s['file']!r}")
        first = crcs.setdefault(s["header_crc32"], n)
        if first != n:
            raise DuplicateShardError(
                f"{where}: shards {first} ({shards[first]['file']!r}) and {n} ({s['file']!r}) have the same header "
                f"CRC-32 {s['header_crc32']}: the same rows twice"
            )


def publish_manifest(directory: Path, schema: Schema, metadata: dict[str, Any], shards: list[dict[str, Any]]) -> list[str]:
    """Atomically replace directory/manifest.json; then unlink the shards only the previous manifest listed,
    where they are provably the dataset's own (``destination.remove_owned_shards``). Returns the names of the
    previous shards left in place."""
    check_unique(shards, str(directory / MANIFEST_NAME))
    previous: list[str] = []
    try:
        previous = [s["file"] for s in read_manifest(directory)["shards"]]
    except (OSError, FormatError):
        pass  # no readable previous manifest: nothing is known to be the old dataset's, nothing is removed
    body = {
        "tbl_manifest": list(MANIFEST_VERSION),
        "rows": sum(s["rows"] for s in shards),
        "schema": schema.to_json(),
        "metadata": metadata,
        "shards": shards,
    }
    data = json.dumps(body, indent=1, ensure_ascii=False, allow_nan=False).encode("utf-8")
    tmp = directory / f".{MANIFEST_NAME}.tbl-tmp-{secrets.token_hex(4)}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / MANIFEST_NAME)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(directory)
    keep = {s["file"] for s in shards}
    return remove_owned_shards(directory, [name for name in dict.fromkeys(previous) if name not in keep])


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and validate directory/manifest.json.

    Returns {"rows", "schema" (Schema), "metadata", "shards": [{"file", "rows", "header_crc32", "size"}],
    "stat": the manifest's os.stat_result}. A manifest that is not a regular file raises NotRegularFileError
    (never opened), one listing a shard with rows twice DuplicateShardError.
    """
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    where = str(path)
    try:
        raw, st = read_regular(path, "manifest", MANIFEST_CAP)
    except FileNotFoundError:
        raise NotADatasetError(f"{directory}: no {MANIFEST_NAME}; a directory without a manifest is not a dataset") from None
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ManifestError(f"{where}: not UTF-8 JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ManifestError(f"{where}: not a JSON object")
    version = body.get("tbl_manifest")
    if not (isinstance(version, list) and len(version) == 2 and all(type(v) is int for v in version)):
        raise ManifestError(f"{where}: missing or invalid 'tbl_manifest' version")
    if version[0] != MANIFEST_VERSION[0]:
        raise UnsupportedVersionError(f"{where}: manifest version {version}; this reader knows major {MANIFEST_VERSION[0]}")
    try:
        schema = Schema.from_json(body.get("schema"))
    except InvalidSchemaError as exc:
        raise InvalidSchemaError(f"{where}: {exc}") from None
    metadata = body.get("metadata")
    shards = body.get("shards")
    if not isinstance(metadata, dict) or not isinstance(shards, list):
        raise ManifestError(f"{where}: 'metadata' must be an object and 'shards' a list")
    out = []
    total = 0
    for n, s in enumerate(shards):
        sw = f"{where}: shard {n}"
        if not isinstance(s, dict):
            raise ManifestError(f"{sw}: not an object")
        rows, crc, size = s.get("rows"), s.get("header_crc32"), s.get("size")
        for key, v in (("rows", rows), ("header_crc32", crc), ("size", size)):
            if type(v) is not int or v < 0:
                raise ManifestError(f"{sw}: {key!r} must be a non-negative int, got {v!r}")
        out.append({"file": _check_name(s.get("file"), sw), "rows": rows, "header_crc32": crc, "size": size})
        total += rows
    if body.get("rows") != total:
        raise ManifestError(f"{where}: 'rows' is {body.get('rows')!r}, the shards hold {total}")
    check_unique(out, where)
    return {"rows": total, "schema": schema, "metadata": metadata, "shards": out, "stat": st}


def _part_shards(part: Path) -> tuple[Schema, dict[str, Any], list[tuple[Path, dict[str, Any]]]]:
    if part.is_dir():
        m = read_manifest(part)
        return m["schema"], m["metadata"], [(part / s["file"], s) for s in m["shards"]]
    f = open_file(part)
    try:
        entry = {"file": part.name, "rows": f.rows, "header_crc32": f.header_crc32, "size": part.stat().st_size}
        return f.schema, f.metadata, [(part, entry)]
    finally:
        f.close()


def merge_manifests(parts: list[str | os.PathLike[str]], dst: str | os.PathLike[str]) -> Path:
    """Join datasets written separately (dataset directories or single .tbl files) into directory dst.

    Shard files are hard-linked into dst (moved when a hard link is impossible);
    shards already inside dst are referenced where they are. No shard is
    rewritten. Every part must have the same schema and metadata
    (SchemaMismatchError names the first part that differs). A shard holding
    rows that would be listed twice (a part given twice, or a copy of one:
    the same name or the same header CRC-32) is refused with
    DuplicateShardError before anything is linked. dst must not already hold
    a manifest. Returns dst.
    """
    dst = Path(dst)
    if not parts:
        raise ValueError("merge_manifests needs at least one part")
    if os.path.lexists(dst / MANIFEST_NAME):
        raise FileExistsError(f"{dst} already holds a {MANIFEST_NAME}")
    loaded = [(Path(p), *_part_shards(Path(p))) for p in parts]
    schema, metadata = loaded[0][1], loaded[0][2]
    for p, s, md, _ in loaded[1:]:
        if s != schema:
            raise SchemaMismatchError(f"part {p}: schema {s} differs from {loaded[0][0]}'s {schema}")
        if md != metadata:
            raise SchemaMismatchError(f"part {p}: metadata differs from {loaded[0][0]}'s")
    if dst.is_symlink() or (dst.exists() and not dst.is_dir()):
        raise DestinationError(f"{dst} exists and is not a directory")
    root = dst.resolve()
    plan = []  # (source, name in dst or None if referenced where it is, entry)
    for n, (_, _, _, shards) in enumerate(loaded):
        for src, entry in shards:
            resolved = src.resolve()
            if resolved.is_relative_to(root):
                plan.append((src, None, {**entry, "file": resolved.relative_to(root).as_posix()}))
            else:
                plan.append((src, f"part{n:05d}-{src.name}", {**entry, "file": f"part{n:05d}-{src.name}"}))
    # Before anything is linked: a part given twice (or a copy of one) is refused, by name and by header CRC-32.
    check_unique([entry for _, _, entry in plan], f"merge into {dst}")
    dst.mkdir(parents=True, exist_ok=True)
    entries = []
    for src, name, entry in plan:
        if name is not None:
            target = dst / name
            try:
                os.link(src, target)
            except OSError:
                os.replace(src, target)
        entries.append(entry)
    fsync_dir(dst)
    publish_manifest(dst, schema, metadata, entries)
    return dst
