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
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import InvalidSchemaError, ManifestError, SchemaMismatchError, UnsupportedVersionError
from .fsutil import fsync_dir
from .opener import open_file
from .schema import Schema

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = (1, 0)
MANIFEST_CAP = 256 * 1024 * 1024

__all__ = ["MANIFEST_NAME", "merge_manifests", "publish_manifest", "read_manifest"]


def _check_name(name: Any, where: str) -> str:
    """A shard file name: a relative POSIX path inside the dataset directory."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        raise ManifestError(f"{where}: shard file name {name!r} is not a relative path")
    p = PurePosixPath(name)
    if p.is_absolute() or any(part in ("..", ".", "") for part in p.parts) or name == MANIFEST_NAME:
        raise ManifestError(f"{where}: shard file name {name!r} leaves the dataset directory")
    return name


def publish_manifest(directory: Path, schema: Schema, metadata: dict[str, Any], shards: list[dict[str, Any]]) -> None:
    """Atomically replace directory/manifest.json; then unlink the shards only the previous manifest listed."""
    previous: list[str] = []
    try:
        previous = [s["file"] for s in read_manifest(directory)["shards"]]
    except (FileNotFoundError, ManifestError, UnsupportedVersionError, InvalidSchemaError):
        pass
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
    for name in previous:
        if name not in keep:
            (directory / name).unlink(missing_ok=True)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Parse and validate directory/manifest.json.

    Returns {"rows", "schema" (Schema), "metadata", "shards": [{"file", "rows", "header_crc32", "size"}]}.
    """
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    where = str(path)
    if not path.is_file():
        raise ManifestError(f"{directory}: no {MANIFEST_NAME}; a directory without a manifest is not a dataset")
    if path.stat().st_size > MANIFEST_CAP:
        raise ManifestError(f"{where}: larger than the {MANIFEST_CAP}-byte cap")
    try:
        body = json.loads(path.read_bytes().decode("utf-8"))
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
    return {"rows": total, "schema": schema, "metadata": metadata, "shards": out}


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
    (SchemaMismatchError names the first part that differs). dst must not
    already hold a manifest. Returns dst.
    """
    dst = Path(dst)
    if not parts:
        raise ValueError("merge_manifests needs at least one part")
    if (dst / MANIFEST_NAME).exists():
        raise FileExistsError(f"{dst} already holds a {MANIFEST_NAME}")
    loaded = [(Path(p), *_part_shards(Path(p))) for p in parts]
    schema, metadata = loaded[0][1], loaded[0][2]
    for p, s, md, _ in loaded[1:]:
        if s != schema:
            raise SchemaMismatchError(f"part {p}: schema {s} differs from {loaded[0][0]}'s {schema}")
        if md != metadata:
            raise SchemaMismatchError(f"part {p}: metadata differs from {loaded[0][0]}'s")
    dst.mkdir(parents=True, exist_ok=True)
    root = dst.resolve()
    entries = []
    for n, (_, _, _, shards) in enumerate(loaded):
        for src, entry in shards:
            resolved = src.resolve()
            if resolved.is_relative_to(root):
                name = resolved.relative_to(root).as_posix()
            else:
                name = f"part{n:05d}-{src.name}"
                target = dst / name
                try:
                    os.link(src, target)
                except OSError:
                    os.replace(src, target)
            entries.append({**entry, "file": name})
    fsync_dir(dst)
    publish_manifest(dst, schema, metadata, entries)
    return dst
