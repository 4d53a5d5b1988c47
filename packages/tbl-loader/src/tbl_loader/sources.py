"""Where `tbl convert` finds images and their labels: a TAR, a folder tree, or a list.

Every source becomes a `Listing`: samples in a fixed order, each with a name
(for reports), an integer label and a locator (a file path, or the offset and
size of a member in a plain TAR read with `TarReader`), plus the class names
(label i is ``classes[i]``).

Sources and their rules
-----------------------
Folder tree (torchvision ImageFolder layout)
    ``root/<class>/**/<image>``: every first-level subfolder of ``root`` is a
    class; classes are the sorted folder names (Python ``str`` order) and a
    label is the index of its class, exactly as ImageFolder assigns them
    (empty class folders keep their index). Images are found recursively
    (symlinks followed). Files directly in ``root`` are ignored, and so are
    hidden folders such as ``.ipynb_checkpoints`` (ImageFolder would count
    them as classes).
TAR (ImageNet layout)
    Plain or compressed (gzip, bzip2, xz; detected from the first bytes, not
    the file name). Each image member's class is the name of the folder that
    directly contains it: ``n01440764/x.JPEG`` and ``train/n01440764/x.JPEG``
    both give class ``n01440764``. Classes are sorted, labels are indices. An
    image at the TAR root needs a label file. A name stored twice (an appended
    TAR) means its last copy, as ``tar x`` would extract it. A compressed TAR is first
    decompressed once into a temporary plain TAR (JPEGs do not compress, so it
    is about the size of the source) because the sorted order needs random
    access; it is deleted when the conversion ends (only a process killed
    outright can leave it behind, as ``.tbl-convert-*.tar`` in the scratch
    directory: for `tbl convert`, the destination's directory).
Label file (``label_file=``, for a flat TAR or folder, or to override folders)
    Text, one ``name<SEP>label`` row per image, ``SEP`` a tab if the first data
    row contains one, else a comma (CSV quoting rules). ``name`` is the image's
    path relative to the TAR / folder root, ``/``-separated (``img1.jpg``,
    ``val/img1.jpg``). Blank rows and rows starting with ``#`` are skipped; an
    optional first row ``filename,label`` (or ``path,label``) is a header. If
    every label is a non-negative integer, labels are used as given and the
    class names are ``"0" .. str(max)``; otherwise every label is a class name,
    class names are sorted and labels are their indices. Every listed name
    must exist in the source; images present but not listed are ignored.
List of ``(path, label)`` pairs (Python API only)
    Labels follow the label-file rule (all non-negative integers or digit
    strings: used as given; otherwise all class-name strings: sorted, label =
    index). Kept in the given order.

Order: TAR and folder samples are sorted by their relative name (Python
``str`` order), so the order never depends on the TAR's member order or the
file system's listing order. A list keeps the order it was given in.

Only files with an image extension are taken (case-insensitive:
``IMG_EXTENSIONS``, the torchvision list); hidden files and folders (name
starting with ``.``, e.g. macOS ``._x.jpg``) and non-regular TAR members are
ignored. Ignored files are counted in `Listing.ignored`, never silently
converted or dropped from the count.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import lzma
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

__all__ = [
    "IMG_EXTENSIONS",
    "Listing",
    "SourceError",
    "TarReader",
    "open_source",
    "parse_label_file",
    "read_file",
]

IMG_EXTENSIONS: Final = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

# First bytes of each compression a TAR may come in, and how to stream-decompress it.
_COMPRESSIONS: Final = (
    (b"\x1f\x8b", "gzip", gzip.open),
    (b"BZh", "bzip2", bz2.open),
    (b"\xfd7zXZ\x00", "xz", lzma.open),
)


class SourceError(ValueError):
    """The conversion source is unusable: missing, unknown layout, bad label file, no images."""


# A locator is either a file path (folder / list sources) or (offset, size) of
# a member's data inside the plain TAR named by `Listing.tar_path`.
Locator = str | tuple[int, int]


@dataclass
class Listing:
    """A source's samples in conversion order."""

    kind: str  # "tar", "folder" or "list"
    names: list[str]
    labels: list[int]
    locators: list[Locator]
    classes: list[str]
    tar_path: str | None = None  # plain TAR the (offset, size) locators point into
    compression: str | None = None  # compression of the original TAR, if any
    ignored: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.names)


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _is_hidden(rel: str) -> bool:
    return any(part.startswith(".") for part in rel.split("/"))


