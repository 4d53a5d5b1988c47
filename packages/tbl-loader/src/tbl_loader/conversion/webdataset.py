"""WebDataset shards as a conversion source: one sample per key, the image member by extension.

Shards are given as a list of paths or one pattern with braces
(``shards/{000000..000099}.tar``: a numeric range keeps its zero padding;
``{a,b}`` lists alternatives), a folder of ``.tar`` files (sorted), or one
``.tar`` named with ``source_format="webdataset"`` (``--from webdataset``).
Each shard is a TAR (plain or gzip / bzip2 / xz), read in order once.

A member ``dir/000123.seg.png`` belongs to the sample with key ``dir/000123``
(the path up to the first dot of the file name) under extension ``seg.png``,
as WebDataset groups them; a sample's members are consecutive in its shard.
The sample's image is the member whose extension ends in an image extension
(``jpg``, ``png``, ...; ``image_key`` names it when there are several); its
label is the member ``label_key`` (default ``cls``). Every other member is a
field named by its extension, read by its last part: ``txt`` / ``text``
str, ``json`` parsed (objects become nested fields), ``cls`` / ``cls2`` /
``index`` / ``id`` int, ``npy`` an array (no pickles), anything else bytes.
Extensions starting with ``__`` (``__key__``) are WebDataset's own and are
not stored. Samples keep shard order and member order; the key is the
sample's name.

Hostile shards: a shard that is missing, truncated or not a TAR is refused
(`SourceError` naming it, whatever ``on_error``); a key without an image, a
key seen again (in another shard, or later in the same one) or a member
given twice is a sample the source cannot give (``on_error``: named error or
reported skip; of a key seen twice the first sample is kept).
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from ..errors import SourceError
from .records import RecordSink

__all__ = ["IMAGE_EXTENSIONS", "expand_shards", "read_webdataset"]

IMAGE_EXTENSIONS: Final = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "tif", "tiff", "pgm")
DEFAULT_LABEL_KEY: Final = "cls"
_BRACES = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"(\d+)\.\.(\d+)")


def expand_shards(src: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    """The shard paths of ``src``: a list as given, a brace pattern expanded, a folder's ``.tar`` files sorted."""
    if not isinstance(src, (str, os.PathLike)):
        return [os.fspath(p) for p in src]
    text = os.fspath(src)
    if _BRACES.search(text):
        return _expand(text)
    if os.path.isdir(text):
        found = sorted(e.name for e in os.scandir(text) if e.name.endswith(".tar") and not e.name.startswith("."))
        if not found:
            raise SourceError(f"folder {text!r} holds no .tar shard")
        return [os.path.join(text, n) for n in found]
    return [text]


def _expand(pattern: str) -> list[str]:
    m = _BRACES.search(pattern)
    if m is None:
        return [pattern]
    head, body, tail = pattern[: m.start()], m.group(1), pattern[m.end():]
    rng = _RANGE.fullmatch(body)
    if rng is not None:
        lo, hi = rng.group(1), rng.group(2)
        if int(hi) < int(lo):
            raise SourceError(f"shard pattern {pattern!r}: range {body} runs backwards")
        width = len(lo) if lo.startswith("0") else 0
        choices = [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    else:
        choices = body.split(",")
    return [path for choice in choices for path in _expand(head + choice + tail)]


def _split(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member name, as WebDataset splits it; None for a name without an extension."""
    folder, _, base = name.rpartition("/")
    if "." not in base.lstrip(".") or base.startswith("."):
        return None
    stem, ext = base.split(".", 1)
    return (f"{folder}/{stem}" if folder else stem), ext


def _decode(ext: str, data: bytes) -> Any:
    last = ext.rsplit(".", 1)[-1].lower()
    if last in ("txt", "text"):
        return data.decode("utf-8")
    if last == "json":
        return json.loads(data)
    if last in ("cls", "cls2", "index", "id"):
        return int(data.decode("ascii").strip())
    if last == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    return data


def _samples(shard: str) -> Iterator[tuple[str, dict[str, bytes] | str]]:
    """(key, {extension: bytes}) per sample of the shard in order, or (key, why) for a member given twice."""
    try:
        with tarfile.open(shard, mode="r|*") as tf:
            key: str | None = None
            members: dict[str, bytes] = {}
            why: str | None = None  # why the current sample cannot be given
            for m in tf:
                split = _split(m.name[2:] if m.name.startswith("./") else m.name)
                if not m.isreg() or split is None:
                    continue
                k, ext = split
                if k != key:
                    if key is not None:
                        yield key, why or members
                    key, members, why = k, {}, None
                f = tf.extractfile(m)
                assert f is not None  # a regular member
                if ext in members:
                    why = f"member {m.name!r} is given twice"
                members[ext] = f.read()
            if key is not None:
                yield key, why or members
    except FileNotFoundError:
        raise SourceError(f"shard {shard!r} does not exist") from None
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise SourceError(f"shard {shard!r} is truncated or not a TAR ({type(e).__name__}: {e}); "
                          "nothing was written") from e


def read_webdataset(shards: Sequence[str], sink: RecordSink, *, image_key: str | None,
                    label_key: str | None) -> None:
    """Give every sample of the shards, in order, to ``sink`` (see the module docstring).

    Args:
        shards: shard paths, in order (`expand_shards`).
        sink: receives the samples.
        image_key: the image member's extension; None: the one member with an image extension.
        label_key: the label member's extension; None: ``cls``.
    """
    label_ext = label_key or DEFAULT_LABEL_KEY
    for shard in shards:
        if not Path(shard).is_file():
            raise SourceError(f"shard {shard!r} does not exist or is not a file")
        for key, members in _samples(shard):
            if isinstance(members, str):
                sink.reject(key, f"in shard {shard!r}: {members}")
                continue
            if image_key is not None:
                image_ext = image_key if image_key in members else None
            else:
                found = [e for e in members if e.rsplit(".", 1)[-1].lower() in IMAGE_EXTENSIONS]
                if len(found) > 1:
                    raise SourceError(f"shard {shard!r}: sample {key!r} has several images {found}; name the "
                                      "one to convert with --image-key (image_key=)")
                image_ext = found[0] if found else None
            if image_ext is None:
                wanted = repr(image_key) if image_key else "with an image extension"
                sink.reject(key, f"in shard {shard!r}: no image member {wanted} (members: {sorted(members)})")
                continue
            try:
                label = _decode(label_ext, members[label_ext]) if label_ext in members else None
                fields = {ext: _decode(ext, data) for ext, data in members.items()
                          if ext not in (image_ext, label_ext) and not ext.startswith("__")}
            except ValueError as e:  # bad JSON, a .cls that is not an integer, a bad .npy, bad UTF-8
                sink.reject(key, f"in shard {shard!r}: a member does not read as its extension says: {e}")
                continue
            sink.add(key, members[image_ext], label, fields, origin=f"shard {shard!r}")