def parse_label_file(path: str | os.PathLike[str]) -> tuple[dict[str, int], list[str]]:
    """Read a label file (see module docstring) into ``{name: label}`` and class names."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as e:
        raise SourceError(f"cannot read label file {str(path)!r}: {e}") from e
    rows = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip() and not line.startswith("#")]
    if not rows:
        raise SourceError(f"label file {str(path)!r} has no rows")
    delimiter = "\t" if "\t" in rows[0][1] else ","
    entries: list[tuple[str, str, int]] = []
    for (lineno, _), fields in zip(rows, csv.reader([line for _, line in rows], delimiter=delimiter), strict=True):
        if len(fields) != 2:
            raise SourceError(
                f"label file {str(path)!r} line {lineno}: expected 2 fields (name{delimiter!r}label), got {len(fields)}"
            )
        entries.append((fields[0].strip(), fields[1].strip(), lineno))
    first_name, first_label, _ = entries[0]
    if first_name.lower() in ("filename", "path") and first_label.lower() == "label":
        entries = entries[1:]
    if not entries:
        raise SourceError(f"label file {str(path)!r} has a header but no rows")
    seen: dict[str, int] = {}
    for name, _, lineno in entries:
        if not name:
            raise SourceError(f"label file {str(path)!r} line {lineno}: empty name")
        if name in seen:
            raise SourceError(f"label file {str(path)!r} line {lineno}: {name!r} already listed on line {seen[name]}")
        seen[name] = lineno
    raw = {name: label for name, label, _ in entries}
    labels, classes = _labels_from_values(list(raw.values()), what=f"label file {str(path)!r}")
    return dict(zip(raw, labels, strict=True)), classes


def _labels_from_values(values: Sequence[object], *, what: str) -> tuple[list[int], list[str]]:
    """All non-negative integers (ints or digit strings): used as given, class names "0".."max".
    Otherwise all must be strings: class names, sorted, label = index."""
    ints: list[int] = []
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            ints.append(v)
        elif isinstance(v, str) and v.isascii() and v.isdigit():
            ints.append(int(v))
        else:
            break
    else:
        if any(i < 0 for i in ints):
            raise SourceError(f"{what}: negative label {min(ints)}")
        return ints, [str(i) for i in range(max(ints, default=-1) + 1)]
    names: list[str] = []
    for v in values:
        if not isinstance(v, str):
            raise SourceError(f"{what}: labels must be all integers or all class-name strings, got {v!r}")
        names.append(v)
    classes = sorted(set(names))
    index = {c: i for i, c in enumerate(classes)}
    return [index[v] for v in names], classes


def _apply_label_file(
    names: list[str], locators: list[Locator], label_file: str | os.PathLike[str], ignored: list[str]
) -> tuple[list[str], list[int], list[Locator], list[str]]:
    table, classes = parse_label_file(label_file)
    present = dict(zip(names, locators, strict=True))
    missing = [n for n in table if n not in present]
    if missing:
        shown = ", ".join(repr(n) for n in missing[:5])
        raise SourceError(
            f"label file {str(label_file)!r} lists {len(missing)} image(s) not in the source "
            f"(names are paths relative to the source root): {shown}"
        )
    ignored.extend(n for n in names if n not in table)
    kept = sorted(table)
    return kept, [table[n] for n in kept], [present[n] for n in kept], classes


def _sniff_compression(path: Path) -> tuple[str | None, Callable[..., IO[bytes]] | None]:
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, name, opener in _COMPRESSIONS:
        if head.startswith(magic):
            return name, opener
    return None, None


def _scan_tar(tar_path: Path) -> tuple[list[str], list[Locator], list[str]]:
    """Regular image members of a plain TAR: names, (offset, size), ignored names. Later duplicates win."""
    members: dict[str, tuple[int, int]] = {}
    ignored: list[str] = []
    try:
        with tarfile.open(tar_path, "r:") as tf:
            while (m := tf.next()) is not None:
                # TarFile keeps every TarInfo it reads (~1 KB each): drop them, only offsets are needed.
                tf.members.clear()
                name = m.name
                while name.startswith("./"):
                    name = name[2:]
                if m.isdir():
                    continue
                if not m.isreg() or m.sparse is not None or _is_hidden(name) or not _is_image_name(name):
                    ignored.append(name)
                    continue
                members[name] = (m.offset_data, m.size)
    except tarfile.TarError as e:
        raise SourceError(f"{str(tar_path)!r} is not a readable TAR: {e}") from e
    names = sorted(members)
    return names, [members[n] for n in names], ignored


def _tar_listing(tar_path: Path, label_file: str | os.PathLike[str] | None) -> Listing:
    names, locators, ignored = _scan_tar(tar_path)
    if label_file is not None:
        names, labels, locators, classes = _apply_label_file(names, locators, label_file, ignored)
    else:
        rooted = [n for n in names if "/" not in n]
        if rooted:
            raise SourceError(
                f"TAR {str(tar_path)!r}: image {rooted[0]!r} is at the TAR root; an ImageNet-layout TAR "
                f"needs one folder per class (class_name/x.JPEG), or give a label file"
            )
        parents = [n.rsplit("/", 2)[-2] for n in names]
        classes = sorted(set(parents))
        index = {c: i for i, c in enumerate(classes)}
        labels = [index[p] for p in parents]
    return Listing("tar", names, labels, locators, classes, tar_path=str(tar_path), ignored=ignored)


def _walk_images(root: Path, ignored: list[str]) -> list[str]:
    """Relative '/'-names of image files under root (recursive, symlinks followed), unsorted."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        rel_dir = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if rel_dir == "." else rel_dir + "/"
        kept_dirs = [d for d in dirnames if not d.startswith(".")]
        ignored.extend(prefix + d + "/" for d in dirnames if d.startswith("."))
        dirnames[:] = kept_dirs
        for fn in filenames:
            rel = prefix + fn
            if fn.startswith(".") or not _is_image_name(fn):
                ignored.append(rel)
            else:
                found.append(rel)
    return found


def _folder_listing(root: Path, label_file: str | os.PathLike[str] | None) -> Listing:
    ignored: list[str] = []
    if label_file is not None:
        names = sorted(_walk_images(root, ignored))
        locators: list[Locator] = [str(root / n) for n in names]
        names, labels, locators, classes = _apply_label_file(names, locators, label_file, ignored)
        return Listing("folder", names, labels, locators, classes, ignored=ignored)
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise SourceError(
            f"folder {str(root)!r} has no class subfolders (expected root/<class>/<image>); "
            f"for a flat folder give a label file"
        )
    for e in os.scandir(root):
        if not e.is_dir():
            ignored.append(e.name)
        elif e.name.startswith("."):
            ignored.append(e.name + "/")
    names, labels = [], []
    for label, cls in enumerate(classes):
        sub: list[str] = []
        for rel in _walk_images(root / cls, ignored):
            sub.append(f"{cls}/{rel}")
        names.extend(sub)
        labels.extend([label] * len(sub))
    order = sorted(range(len(names)), key=names.__getitem__)
    names = [names[i] for i in order]
    labels = [labels[i] for i in order]
    return Listing("folder", names, labels, [str(root / n) for n in names], classes, ignored=ignored)


def _list_listing(pairs: Sequence[object]) -> Listing:
    names: list[str] = []
    values: list[object] = []
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise SourceError(f"source list item {i} must be a (path, label) pair, got {pair!r}")
        p, label = pair
        if not isinstance(p, (str, os.PathLike)):
            raise SourceError(f"source list item {i}: path must be str or PathLike, got {type(p).__name__}")
        names.append(os.fspath(p))
        values.append(label)
    labels, classes = _labels_from_values(values, what="source list")
    # Absolute locators: worker processes need not share the caller's working directory.
    return Listing("list", names, labels, [os.path.abspath(n) for n in names], classes)


def _decompress_to(path: Path, compression: str, opener: Callable[..., IO[bytes]], out_path: str) -> None:
    try:
        with open(out_path, "wb") as out, opener(path, "rb") as comp:
            shutil.copyfileobj(comp, out, 1 << 20)
    except (OSError, EOFError, lzma.LZMAError) as e:
        raise SourceError(f"cannot decompress {compression} source {str(path)!r}: {e}") from e


@contextmanager
def open_source(
    src: str | os.PathLike[str] | Sequence[object],
    *,
    label_file: str | os.PathLike[str] | None = None,
    scratch_dir: str | os.PathLike[str] | None = None,
) -> Iterator[Listing]:
    """List a source (see module docstring). A compressed TAR is decompressed into
    ``scratch_dir`` (default: the system temp dir) for the duration of the block."""
    scratch: str | None = None
    try:
        if not isinstance(src, (str, os.PathLike)):
            if label_file is not None:
                raise SourceError("label_file applies to a TAR or folder source, not to a list of (path, label)")
            listing = _list_listing(list(src))
            where = "source list"
        else:
            where = f"source {os.fspath(src)!r}"
            path = Path(os.path.abspath(src))  # worker processes need not share our working directory
            if not path.exists():
                raise SourceError(f"{where} does not exist")
            if path.is_dir():
                listing = _folder_listing(path, label_file)
            else:
                compression, opener = _sniff_compression(path)
                if compression is None:
                    listing = _tar_listing(path, label_file)
                else:
                    fd, scratch = tempfile.mkstemp(prefix=".tbl-convert-", suffix=".tar", dir=scratch_dir)
                    os.close(fd)
                    scratch = os.path.abspath(scratch)
                    _decompress_to(path, compression, opener, scratch)
                    listing = _tar_listing(Path(scratch), label_file)
                    listing.compression = compression
        if not listing.names:
            raise SourceError(f"{where} contains no images ({len(listing.ignored)} files ignored)")
        yield listing
    finally:
        if scratch is not None:
            os.unlink(scratch)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class TarReader:
    """Reads members of a plain TAR by (offset, size) with positioned reads (no shared file offset)."""

    def __init__(self, tar_path: str) -> None:
        self._fd = os.open(tar_path, os.O_RDONLY)

    def read(self, offset: int, size: int) -> bytes:
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise OSError(f"TAR member at offset {offset} is truncated: read {len(data)} of {size} bytes")
        return data

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
